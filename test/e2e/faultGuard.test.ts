/**
 * The fault guard end to end (issue 13 item 1): real processes, real
 * `ftruncate`, real SIGBUS in the server. A worker shrinks a segment it
 * registered; the server's copy of the vanished pages (STORE's gather,
 * RETRIEVE's scatter; REGISTER touches none) takes SIGBUS on
 * a libuv pool thread. The guard ends that copy: the request is answered
 * `invalid_argument` naming the instance, the segment and "the segment
 * shrank below its registered size" within a second; the instance's context
 * is released; the server keeps serving the other worker, whose bytes in L1
 * are intact; `/api/status` (fault_guard) and `/metrics`
 * (mpcache_guarded_faults_total) count the same faults.
 *
 * Without the guard (InstallFaultGuard not called in addon.cc) the first
 * test's server dies of SIGBUS at the first STORE, and every later request
 * of every worker fails.
 */
import { randomUUID } from "node:crypto"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { runJsonScript, startScript } from "../support/Cli.ts"
import { assertRetrievesIntact, startServer as startLiveServer, statusOf } from "../support/LiveFleet.ts"
import { childScript } from "../support/ChildScripts.ts"

const WORKER = childScript("worker-main")
const SHRINK = childScript("shrink-worker")
const DAEMON = childScript("worker-daemon")

const SHRANK = "the segment shrank below its registered size"
/** The small KV cache of the shrinking workers: 1 layer segment of 2 × 64 blocks × 16 tokens × 2 × 16 bf16 = 256 KiB. */
const SMALL = { numLayers: 1, numBlocks: 64, blockSizeTokens: 16, numHeads: 2, headSize: 16 }
const SMALL_BYTES = 2 * 64 * 16 * 2 * 16 * 2

const startServer = Effect.gen(function*() {
  const endpoint = `ipc://${join(tmpdir(), `mpcache-fault-${randomUUID()}.sock`)}`
  // A loaded machine (2 cores shared) may take a while to start a server.
  const { server, httpPort } = yield* startLiveServer(endpoint, ["--l1-size-gb", "0.25"], 60_000)
  return { endpoint, server, httpPort }
})

/** mpcache_guarded_faults_total by its `call` label, from /metrics. */
const faultMetrics = (port: number) =>
  Effect.promise(() => fetch(`http://127.0.0.1:${port}/metrics`).then((r) => r.text())).pipe(
    Effect.map((text) => {
      const out: Record<string, number> = {}
      for (const m of text.matchAll(/^mpcache_guarded_faults_total\{[^}]*call="(\w+)"[^}]*\} (\d+(?:\.\d+)?)$/gm)) {
        out[m[1]!] = Number(m[2])
      }
      return out
    })
  )

type Outcome = { readonly ok?: boolean; readonly ms: number; readonly error?: Record<string, unknown> }

/** The error reply a fault gives for `op`, as data; `offset` is the missing page the copy hit (checked apart). */
const expectedError = (op: string, r: Record<string, unknown>, call: string, offset: number) => {
  const now = `${r["shrunkBytes"]} bytes`
  return {
    _tag: "InvalidArgument",
    op,
    instance_id: r["instanceId"],
    field: "kv_caches",
    expected: `segment ${r["segment"]} of at least ${r["registeredBytes"]} bytes (as registered)`,
    actual: now,
    message: `${op}: instance ${r["instanceId"]}: segment ${r["segment"]}: ${SHRANK} (${r["registeredBytes"]} bytes registered, ${now} now; ${call} faulted on the page at byte ${offset}); its context is released: recreate the memory and register it again`
  }
}

/** The offset named in a fault message. */
const offsetOf = (o: Outcome) => Number(/faulted on the page at byte (\d+)\)/.exec(String(o.error?.["message"]))?.[1] ?? -1)

describe("fault guard: a worker shrinks its registered segment", () => {
  it.live("STORE and RETRIEVE of the shrunk memory: invalid_argument within a second, the server alive, the other worker's bytes intact, status = metrics", () =>
    Effect.scoped(Effect.gen(function*() {
      const { endpoint, server, httpPort } = yield* startServer
      // The other worker's chunks, in L1 before anything faults.
      const a = yield* runJsonScript(WORKER, {
        endpoint,
        mode: "store",
        namePrefix: `mpcache-fault-a-${randomUUID()}`,
        seed: 42,
        blockIds: Array.from({ length: 20 }, (_, i) => i + 1),
        tokenCount: 330,
        requestId: "req-a"
      })
      assert.strictEqual(a.code, 0, a.stderr)
      assert.strictEqual(a.result["ok"], true)
      // Another worker transferring all along: a STORE every 10 ms.
      const daemon = yield* startScript(DAEMON, [
        JSON.stringify({ endpoint, namePrefix: `mpcache-fault-d-${randomUUID()}`, heartbeatIntervalMs: 1_000, storeEveryMs: 10 })
      ])
      const [, daemonId] = yield* daemon.waitForStdout(/"event":"registered","instanceId":"(\d+)"/)
      yield* daemon.waitForStdout(/"event":"store","n":1,"ok":true/)

      // 1. Shrunk to half, then STORE: the gather of the V half takes SIGBUS.
      const b1 = yield* runJsonScript(SHRINK, {
        endpoint,
        mode: "shrink-store",
        namePrefix: `mpcache-fault-b1-${randomUUID()}`,
        geometry: SMALL,
        blockIds: [60, 61, 62, 63],
        tokenCount: 64,
        requestId: "req-b1",
        shrinkTo: 0.5
      })
      assert.strictEqual(b1.code, 0, b1.stderr)
      assert.strictEqual(b1.result["registeredBytes"], SMALL_BYTES)
      assert.strictEqual(b1.result["shrunkBytes"], SMALL_BYTES / 2)
      const store1 = b1.result["store"] as Outcome
      const storeOffset = offsetOf(store1)
      assert.deepStrictEqual(store1.error, expectedError("store", b1.result, "gather", storeOffset))
      // The page holding V of block 60 is the first the gather needs past the new end.
      assert.strictEqual(storeOffset, Math.floor((64 + 60) * 16 * 2 * 16 * 2 / 4096) * 4096)
      // The exact error (not the client's RequestTimeout) is the proof that the fault never hung the request;
      // no wall-clock bound (a loaded machine answers slower, and that is no failure).

      // 2. STORE (ok), shrunk to 0, then RETRIEVE: the scatter takes SIGBUS; a STORE after it gets the same error.
      const b2 = yield* runJsonScript(SHRINK, {
        endpoint,
        mode: "store-shrink-retrieve",
        namePrefix: `mpcache-fault-b2-${randomUUID()}`,
        geometry: SMALL,
        blockIds: [1, 2, 3, 4],
        tokenCount: 64,
        requestId: "req-b2",
        shrinkTo: 0
      })
      assert.strictEqual(b2.code, 0, b2.stderr)
      assert.strictEqual((b2.result["stored"] as Outcome).ok, true)
      assert.strictEqual(b2.result["hitTokens"], 64)
      const retrieve = b2.result["retrieve"] as Outcome
      const retrieveOffset = offsetOf(retrieve)
      assert.deepStrictEqual(retrieve.error, expectedError("retrieve", b2.result, "scatter", retrieveOffset))
      // The page holding K of block 1 (bytes 1024…) is the first the scatter writes.
      assert.strictEqual(retrieveOffset, 0)
      const storeAfter = b2.result["storeAfter"] as Outcome
      assert.deepStrictEqual(storeAfter.error, expectedError("store", b2.result, "scatter", retrieveOffset))

      // The server is alive and still serves the other worker: every byte of A's chunks retrieved intact.
      assert.strictEqual(server.child.exitCode, null)
      assert.strictEqual(server.child.signalCode, null)
      yield* assertRetrievesIntact(endpoint, `mpcache-fault-c-${randomUUID()}`)
      // The daemon stored all along, never an error.
      const n = Number([...daemon.stdout().matchAll(/"event":"store","n":(\d+),"ok":true/g)].pop()?.[1] ?? 0)
      yield* daemon.waitForStdout(new RegExp(`"event":"store","n":${n + 2},"ok":true`))
      assert.notInclude(daemon.stdout(), "store_error")
      assert.notInclude(daemon.stdout(), `"ok":false`)

      // Status and metrics agree: two faults, one per call; only the daemon's context is left.
      const doc = yield* statusOf(httpPort)
      assert.deepStrictEqual(doc.fault_guard, { guarded_faults: 2, cuda_faults: 0 })
      assert.deepStrictEqual(yield* faultMetrics(httpPort), { gather: 1, scatter: 1 })
      assert.deepStrictEqual(doc.instances.map((i) => i.instance_id), [daemonId])
      // The daemon's cache: 2 layers of 2 × 16 blocks × 16 tokens × 16 fp16, one segment each.
      assert.deepStrictEqual(doc.native, { open_mappings: 2, mapped_bytes: 2 * (2 * 16 * 16 * 16 * 2) })
    })), 120_000)

  it.live("several copy threads fault at once: 8 chunks of one STORE, all answered with one error, each fault counted", () =>
    Effect.scoped(Effect.gen(function*() {
      const { endpoint, server, httpPort } = yield* startServer
      const b = yield* runJsonScript(SHRINK, {
        endpoint,
        mode: "shrink-store",
        namePrefix: `mpcache-fault-many-${randomUUID()}`,
        geometry: SMALL,
        blockIds: Array.from({ length: 32 }, (_, i) => i + 1),
        tokenCount: 512,
        requestId: "req-many",
        shrinkTo: 0
      })
      assert.strictEqual(b.code, 0, b.stderr)
      const store = b.result["store"] as Outcome
      assert.deepStrictEqual(store.error, expectedError("store", b.result, "gather", offsetOf(store)))
      assert.strictEqual(server.child.exitCode, null)
      // One copy job per chunk on the libuv pool (4 threads): each of the 8 ends in its own guarded fault.
      const doc = yield* statusOf(httpPort)
      assert.deepStrictEqual(doc.fault_guard, { guarded_faults: 8, cuda_faults: 0 })
      assert.deepStrictEqual(yield* faultMetrics(httpPort), { gather: 8 })
      assert.deepStrictEqual(doc.instances, [])
      assert.deepStrictEqual(doc.native, { open_mappings: 0, mapped_bytes: 0 })
      // L1 untouched: nothing of the failed STORE was published or left reserved.
      assert.deepStrictEqual({ objects: doc.l1.objects, reserved: doc.l1.reserved_objects }, { objects: 0, reserved: 0 })
    })), 60_000)

  it.live("a shrink right after REGISTER: nothing faults until the first copy (REGISTER touches no page), then the STORE's gather gets the error", () =>
    Effect.scoped(Effect.gen(function*() {
      const { endpoint, server, httpPort } = yield* startServer
      // 256 MiB in one segment: a prefault of it at REGISTER (the server had one before issue 24 item 12) would fault.
      const geometry = { numLayers: 1, numBlocks: 4096, blockSizeTokens: 16, numHeads: 8, headSize: 128 }
      const b = yield* runJsonScript(SHRINK, {
        endpoint,
        mode: "register-shrink",
        namePrefix: `mpcache-fault-pre-${randomUUID()}`,
        geometry,
        blockIds: [1, 2, 3, 4],
        tokenCount: 64,
        requestId: "req-pre",
        shrinkTo: 0,
        httpPort
      })
      assert.strictEqual(b.code, 0, b.stderr)
      assert.strictEqual(b.result["registeredBytes"], 256 * 1024 * 1024)
      assert.deepStrictEqual([b.result["faultsAfterShrink"], b.result["heldAfterShrink"]], [0, true])
      const store = b.result["store"] as Outcome
      // K of block 1 (one block: 16 tokens × 8 × 128 bf16 = 32 KiB) is the first page the gather reads.
      assert.strictEqual(offsetOf(store), 32 * 1024)
      assert.deepStrictEqual(store.error, expectedError("store", b.result, "gather", 32 * 1024))
      assert.strictEqual(server.child.exitCode, null)
      const doc = yield* statusOf(httpPort)
      assert.deepStrictEqual(doc.fault_guard, { guarded_faults: 1, cuda_faults: 0 })
      assert.deepStrictEqual(yield* faultMetrics(httpPort), { gather: 1 })
      assert.deepStrictEqual(doc.instances, [])
      assert.deepStrictEqual(doc.native, { open_mappings: 0, mapped_bytes: 0 })
      assert.match(server.stderr(), /released its context \(1 segment\(s\)\)/)
    })), 60_000)
})
