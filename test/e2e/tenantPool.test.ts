/**
 * The engine-driven `shm` pool under tenancy (issue 24 item 7;
 * docs/security.md "7."), with a real `mpcache serve` child and real
 * sockets: the attack is a worker that takes the pool name its engine-driven
 * REGISTER answers, opens `/dev/shm/<name>`, finds another worker's chunk
 * and overwrites it, so that the other's RETRIEVE returns the attacker's
 * bytes.
 *
 * - Without CURVE (no tenants) the attack works, as docs/security.md says:
 *   `shm` shares L1 with every engine-driven worker.
 * - With CURVE, `serve --engine-driven-transport shm` exits 2 naming the
 *   flag and `inline`; the default transport is inline, whose REGISTER
 *   names no pool: two tenants store and retrieve the same tokens byte for
 *   byte, neither reads the other's chunks, and the server keeps answering.
 * - With CURVE, a process of another uid cannot open the pool's file at all
 *   (mode 0600, the server's uid): run as root, the attacker is dropped to
 *   uid 65534 with setpriv.
 */
import { spawnSync } from "node:child_process"
import { closeSync, existsSync, fstatSync, openSync, readSync, statSync, writeSync } from "node:fs"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { ClientLive } from "../../src/layers/Client.ts"
import { makeInstanceId } from "../../src/schema/InstanceId.ts"
import { Ping } from "../../src/schema/Op.ts"
import { makeEngineDrivenWorkerAdapter } from "../../src/services/client/EngineDrivenWorkerAdapter.ts"
import { makeMqClient } from "../../src/services/client/MqClient.ts"
import type { DealerCurve } from "../../src/services/zmq/Sockets.ts"
import { runCli } from "../support/Cli.ts"
import { makeTestKeys } from "../support/CurveKeys.ts"
import { chunkContent } from "../support/KvData.ts"
import { ipcEndpoint, startServer, statusOf } from "../support/LiveFleet.ts"

/** 10.7 MB of L1: small enough to read whole, room for 327 chunk objects of 32 KiB. */
const L1_FLAGS = ["--l1-size-gb", "0.01", "--no-l1-prefault"]
/** 4 chunks of 64 tokens (the server's --chunk-size in LiveFleet.startServer). */
const tokens = (seed: number) => Array.from({ length: 256 }, (_, i) => (i * 31 + seed * 7919) % 32000)
const whole = (seed: number) => ({ requestId: `r${seed}`, tokenIds: tokens(seed), start: 0, end: 256 })

/** An engine-driven worker on `endpoint` with instance id `id` (and `curve`'s key). */
const worker = (endpoint: string, id: number, curve?: DealerCurve) =>
  makeEngineDrivenWorkerAdapter({
    endpoint,
    modelName: "tenant-pool-model",
    worldSize: 1,
    kvRank: 0,
    blockSizeTokens: 16,
    numLayers: 4,
    hiddenDimSize: 32,
    dtype: "bfloat16",
    instanceId: makeInstanceId(BigInt(id)),
    requestTimeoutMs: 10_000,
    ...(curve === undefined ? {} : { curve })
  })

/** Whether the chunks a retrieve got are `seed`'s, chunk by chunk. */
const chunksAre = (chunks: ReadonlyArray<Uint8Array>, seed: number, bytes: number) =>
  chunks.map((c, i) => Buffer.from(c).equals(Buffer.from(chunkContent(seed, i, bytes))))

/**
 * The attacker's step on the pool file `name`: reads the whole pool, finds
 * `victim` (a chunk object's bytes) and overwrites it with `forged`.
 * Returns the byte offset it overwrote, or -1 when the chunk is not there.
 */
const overwriteInPool = (name: string, victim: Uint8Array, forged: Uint8Array): number => {
  const fd = openSync(`/dev/shm/${name}`, "r+")
  try {
    const pool = Buffer.alloc(fstatSync(fd).size)
    readSync(fd, pool, 0, pool.length, 0)
    const at = pool.indexOf(Buffer.from(victim))
    if (at >= 0) writeSync(fd, forged, 0, forged.length, at)
    return at
  } finally {
    closeSync(fd)
  }
}

const isRoot = process.getuid?.() === 0

describe("the engine-driven shm pool under tenancy (issue 24 item 7, real processes)", () => {
  it.live("without CURVE the shm pool is shared, as docs/security.md says: a worker maps the pool its REGISTER names and overwrites another's chunk", () =>
    Effect.scoped(Effect.gen(function*() {
      const endpoint = ipcEndpoint()
      yield* startServer(endpoint, [...L1_FLAGS, "--engine-driven-transport", "shm"])
      const a = yield* worker(endpoint, 1)
      const b = yield* worker(endpoint, 2)
      yield* a.register
      const pool = yield* b.register
      assert.match(pool.shm_name, /^mpcache-l1-[0-9a-f]{8}-\d+$/)
      const bytes = a.layout.chunkBytes
      assert.isTrue(yield* a.store(whole(1), (i) => chunkContent(1, i, bytes)))
      const forged = chunkContent(666, 0, bytes)
      assert.isAtLeast(overwriteInPool(pool.shm_name, chunkContent(1, 0, bytes), forged), 0, "A's chunk 0 is in the pool B maps")
      const got = yield* a.retrieve(whole(1))
      assert.isTrue(got.ok)
      assert.deepStrictEqual(chunksAre(got.chunks, 1, bytes), [false, true, true, true])
      assert.isTrue(Buffer.from(got.chunks[0]!).equals(Buffer.from(forged)), "A's RETRIEVE returns the attacker's bytes")
    })).pipe(Effect.provide(ClientLive)), 60_000)

  it.live("with CURVE `serve --engine-driven-transport shm` exits 2 naming the flag and inline, before binding", () =>
    Effect.gen(function*() {
      const keys = makeTestKeys({ a: "tenantA", b: "tenantB" })
      const endpoint = ipcEndpoint()
      const r = yield* runCli([
        "serve", "--endpoint", endpoint, "--http-port", "0", ...L1_FLAGS, "--engine-driven-transport", "shm",
        "--curve-secret-key-file", keys.serverSecretFile, "--curve-authorized-keys", keys.authorizedKeysFile
      ])
      assert.strictEqual(r.code, 2, r.stderr)
      assert.include(
        r.stderr,
        "--engine-driven-transport: shm shares the L1 pool with every engine-driven worker: a tenant that maps it reads and overwrites every other tenant's chunks; with CURVE tenants use inline (the default when CURVE is on)"
      )
      assert.isFalse(existsSync(endpoint.slice("ipc://".length)), "nothing was bound")
    }), 60_000)

  it.live("with CURVE the REGISTER names no pool; two tenants store and retrieve the same tokens inline byte for byte, neither reads the other's, the server keeps answering", () =>
    Effect.scoped(Effect.gen(function*() {
      const keys = makeTestKeys({ a: "tenantA", b: "tenantB" })
      const endpoint = ipcEndpoint()
      const { httpPort } = yield* startServer(endpoint, [
        ...L1_FLAGS, "--curve-secret-key-file", keys.serverSecretFile, "--curve-authorized-keys", keys.authorizedKeysFile
      ])
      const a = yield* worker(endpoint, 1, keys.clients["a"])
      const b = yield* worker(endpoint, 2, keys.clients["b"])
      assert.deepStrictEqual(yield* a.register, { shm_name: "", pool_size: 0 })
      assert.deepStrictEqual(yield* b.register, { shm_name: "", pool_size: 0 }, "the attacker is handed no pool to map")
      assert.deepStrictEqual([yield* a.transport, yield* b.transport], ["inline", "inline"])
      const bytes = a.layout.chunkBytes
      // The same tokens, different bytes: each tenant's chunks are its own objects (its salt group).
      assert.isTrue(yield* a.store(whole(1), (i) => chunkContent(1, i, bytes)))
      assert.isTrue(yield* b.store({ ...whole(1), requestId: "rb" }, (i) => chunkContent(2, i, bytes)))
      const gotA = yield* a.retrieve(whole(1))
      const gotB = yield* b.retrieve({ ...whole(1), requestId: "rb" })
      assert.deepStrictEqual([gotA.ok, chunksAre(gotA.chunks, 1, bytes)], [true, [true, true, true, true]])
      assert.deepStrictEqual([gotB.ok, chunksAre(gotB.chunks, 2, bytes)], [true, [true, true, true, true]])
      // Tokens only A stored: B's RETRIEVE of them misses.
      assert.isTrue(yield* a.store(whole(3), (i) => chunkContent(3, i, bytes)))
      assert.deepStrictEqual(yield* b.retrieve({ ...whole(3), requestId: "rb3" }), { ok: false, chunks: [] })
      const again = yield* a.retrieve({ ...whole(3), requestId: "ra3" })
      assert.deepStrictEqual([again.ok, chunksAre(again.chunks, 3, bytes)], [true, [true, true, true, true]])
      // The pool itself is the server's, mode 0600; status names it (a local user also sees it in /dev/shm).
      const status = yield* statusOf(httpPort)
      assert.strictEqual(status.engine_driven.pool, null)
      const poolFile = statSync(`/dev/shm/${status.l1.pool!}`)
      assert.deepStrictEqual([poolFile.mode & 0o777, poolFile.uid], [0o600, process.getuid!()])
      const ping = yield* makeMqClient({ endpoint, requestTimeoutMs: 10_000, lingerMs: 0, curve: keys.clients["a"]! })
      assert.strictEqual(yield* ping.request(Ping, [makeInstanceId(1n)]), true)
    })).pipe(Effect.provide(ClientLive)), 60_000)

  it.live.skipIf(!isRoot)("with CURVE a tenant process of another uid cannot open the pool's file, for reading or writing; the owner's chunks stay intact", () =>
    Effect.scoped(Effect.gen(function*() {
      const keys = makeTestKeys({ a: "tenantA" })
      const endpoint = ipcEndpoint()
      const { httpPort } = yield* startServer(endpoint, [
        ...L1_FLAGS, "--curve-secret-key-file", keys.serverSecretFile, "--curve-authorized-keys", keys.authorizedKeysFile
      ])
      const a = yield* worker(endpoint, 1, keys.clients["a"])
      yield* a.register
      const bytes = a.layout.chunkBytes
      assert.isTrue(yield* a.store(whole(1), (i) => chunkContent(1, i, bytes)))
      const path = `/dev/shm/${(yield* statusOf(httpPort)).l1.pool!}`
      /** `script` run by /bin/sh as uid/gid 65534 with no supplementary groups, `path` as $1. */
      const asNobody = (script: string) =>
        spawnSync("setpriv", ["--reuid=65534", "--regid=65534", "--clear-groups", "--", "/bin/sh", "-c", script, "sh", path], { encoding: "utf8" })
      assert.strictEqual(asNobody("id -u").stdout.trim(), "65534", "the attacker runs as another uid")
      for (const open of ['exec 3<>"$1"', 'exec 3<"$1"']) {
        const r = asNobody(open)
        assert.notStrictEqual(r.status, 0, `${open} succeeded`)
        assert.include(r.stderr, "Permission denied", open)
      }
      const got = yield* a.retrieve(whole(1))
      assert.deepStrictEqual([got.ok, chunksAre(got.chunks, 1, bytes)], [true, [true, true, true, true]])
    })).pipe(Effect.provide(ClientLive)), 60_000)
})
