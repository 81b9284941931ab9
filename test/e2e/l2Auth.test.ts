/**
 * Forged L2 values (issue 24 item 14), performed against real processes: a
 * real redis-server, real `mpcache serve` processes with and without
 * `--l2-secret-file`, a worker in this process (real shared memory, real
 * ZeroMQ), and the attacker as a plain Redis client (`redis-cli`) that knows
 * the value format and the key scheme but not the fleet's secret.
 */
import { assert, it } from "@effect/vitest"
import { chmodSync, mkdtempSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Effect } from "effect"
import { EndSession, Retrieve, Store } from "../../src/schema/Op.ts"
import { macKeyOf } from "../../src/services/server/l2/L2Mac.ts"
import { authenticated, checksummed, layoutFingerprint, MAC_HEADER_BYTES } from "../../src/services/server/l2/L2Value.ts"
import { verifyTokens, writeTokens } from "../support/KvData.ts"
import { eventually, getText, statusOf } from "../support/LiveFleet.ts"
import { CHUNK, keyOf, l2KeyOfChunk, lookupPrefix, objectLayout, range, serverWithWorker, tokensOf, WorkerEnv } from "../support/L2Worker.ts"
import { startRedis } from "../support/RedisFleet.ts"
import { redisSuite } from "../support/RedisSuite.ts"

const EVENT = new Uint8Array([9])
const FLEET_SECRET = "6d70632d666c6565742d7365637265742d666f722d746865207465737473"
const OTHER_SECRET = "another-fleet-with-a-secret-of-its-own-32+"
const fp = layoutFingerprint(objectLayout, CHUNK)

/** A folder with the two secret files (mode 0600), removed with the scope. */
const secrets = Effect.acquireRelease(
  Effect.sync(() => {
    const dir = mkdtempSync(join(tmpdir(), "mpcache-l2-auth-"))
    const file = (name: string, secret: string) => {
      const path = join(dir, name)
      writeFileSync(path, `${secret}\n`)
      chmodSync(path, 0o600)
      return path
    }
    return { dir, fleet: file("fleet.secret", FLEET_SECRET), other: file("other.secret", OTHER_SECRET) }
  }),
  ({ dir }) => Effect.sync(() => rmSync(dir, { recursive: true, force: true }))
)

/** `text` as a regular expression matching it literally. */
const escaped = (text: string) => text.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")

/** The value of `name` on /metrics (a line `name value`), or undefined. */
const metric = (text: string, name: string) => {
  const line = text.split("\n").find((l) => l.startsWith(`${name} `))
  return line === undefined ? undefined : Number(line.slice(line.lastIndexOf(" ") + 1))
}

redisSuite("forged L2 values (issue 24 item 14)", () => {
  it.live("values planted by a plain Redis client — a correct header and checksum but no MAC, or a genuine MAC moved to another key — are never served: misses, deleted and counted; the server keeps serving", () =>
    Effect.gen(function*() {
      const redis = yield* startRedis()
      const { fleet } = yield* secrets
      const a = yield* serverWithWorker(redis.url, 1n, { flags: ["--l2-secret-file", fleet] })
      // …with the MAC off the JS thread: the addon's OpenSSL HMAC on the libuv pool (src/native/Hmac.ts).
      yield* a.server.waitForStderr(
        /L2 values are authenticated with HMAC-SHA256 under the secret in \S+fleet\.secret, computed on the libuv pool with this Node's OpenSSL \(EVP_MAC\)/
      )
      // The victim's prompt P and another prompt Q, both written through by A (8 authenticated values).
      const p = tokensOf(4 * CHUNK, 60)
      const q = tokensOf(4 * CHUNK, 61)
      yield* writeTokens(a.cache, 60, range(0, 16))
      yield* writeTokens(a.cache, 61, range(16, 16))
      yield* a.client.request(Store, [keyOf(p), a.id, [range(0, 16)], EVENT])
      yield* a.client.request(Store, [keyOf(q), a.id, [range(16, 16)], EVENT])
      yield* eventually(statusOf(a.httpPort), (s) => s.l2?.writes === 8, 10_000)
      assert.strictEqual(redis.cli("STRLEN", l2KeyOfChunk(p, 0)), String(MAC_HEADER_BYTES + objectLayout.chunkBytes))

      // The attack. P's chunk 2 becomes a well-formed checksummed value (the format without a secret, which
      // anyone can build) carrying other KV (Q's chunk 2); P's chunk 3 becomes Q's genuine, MACed chunk 3.
      const q2 = redis.getBytes(l2KeyOfChunk(q, 2))!
      const q3 = redis.getBytes(l2KeyOfChunk(q, 3))!
      const p2 = l2KeyOfChunk(p, 2)
      const p3 = l2KeyOfChunk(p, 3)
      const planted = checksummed.encode(p2, fp, q2.subarray(MAC_HEADER_BYTES))
      assert.deepStrictEqual(Object.keys(checksummed.decode(p2, planted, fp, objectLayout.chunkBytes)), ["payload"]) // its checksum is right
      redis.setBytes(p2, planted)
      redis.setBytes(p3, q3)

      // B shares the secret and has never seen P: L2 has chunks 0 and 1 of it, nothing more.
      const b = yield* serverWithWorker(redis.url, 2n, { flags: ["--l2-secret-file", fleet] })
      const first = keyOf(p)
      assert.strictEqual(yield* lookupPrefix(b.client, first), 2)
      assert.strictEqual(redis.cli("EXISTS", p2), "0")
      assert.strictEqual(redis.cli("EXISTS", p3), "0")
      yield* b.server.waitForStderr(new RegExp(`L2 value ${escaped(p2)} is not authenticated \\(no MAC\\); deleted, treated as a miss`))
      yield* b.server.waitForStderr(
        new RegExp(`L2 value ${escaped(p3)} is not authenticated \\(its MAC does not verify under --l2-secret-file\\); deleted, treated as a miss`)
      )
      assert.deepInclude((yield* statusOf(b.httpPort)).l2, { state: "ok", authenticated: true, unauthenticated_values: 2, corrupt_values: 0, hit_chunks: 4 })
      const metrics = yield* getText(`http://127.0.0.1:${b.httpPort}/metrics`)
      assert.strictEqual(metric(metrics, `mpcache_l2_unauthenticated_values_total{reason="no_mac"}`), 1)
      assert.strictEqual(metric(metrics, `mpcache_l2_unauthenticated_values_total{reason="bad_mac"}`), 1)
      assert.notInclude(metrics, "mpcache_l2_corrupt_values_total")

      // What was promised is served byte for byte; what was planted is a miss and never reaches the worker's blocks.
      assert.deepStrictEqual(yield* b.client.request(Retrieve, [{ ...first, end: 2 * CHUNK }, b.id, [range(100, 8)], EVENT, 0]), [EVENT, true])
      assert.deepStrictEqual(yield* verifyTokens(b.cache, 60, range(100, 8)), [])
      yield* b.client.request(EndSession, [first.request_id])
      const all = keyOf(p)
      assert.strictEqual(yield* lookupPrefix(b.client, all), 2)
      assert.deepStrictEqual(yield* b.client.request(Retrieve, [all, b.id, [range(200, 16)], EVENT, 0]), [EVENT, false])
      yield* b.client.request(EndSession, [all.request_id])
      // Blocks 8-15 would hold chunks 2 and 3: none of them holds Q's KV (3 layers × K and V × 8 blocks differ).
      assert.strictEqual((yield* verifyTokens(b.cache, 61, range(200, 16), 8)).length, 8 * 3 * 2)

      // Everyone else is still served: Q, untouched, comes whole from L2 through B, byte for byte.
      const qKey = keyOf(q)
      assert.strictEqual(yield* lookupPrefix(b.client, qKey), 4)
      assert.deepStrictEqual(yield* b.client.request(Retrieve, [qKey, b.id, [range(300, 16)], EVENT, 0]), [EVENT, true])
      assert.deepStrictEqual(yield* verifyTokens(b.cache, 61, range(300, 16)), [])
    }).pipe(Effect.scoped, Effect.provide(WorkerEnv)), 90_000)

  it.live("servers with one secret share values byte for byte; a server with another secret refuses them, one without a secret warns at start and refuses them too", () =>
    Effect.gen(function*() {
      const redis = yield* startRedis()
      const { fleet, other } = yield* secrets
      const a = yield* serverWithWorker(redis.url, 1n, { flags: ["--l2-secret-file", fleet] })
      const b = yield* serverWithWorker(redis.url, 2n, { flags: ["--l2-secret-file", fleet] })
      const p = tokensOf(4 * CHUNK, 70)
      yield* writeTokens(a.cache, 70, range(0, 16))
      yield* a.client.request(Store, [keyOf(p), a.id, [range(0, 16)], EVENT])
      yield* eventually(statusOf(a.httpPort), (s) => s.l2?.writes === 4, 10_000)
      // Each value in Redis verifies under the fleet's key, computed here from the secret as docs/l2.md gives it.
      const format = authenticated(macKeyOf(Buffer.from(FLEET_SECRET)))
      for (let i = 0; i < 4; i++) {
        const k = l2KeyOfChunk(p, i)
        assert.deepStrictEqual(Object.keys(format.decode(k, redis.getBytes(k)!, fp, objectLayout.chunkBytes)), ["payload"], `chunk ${i}`)
      }
      const key = keyOf(p)
      assert.strictEqual(yield* lookupPrefix(b.client, key), 4)
      assert.deepStrictEqual(yield* b.client.request(Retrieve, [key, b.id, [range(100, 16)], EVENT, 0]), [EVENT, true])
      assert.deepStrictEqual(yield* verifyTokens(b.cache, 70, range(100, 16)), [])
      assert.deepInclude((yield* statusOf(b.httpPort)).l2, { authenticated: true, hit_chunks: 4, unauthenticated_values: 0, corrupt_values: 0 })

      // Another fleet's secret: every value's MAC fails; all four are misses, deleted and counted.
      const c = yield* serverWithWorker(redis.url, 3n, { flags: ["--l2-secret-file", other] })
      assert.strictEqual(yield* lookupPrefix(c.client, keyOf(p)), 0)
      assert.deepInclude((yield* statusOf(c.httpPort)).l2, { authenticated: true, unauthenticated_values: 4 })
      const cMetrics = yield* getText(`http://127.0.0.1:${c.httpPort}/metrics`)
      assert.strictEqual(metric(cMetrics, `mpcache_l2_unauthenticated_values_total{reason="bad_mac"}`), 4)
      assert.strictEqual(redis.cli("DBSIZE"), "0")

      // No secret: a WARNING at start; the fleet's values, which it cannot check, are misses too (corrupt, "keyed").
      const d = yield* serverWithWorker(redis.url, 4n)
      yield* d.server.waitForStderr(
        new RegExp(`L2 values are not authenticated: anyone who can write to redis://127\\.0\\.0\\.1:${redis.port} can serve KV to these engines; set --l2-secret-file`)
      )
      const r = tokensOf(2 * CHUNK, 71)
      yield* writeTokens(a.cache, 71, range(0, 8))
      yield* a.client.request(Store, [keyOf(r), a.id, [range(0, 8)], EVENT])
      yield* eventually(statusOf(a.httpPort), (s) => s.l2?.writes === 6, 10_000)
      assert.strictEqual(yield* lookupPrefix(d.client, keyOf(r)), 0)
      assert.deepInclude((yield* statusOf(d.httpPort)).l2, { authenticated: false, corrupt_values: 2, unauthenticated_values: 0 })
      assert.include(yield* getText(`http://127.0.0.1:${d.httpPort}/metrics`), `mpcache_l2_corrupt_values_total{reason="keyed"} 2`)
    }).pipe(Effect.scoped, Effect.provide(WorkerEnv)), 90_000)
})
