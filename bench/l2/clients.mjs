// Client choice for the L2 tier (issue 15): node-redis (`redis`) vs `ioredis` on the same bytes.
// Pipelined SET then GET of `count` binary values of 512 KiB and 2 MiB against one redis-server,
// rounds interleaved between the clients so both see the same machine load. Reports GB/s per client
// and the ratio node-redis / ioredis. ioredis is not a dependency: point IOREDIS_DIR at an install.
//   IOREDIS_DIR=/tmp/l2bench/node_modules/ioredis node bench/l2/clients.mjs 6390
import { createClient, RESP_TYPES } from "redis"
import { randomBytes } from "node:crypto"

const port = Number(process.argv[2] ?? 6379)
const { default: IORedis } = await import(process.env.IOREDIS_DIR ?? "ioredis")
const nodeRedis = createClient({ socket: { port, host: "127.0.0.1" }, disableOfflineQueue: true })
  .withTypeMapping({ [RESP_TYPES.BLOB_STRING]: Buffer })
await nodeRedis.connect()
const io = new IORedis({ port, host: "127.0.0.1", enableOfflineQueue: false, lazyConnect: true })
await io.connect()

const clients = {
  "node-redis": {
    set: (ks, v) => Promise.all(ks.map((k) => nodeRedis.set(k, v))),
    get: (ks) => Promise.all(ks.map((k) => nodeRedis.get(k)))
  },
  ioredis: {
    set: (ks, v) => { const p = io.pipeline(); for (const k of ks) p.set(k, v); return p.exec() },
    get: (ks) => { const p = io.pipeline(); for (const k of ks) p.getBuffer(k); return p.exec().then((r) => r.map(([, b]) => b)) }
  }
}
const rounds = 5
for (const size of [512 * 1024, 2 * 1024 * 1024]) {
  const count = Math.max(8, (32 * 1024 * 1024) / size)
  const value = randomBytes(size)
  const t = { "node-redis": { set: 0, get: 0 }, ioredis: { set: 0, get: 0 } }
  for (let r = 0; r < rounds + 1; r++) {
    for (const [name, c] of Object.entries(clients)) {
      const keys = Array.from({ length: count }, (_, i) => `bench:${name}:${size}:${r}:${i}`)
      let s = performance.now()
      await c.set(keys, value)
      const setMs = performance.now() - s
      s = performance.now()
      const got = await c.get(keys)
      const getMs = performance.now() - s
      if (!got.every((b) => Buffer.isBuffer(b) && b.equals(value))) throw new Error(`${name}: GET returned other bytes`)
      if (r > 0) { t[name].set += setMs; t[name].get += getMs } // round 0 warms up
      await nodeRedis.del(keys)
    }
  }
  const gbs = (ms) => ((count * size * rounds) / (ms / 1000) / 1e9).toFixed(2)
  for (const op of ["set", "get"]) {
    const a = t["node-redis"][op], b = t.ioredis[op]
    console.log(`${size / 1024} KiB × ${count} ${op.toUpperCase()}: node-redis ${gbs(a)} GB/s, ioredis ${gbs(b)} GB/s, node-redis/ioredis ${(b / a).toFixed(2)}×`)
  }
}
await nodeRedis.close()
io.disconnect()
