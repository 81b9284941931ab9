/**
 * One engine worker of `mpcache replay`, as its own OS process: its own
 * shared-memory KV cache, its own WorkerAdapter with heartbeat. For each
 * request the driver sends, it RETRIEVEs the hit prefix into its blocks and
 * checks every byte against what it would compute, "computes" the rest
 * (writes the deterministic bytes), and STOREs the new complete chunks.
 * Blocks 1…n hold the request's tokens in order (block 0 is vLLM's null
 * block, which the server never stores).
 *
 * Started by the driver with `child_process.fork` (IPC channel); exits after
 * a Shutdown message (unregistering first) or when the channel closes.
 */
import { NodeRuntime } from "@effect/platform-node"
import { Deferred, Effect, Queue } from "effect"
import { NativeMemoryLive } from "../layers/NativeMemory.ts"
import { dtypeBytes } from "../schema/Dtype.ts"
import { makePagedKvCache } from "../services/PagedKvCache.ts"
import { makeWorkerAdapter } from "../services/WorkerAdapter.ts"
import type { Done, DriverMessage, RunRequest, WorkerMessage, WorkerSettings } from "./Messages.ts"
import { fillKv, modelSeed, tokensFor } from "./Synth.ts"

const settings = JSON.parse(process.argv[2] ?? "{}") as WorkerSettings

const send = (m: WorkerMessage) => Effect.sync(() => process.send?.(m))

const program = Effect.gen(function*() {
  const inbox = yield* Queue.unbounded<DriverMessage>()
  const closed = yield* Deferred.make<void>()
  process.on("message", (m: DriverMessage) => Queue.offerUnsafe(inbox, m))
  process.on("disconnect", () => Deferred.doneUnsafe(closed, Effect.void))

  const cache = yield* makePagedKvCache({
    namePrefix: settings.namePrefix,
    numLayers: settings.numLayers,
    numBlocks: settings.numBlocks,
    blockSizeTokens: settings.blockSizeTokens,
    numHeads: settings.numHeads,
    headSize: settings.headSize,
    dtype: settings.dtype
  })
  const worker = yield* makeWorkerAdapter({
    endpoint: settings.endpoint,
    modelName: settings.modelName,
    worldSize: 1,
    kvRank: 0,
    heartbeatIntervalMs: settings.heartbeatIntervalMs,
    requestTimeoutMs: 30_000
  })
  yield* worker.registerKvCaches(cache.descriptors)
  const chunk = worker.chunkSizeTokens
  const bs = settings.blockSizeTokens
  const tokenBytes = settings.numHeads * settings.headSize * dtypeBytes(settings.dtype)
  const seed = modelSeed(settings.modelName)
  const chunkBytes = 2 * settings.numLayers * chunk * tokenBytes
  yield* send({ _tag: "Ready", instanceId: worker.instanceId.toString(), pid: process.pid, chunkSizeTokens: chunk })

  const expected = (layer: number, kv: 0 | 1, firstPosition: number, tokens: number, hashIds: ReadonlyArray<number>) => {
    const out = Buffer.alloc(tokens * tokenBytes)
    fillKv(out, seed, layer, kv, firstPosition, hashIds, tokenBytes)
    return out
  }

  const run = (r: RunRequest) =>
    Effect.gen(function*() {
      const fullTokens = Math.floor(r.inputLength / chunk) * chunk
      const tokenIds = tokensFor(r.hashIds, r.inputLength)
      const blocks = Math.ceil(fullTokens / bs)
      const blockIds = Array.from({ length: blocks }, (_, i) => i + 1)
      const hit = Math.min(r.hitTokens, fullTokens)
      // 1. RETRIEVE the hit prefix and check every byte.
      let retrieveOk = true
      const mismatched = new Set<number>()
      const t0 = performance.now()
      if (hit > 0) {
        retrieveOk = yield* worker.retrieve({ requestId: r.requestId, tokenIds, start: 0, end: hit, blockIds: blockIds.slice(0, hit / bs) })
        if (retrieveOk) {
          for (let l = 0; l < settings.numLayers; l++) {
            for (const kv of [0, 1] as const) {
              const got = yield* cache.readBlocks(l, kv, 1, hit / bs)
              const want = expected(l, kv, 0, hit, r.hashIds)
              if (!got.equals(want)) {
                for (let c = 0; c < hit / chunk; c++) {
                  const a = c * chunk * tokenBytes
                  const b = a + chunk * tokenBytes
                  if (!got.subarray(a, b).equals(want.subarray(a, b))) mismatched.add(c)
                }
              }
            }
          }
        }
      }
      const t1 = performance.now()
      // 2. "Compute" the rest: what the engine's forward pass would write (also the hit prefix if it was not retrieved).
      const from = retrieveOk ? hit : 0
      if (fullTokens > from) {
        for (let l = 0; l < settings.numLayers; l++) {
          for (const kv of [0, 1] as const) {
            yield* cache.writeBlocks(l, kv, 1 + from / bs, expected(l, kv, from, fullTokens - from, r.hashIds))
          }
        }
      }
      const t2 = performance.now()
      // 3. STORE the new complete chunks.
      let storeOk = true
      if (fullTokens > hit) {
        storeOk = yield* worker.store({ requestId: r.requestId, tokenIds, start: hit, end: fullTokens, blockIds: blockIds.slice(hit / bs) })
      }
      const t3 = performance.now()
      const retrievedChunks = retrieveOk ? hit / chunk : 0
      const storedChunks = fullTokens > hit && storeOk ? (fullTokens - hit) / chunk : 0
      const done: Done = {
        _tag: "Done",
        index: r.index,
        retrieveOk,
        storeOk,
        retrievedChunks,
        storedChunks,
        retrievedBytes: retrievedChunks * chunkBytes,
        storedBytes: storedChunks * chunkBytes,
        mismatchedChunks: [...mismatched].sort((a, b) => a - b),
        retrieveMs: t1 - t0,
        computeMs: t2 - t1,
        storeMs: t3 - t2,
        reregistrations: yield* worker.reregistrations,
        healthy: yield* worker.isHealthy
      }
      return done
    }).pipe(
      Effect.catch((e) => Effect.succeed<WorkerMessage>({ _tag: "Failed", index: r.index, message: e.message })),
      Effect.flatMap(send)
    )

  const loop = Effect.gen(function*() {
    while (true) {
      const m = yield* Queue.take(inbox)
      if (m._tag === "Shutdown") return
      yield* run(m)
    }
  })
  yield* Effect.raceFirst(loop, Deferred.await(closed))
})

NodeRuntime.runMain(program.pipe(Effect.scoped, Effect.provide(NativeMemoryLive)), {
  teardown: (exit, onExit) => {
    const code = exit._tag === "Success" || exit.cause.reasons.every((r) => r._tag === "Interrupt") ? 0 : 1
    if (process.connected) process.disconnect()
    onExit(code)
  }
})
