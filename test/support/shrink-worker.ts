/**
 * A misbehaving worker for the fault-guard end-to-end tests (issue 13 item
 * 1): it registers a shared-memory KV cache, then shrinks one of its
 * segments with a real `ftruncate` (fs.truncateSync on /dev/shm/<name>), so
 * the server's next copy of those pages takes a real SIGBUS. Prints one JSON
 * line: each request's outcome, its error as data and how long it took.
 *
 *   node test/support/shrink-worker.ts '{"endpoint":…,"mode":…,"namePrefix":…,…}'
 *
 * Modes:
 *   shrink-store     register, write, shrink, STORE                 (the server's gather faults)
 *   store-shrink-retrieve
 *                    register, write, STORE (ok), shrink, LOOKUP, RETRIEVE (the scatter faults), then STORE
 *   register-shrink  register, shrink at once, read the server's /api/status (`httpPort`): REGISTER touched no
 *                    page (issue 24 item 12), so the instance is still held and no fault counted; then
 *                    STORE (its gather faults)
 *   register-only    REGISTER, nothing else (its outcome: --named-segments deny refuses it)
 */
import { ftruncateSync, truncateSync } from "node:fs"
import { Effect } from "effect"
import { ClientLive } from "../../src/layers/Client.ts"
import { makePagedKvCache } from "../../src/services/client/PagedKvCache.ts"
import { makeSchedulerAdapter } from "../../src/services/client/SchedulerAdapter.ts"
import { makeWorkerAdapter } from "../../src/services/client/WorkerAdapter.ts"
import { writeTokens } from "./KvData.ts"
import { outcome } from "./Outcome.ts"

interface Args {
  readonly endpoint: string
  readonly mode: "shrink-store" | "store-shrink-retrieve" | "register-shrink" | "register-only"
  readonly namePrefix: string
  /** KV geometry of the cache (PagedKvCache options). */
  readonly geometry: {
    readonly numLayers: number
    readonly numBlocks: number
    readonly blockSizeTokens: number
    readonly numHeads: number
    readonly headSize: number
  }
  readonly blockIds: ReadonlyArray<number>
  readonly tokenCount: number
  readonly requestId: string
  /** The segment's new size as a fraction of its size (0: truncate to 0 bytes). */
  readonly shrinkTo: number
  /** register-shrink: the server's HTTP port, read for the fault count and the instances held. */
  readonly httpPort?: number
  /** Default cpu_shm; cpu_memfd creates UNSEALED memfds and shrinks the first with ftruncate(fd). */
  readonly backing?: "cpu_memfd" | "cpu_shm"
}

const args = JSON.parse(process.argv[2] ?? "{}") as Args
const tokenIds = Array.from({ length: args.tokenCount }, (_, i) => (i * 37 + 11) % 32000)

interface StatusView {
  readonly fault_guard: { readonly guarded_faults: number }
  readonly instances: ReadonlyArray<{ readonly instance_id: string }>
}

/** The server's guarded-fault count and the instance ids it holds, from /api/status. */
const serverView = (port: number) =>
  Effect.promise(() => fetch(`http://127.0.0.1:${port}/api/status`).then((r) => r.json() as Promise<StatusView>)).pipe(
    Effect.map((doc) => ({ faults: doc.fault_guard.guarded_faults, ids: doc.instances.map((i) => i.instance_id) }))
  )

const program = Effect.gen(function*() {
  const backing = args.backing ?? "cpu_shm"
  const cache = yield* makePagedKvCache({ namePrefix: args.namePrefix, backing, seals: 0, ...args.geometry, dtype: "bfloat16" })
  const worker = yield* makeWorkerAdapter({ endpoint: args.endpoint, modelName: "fault-e2e", worldSize: 1, kvRank: 0 })
  const segment = cache.segmentNames[0]!
  const registeredBytes = cache.descriptors[0]!.nbytes
  const shrunkBytes = Math.floor(registeredBytes * args.shrinkTo)
  const shrink = Effect.sync(() =>
    backing === "cpu_memfd" ? ftruncateSync(cache.memfds[0]!, shrunkBytes) : truncateSync(`/dev/shm/${segment}`, shrunkBytes)
  )
  const end = Math.floor(args.tokenCount / worker.chunkSizeTokens) * worker.chunkSizeTokens
  const request = { requestId: args.requestId, tokenIds, start: 0, end, blockIds: args.blockIds }
  const base = { instanceId: worker.instanceId.toString(), pid: process.pid, segment, registeredBytes, shrunkBytes }
  if (args.mode === "register-only") return { ...base, register: yield* outcome(worker.registerPagedKvCache(cache)) }
  if (args.mode === "register-shrink") {
    const before = (yield* serverView(args.httpPort!)).faults
    yield* worker.registerPagedKvCache(cache)
    yield* shrink
    const after = yield* serverView(args.httpPort!)
    const store = yield* outcome(worker.store(request))
    return { ...base, faultsAfterShrink: after.faults - before, heldAfterShrink: after.ids.includes(base.instanceId), store }
  }
  yield* worker.registerPagedKvCache(cache)
  yield* writeTokens(cache, 1, args.blockIds)
  if (args.mode === "shrink-store") {
    yield* shrink
    return { ...base, store: yield* outcome(worker.store(request)) }
  }
  const stored = yield* outcome(worker.store(request))
  yield* shrink
  const scheduler = yield* makeSchedulerAdapter({ endpoint: args.endpoint, modelName: "fault-e2e", worldSize: 1 })
  const hitTokens = yield* scheduler.lookup(args.requestId, tokenIds)
  const retrieve = yield* outcome(worker.retrieve({ ...request, end: hitTokens }))
  yield* scheduler.endSession(args.requestId)
  const storeAfter = yield* outcome(worker.store(request))
  return { ...base, stored, hitTokens, retrieve, storeAfter }
})

Effect.runPromise(program.pipe(Effect.scoped, Effect.provide(ClientLive))).then(
  (result) => process.stdout.write(`${JSON.stringify(result)}\n`),
  (error: unknown) => {
    process.stderr.write(`shrink worker failed: ${String(error)}\n`)
    process.exitCode = 1
  }
)
