/**
 * L2 over TLS (issue 15 item 1, `rediss://`): a real redis-server serving
 * TLS with a certificate from a CA made for the test (openssl), real
 * `mpcache serve` processes, a worker in this process.
 *
 * - A server that trusts the CA (NODE_EXTRA_CA_CERTS, Node's own way to add
 *   a CA) writes through and reads back over TLS, byte for byte.
 * - A server that does not trust it never talks to the store: the
 *   certificate is refused (fail closed), status names why, and the server
 *   serves from L1 as without L2.
 *
 * Skipped, loudly, where redis-server is not installed (RedisSuite) or
 * openssl is missing (the certificates cannot be made); .ci/run installs
 * both.
 */
import { execFileSync, spawnSync } from "node:child_process"
import { mkdtempSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { EndSession, Retrieve, Store } from "../../src/schema/Op.ts"
import { HEADER_BYTES } from "../../src/services/server/l2/L2Value.ts"
import { verifyTokens, writeTokens } from "../support/KvData.ts"
import { eventually, statusOf } from "../support/LiveFleet.ts"
import { CHUNK, keyOf, lookupPrefix, range, serverWithWorker, tokensOf, WorkerEnv } from "../support/L2Worker.ts"
import { startRedis } from "../support/RedisFleet.ts"
import { redisSuite } from "../support/RedisSuite.ts"

const CHUNK_BYTES = 2 * 3 * CHUNK * 16 * 2
const EVENT = new Uint8Array([7])

/** A CA, and a certificate it signed for 127.0.0.1 (EC P-256, 2 days), in a temporary folder removed with the scope. */
const makeCertificates = Effect.acquireRelease(
  Effect.sync(() => {
    const dir = mkdtempSync(join(tmpdir(), "mpcache-l2-tls-"))
    const f = (name: string) => join(dir, name)
    const openssl = (...args: ReadonlyArray<string>) => execFileSync("openssl", args, { stdio: ["ignore", "ignore", "pipe"] })
    const ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl("req", "-x509", ...ec, "-keyout", f("ca.key"), "-out", f("ca.pem"), "-days", "2", "-subj", "/CN=mpcache test CA")
    openssl("req", ...ec, "-keyout", f("server.key"), "-out", f("server.csr"), "-subj", "/CN=127.0.0.1")
    writeFileSync(f("ext.cnf"), "subjectAltName=IP:127.0.0.1\n")
    openssl("x509", "-req", "-in", f("server.csr"), "-CA", f("ca.pem"), "-CAkey", f("ca.key"), "-CAcreateserial",
      "-out", f("server.pem"), "-days", "2", "-extfile", f("ext.cnf"))
    return { dir, certFile: f("server.pem"), keyFile: f("server.key"), caFile: f("ca.pem") }
  }),
  ({ dir }) => Effect.sync(() => rmSync(dir, { recursive: true, force: true }))
)

const opensslAvailable = spawnSync("openssl", ["version"]).status === 0
if (!opensslAvailable) process.stderr.write("\n*** L2 TLS suite SKIPPED: openssl not found (apt-get install -y openssl; .ci/run does) ***\n\n")

redisSuite("L2 over TLS (rediss://) on a real redis-server", () => describe.skipIf(!opensslAvailable)(opensslAvailable ? "with openssl" : "(SKIPPED: no openssl)", () => {
  it.live("a server that trusts the store's CA writes and reads over TLS, byte for byte; one that does not refuses the certificate and serves from L1", () =>
    Effect.gen(function*() {
      const certs = yield* makeCertificates
      const redis = yield* startRedis({ tls: certs })
      const url = redis.tlsUrl!
      assert.match(url, /^rediss:\/\/127\.0\.0\.1:\d+$/)
      const trusted = { NODE_EXTRA_CA_CERTS: certs.caFile }

      const a = yield* serverWithWorker(url, 1n, { env: trusted })
      const b = yield* serverWithWorker(url, 2n, { env: trusted })
      for (const s of [a, b]) yield* eventually(statusOf(s.httpPort), (st) => st.l2?.state === "ok", 10_000)
      const tokens = tokensOf(2 * CHUNK, 3)
      const blocksA = range(0, 8)
      yield* writeTokens(a.cache, 11, blocksA)
      assert.deepStrictEqual(yield* a.client.request(Store, [keyOf(tokens), a.id, [blocksA], EVENT]), [EVENT, true])
      yield* eventually(statusOf(a.httpPort), (st) => st.l2?.writes === 2, 10_000)
      // Through the plain port (the harness's redis-cli): the values are there, header and bytes.
      assert.strictEqual(redis.cli("DBSIZE"), "2")
      for (const k of redis.cli("KEYS", "mpc:v1:*").split("\n")) assert.strictEqual(redis.cli("STRLEN", k), String(HEADER_BYTES + CHUNK_BYTES))

      const key = keyOf(tokens)
      assert.strictEqual(yield* lookupPrefix(b.client, key), 2)
      const blocksB = range(100, 8)
      assert.deepStrictEqual(yield* b.client.request(Retrieve, [key, b.id, [blocksB], EVENT, 0]), [EVENT, true])
      assert.deepStrictEqual(yield* verifyTokens(b.cache, 11, blocksB), [])
      yield* b.client.request(EndSession, [key.request_id])
      assert.deepInclude((yield* statusOf(b.httpPort)).l2, { url, state: "ok", connected: true, hit_chunks: 2, corrupt_values: 0 })

      // No trust in the CA (the environment without NODE_EXTRA_CA_CERTS): the TLS handshake fails, nothing is sent.
      const c = yield* serverWithWorker(url, 3n, { env: { NODE_EXTRA_CA_CERTS: "" } })
      const cStatus = yield* eventually(statusOf(c.httpPort), (st) => st.l2?.state === "open", 15_000)
      assert.deepInclude(cStatus.l2, { connected: false, writes: 0, hit_chunks: 0 })
      assert.match(cStatus.l2!.last_error ?? "", /self[- ]signed|unable to (get|verify)|certificate/i)
      const other = tokensOf(2 * CHUNK, 4)
      yield* writeTokens(c.cache, 12, blocksA)
      assert.deepStrictEqual(yield* c.client.request(Store, [keyOf(other), c.id, [blocksA], EVENT]), [EVENT, true])
      assert.strictEqual(yield* lookupPrefix(c.client, keyOf(tokens)), 0) // A's chunks are in L2, which C cannot reach
      assert.strictEqual(yield* lookupPrefix(c.client, keyOf(other)), 2) // its own, from L1
      assert.strictEqual(redis.cli("DBSIZE"), "2")
    }).pipe(Effect.scoped, Effect.provide(WorkerEnv)), 90_000)
}))
