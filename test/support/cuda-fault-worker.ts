/**
 * A worker with a cuda_ipc KV cache for the CUDA-fault end-to-end tests
 * (issue 13 item 4), against the fake libcudart its environment names
 * (MPCACHE_CUDART, inherited by the server too): it arms the fake's failure
 * itself (test/support/FakeCudart.ts setFakeFailure; the fake fails only the
 * importing side, the server), so the server's next CUDA call on its memory
 * fails. Prints one JSON line: each request's outcome, its error as data and
 * how long it took.
 *
 *   node test/support/cuda-fault-worker.ts '{"endpoint":…,"mode":…,…}'
 *
 * Modes:
 *   refused         REGISTER with the handle's first byte flipped: cudaIpcOpenMemHandle refuses it
 *   store-fail      register, write, arm `failure`, STORE (the server's copy fails), STORE again
 *   retrieve-fail   register, write, STORE (ok), arm `failure`, LOOKUP, RETRIEVE (the copy fails),
 *                   STORE, then REGISTER again (after a sticky failure the server's CUDA is unusable)
 */
import { Effect } from "effect"
import { ClientLive } from "../../src/layers/Client.ts"
import { makeCudaPagedKvCache } from "../../src/services/client/CudaPagedKvCache.ts"
import { makeSchedulerAdapter } from "../../src/services/client/SchedulerAdapter.ts"
import { makeWorkerAdapter } from "../../src/services/client/WorkerAdapter.ts"
import { fakeCudartAt, type FakeFailure, setFakeFailure } from "./FakeCudart.ts"
import { writeTokens } from "./KvData.ts"
import { outcome } from "./Outcome.ts"

interface Args {
  readonly endpoint: string
  readonly mode: "refused" | "store-fail" | "retrieve-fail"
  readonly deviceUuid: string
  readonly blockIds: ReadonlyArray<number>
  readonly tokenCount: number
  readonly requestId: string
  /** store-fail, retrieve-fail: the failure armed before the failing request. */
  readonly failure?: FakeFailure
}

const args = JSON.parse(process.argv[2] ?? "{}") as Args
/** 2 layers × [2, 64 blocks, 16 tokens, 2 heads, 16] bf16 in one allocation (one handle): 512 KiB. */
const geometry = { numLayers: 2, numBlocks: 64, blockSizeTokens: 16, numHeads: 2, headSize: 16, dtype: "bfloat16" as const }
const tokenIds = Array.from({ length: args.tokenCount }, (_, i) => (i * 29 + 5) % 32000)

const program = Effect.gen(function*() {
  const library = process.env["MPCACHE_CUDART"]
  if (library === undefined) return yield* Effect.die(new Error("cuda-fault-worker: MPCACHE_CUDART must name the fake libcudart"))
  const arm = Effect.sync(() => setFakeFailure(fakeCudartAt(library), args.failure!))
  const cache = yield* makeCudaPagedKvCache({ ...geometry, deviceUuid: args.deviceUuid })
  const worker = yield* makeWorkerAdapter({ endpoint: args.endpoint, modelName: "cuda-fault-e2e", worldSize: 1, kvRank: 0 })
  const base = { instanceId: worker.instanceId.toString(), pid: process.pid, bytes: cache.allocations[0]!.sizeBytes }
  if (args.mode === "refused") {
    const refused = cache.descriptors.map((d) => {
      const handle = new Uint8Array(d.ipc_handle!)
      handle[0] = handle[0]! ^ 0xff
      return { ...d, ipc_handle: handle }
    })
    return { ...base, register: yield* outcome(worker.registerKvCaches(refused)) }
  }
  yield* worker.registerKvCaches(cache.descriptors)
  yield* writeTokens(cache, 7, args.blockIds)
  const end = Math.floor(args.tokenCount / worker.chunkSizeTokens) * worker.chunkSizeTokens
  const request = { requestId: args.requestId, tokenIds, start: 0, end, blockIds: args.blockIds }
  if (args.mode === "store-fail") {
    yield* arm
    const store = yield* outcome(worker.store(request))
    return { ...base, store, storeAfter: yield* outcome(worker.store(request)) }
  }
  const stored = yield* outcome(worker.store(request))
  yield* arm
  const scheduler = yield* makeSchedulerAdapter({ endpoint: args.endpoint, modelName: "cuda-fault-e2e", worldSize: 1 })
  const hitTokens = yield* scheduler.lookup(args.requestId, tokenIds)
  const retrieve = yield* outcome(worker.retrieve({ ...request, end: hitTokens }))
  yield* scheduler.endSession(args.requestId)
  const storeAfter = yield* outcome(worker.store(request))
  const registerAgain = yield* outcome(worker.registerKvCaches(cache.descriptors))
  return { ...base, stored, hitTokens, retrieve, storeAfter, registerAgain }
})

Effect.runPromise(program.pipe(Effect.scoped, Effect.provide(ClientLive))).then(
  (result) => process.stdout.write(`${JSON.stringify(result)}\n`),
  (error: unknown) => {
    process.stderr.write(`cuda fault worker failed: ${String(error)}\n`)
    process.exitCode = 1
  }
)
