/**
 * An engine-driven worker process for end-to-end tests: registers an
 * engine-driven context through the EngineDrivenWorkerAdapter (mapping the
 * server's L1 pool when the server answers one), then either
 * - `store`: STOREs deterministic chunk objects for its tokens;
 * - `retrieve`: LOOKUPs (SchedulerAdapter), RETRIEVEs and checks every byte;
 * - `prepare-and-hang`: PREPARE_STOREs, copies its chunks into the slots
 *   (shm; inline has nothing to copy before the COMMIT), prints its line and
 *   waits without ever committing (to be SIGKILLed).
 * Prints one JSON line.
 *
 *   node test/support/engine-driven-worker-main.ts '{"endpoint":…,"mode":…,…}'
 */
import { Effect } from "effect"
import { ClientLive } from "../../src/layers/Client.ts"
import { NativeMemory } from "../../src/native/Native.ts"
import { makeInstanceId } from "../../src/schema/InstanceId.ts"
import { PrepareStore, RegisterKvCacheEngineDrivenContext } from "../../src/schema/Op.ts"
import { makeEngineDrivenWorkerAdapter } from "../../src/services/client/EngineDrivenWorkerAdapter.ts"
import { makeMqClient } from "../../src/services/client/MqClient.ts"
import { makeSchedulerAdapter } from "../../src/services/client/SchedulerAdapter.ts"
import type { DealerCurve } from "../../src/services/zmq/Sockets.ts"
import { chunkContent } from "./KvData.ts"

interface Args {
  readonly endpoint: string
  readonly mode: "store" | "retrieve" | "prepare-and-hang"
  readonly seed: number
  readonly tokenCount: number
  readonly requestId: string
  /** CURVE keys of this worker (test/support/CurveMode.ts); absent: no CURVE. */
  readonly curve?: DealerCurve
}

const args = JSON.parse(process.argv[2] ?? "{}") as Args
const layout = { numLayers: 4, hiddenDimSize: 32, dtype: "bfloat16" as const, blockSizeTokens: 16 }
const tokenIds = Array.from({ length: args.tokenCount }, (_, i) => (i * 31 + 7) % 32000)


const curve = args.curve === undefined ? {} : { curve: args.curve }
const common = { endpoint: args.endpoint, modelName: "e2e-ed-model", worldSize: 1, kvRank: 0, ...layout, ...curve }

const program = Effect.gen(function*() {
  if (args.mode === "prepare-and-hang") {
    const client = yield* makeMqClient({ endpoint: args.endpoint, ...curve })
    const id = makeInstanceId(BigInt(process.pid) * 1000n + 17n)
    const pool = yield* client.request(RegisterKvCacheEngineDrivenContext, [{
      instance_id: id,
      model_name: common.modelName,
      world_size: 1,
      block_size: layout.blockSizeTokens,
      num_layers: layout.numLayers,
      hidden_dim_size: layout.hiddenDimSize,
      dtype_str: layout.dtype,
      use_mla: false
    }])
    const key = {
      model_name: common.modelName,
      world_size: 1,
      worker_id: 0,
      token_ids: tokenIds,
      start: 0,
      end: tokenIds.length,
      request_id: args.requestId,
      cache_salt: ""
    }
    const prepared = yield* client.request(PrepareStore, [key, id])
    // Through the shared pool the chunks are copied into their slots now; inline, they would travel in the
    // COMMIT_STORE that never comes.
    if (pool.pool_size > 0) {
      const native = yield* NativeMemory
      const view = yield* native.map(pool.shm_name, pool.pool_size)
      yield* Effect.forEach(prepared.context.slots, (s, j) =>
        native.scatter(view, Float64Array.of(s.offset, 0, s.length), chunkContent(args.seed, prepared.context.chunk_indices[j]!, s.length)))
    }
    process.stdout.write(`${JSON.stringify({ instanceId: id.toString(), slots: prepared.context.slots.length, pid: process.pid })}\n`)
    setInterval(() => {}, 1 << 30) // stay alive until killed
    return yield* Effect.never
  }
  const worker = yield* makeEngineDrivenWorkerAdapter(common)
  yield* worker.register
  const transport = yield* worker.transport
  const chunk = worker.chunkSizeTokens
  const end = Math.floor(args.tokenCount / chunk) * chunk
  const request = { requestId: args.requestId, tokenIds, start: 0, end }
  if (args.mode === "store") {
    const ok = yield* worker.store(request, (i) => chunkContent(args.seed, i, worker.layout.chunkBytes))
    return { ok, transport, instanceId: worker.instanceId.toString(), pid: process.pid }
  }
  const scheduler = yield* makeSchedulerAdapter({ endpoint: args.endpoint, modelName: common.modelName, worldSize: 1, ...curve })
  const hitTokens = yield* scheduler.lookup(args.requestId, tokenIds)
  const got = yield* worker.retrieve({ ...request, end: hitTokens })
  yield* scheduler.endSession(args.requestId)
  const mismatches = got.chunks.flatMap((c, i) =>
    Buffer.from(c).equals(Buffer.from(chunkContent(args.seed, i, worker.layout.chunkBytes))) ? [] : [i]
  )
  return { ok: got.ok, chunks: got.chunks.length, hitTokens, mismatches, transport, instanceId: worker.instanceId.toString(), pid: process.pid }
})

Effect.runPromise(program.pipe(Effect.scoped, Effect.provide(ClientLive))).then(
  (result) => process.stdout.write(`${JSON.stringify(result)}\n`),
  (error: unknown) => {
    process.stderr.write(`worker failed: ${String(error)}\n`)
    process.exitCode = 1
  }
)
