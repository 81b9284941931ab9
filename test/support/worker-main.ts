/**
 * A worker process for end-to-end tests: creates its own shared-memory KV
 * cache (cpu_shm, or cpu_memfd with `backing`), registers it through the WorkerAdapter, then either writes
 * deterministic KV bytes and STOREs them, or LOOKUPs (SchedulerAdapter),
 * RETRIEVEs into its own blocks and verifies every byte. Prints one JSON line.
 *
 *   node test/support/worker-main.ts '{"endpoint":…,"mode":"store"|"retrieve",…}'
 */
import { Effect } from "effect"
import { ClientLive } from "../../src/layers/Client.ts"
import { makePagedKvCache } from "../../src/services/client/PagedKvCache.ts"
import { makeSchedulerAdapter } from "../../src/services/client/SchedulerAdapter.ts"
import { makeWorkerAdapter } from "../../src/services/client/WorkerAdapter.ts"
import type { DealerCurve } from "../../src/services/zmq/Sockets.ts"
import { verifyTokens, writeTokens } from "./KvData.ts"

interface Args {
  readonly endpoint: string
  readonly mode: "store" | "retrieve"
  readonly namePrefix: string
  readonly seed: number
  readonly blockIds: ReadonlyArray<number>
  readonly tokenCount: number
  readonly requestId: string
  /** The KV cache's memory (default cpu_shm: the e2e tests that read /dev/shm). */
  readonly backing?: "cpu_memfd" | "cpu_shm"
  /** CURVE keys of this worker (test/support/CurveMode.ts); absent: no CURVE. */
  readonly curve?: DealerCurve
}

const args = JSON.parse(process.argv[2] ?? "{}") as Args
const geometry = { numLayers: 4, numBlocks: 64, blockSizeTokens: 16, numHeads: 2, headSize: 16, dtype: "bfloat16" as const }
const curve = args.curve === undefined ? {} : { curve: args.curve }
const tokenIds = Array.from({ length: args.tokenCount }, (_, i) => (i * 31 + 7) % 32000)

const program = Effect.gen(function*() {
  const cache = yield* makePagedKvCache({ namePrefix: args.namePrefix, backing: args.backing ?? "cpu_shm", ...geometry })
  const worker = yield* makeWorkerAdapter({ endpoint: args.endpoint, modelName: "e2e-model", worldSize: 1, kvRank: 0, ...curve })
  yield* worker.registerPagedKvCache(cache)
  const end = Math.floor(args.tokenCount / worker.chunkSizeTokens) * worker.chunkSizeTokens
  const request = { requestId: args.requestId, tokenIds, start: 0, end, blockIds: args.blockIds }
  if (args.mode === "store") {
    yield* writeTokens(cache, args.seed, args.blockIds)
    const ok = yield* worker.store(request)
    return { ok, instanceId: worker.instanceId.toString(), pid: process.pid }
  }
  const scheduler = yield* makeSchedulerAdapter({ endpoint: args.endpoint, modelName: "e2e-model", worldSize: 1, ...curve })
  const hitTokens = yield* scheduler.lookup(args.requestId, tokenIds)
  const ok = yield* worker.retrieve({ ...request, end: hitTokens })
  yield* scheduler.endSession(args.requestId)
  const mismatches = yield* verifyTokens(cache, args.seed, args.blockIds.slice(0, hitTokens / geometry.blockSizeTokens))
  return { ok, hitTokens, mismatches, instanceId: worker.instanceId.toString(), pid: process.pid }
})

Effect.runPromise(program.pipe(Effect.scoped, Effect.provide(ClientLive))).then(
  (result) => process.stdout.write(`${JSON.stringify(result)}\n`),
  (error: unknown) => {
    process.stderr.write(`worker failed: ${String(error)}\n`)
    process.exitCode = 1
  }
)
