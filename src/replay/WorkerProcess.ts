/**
 * One engine worker of `mpcache replay`, as its own OS process, with its
 * own adapter and heartbeat. For each request the driver sends, it
 * RETRIEVEs the hit prefix and checks every byte against what it would
 * compute, "computes" the rest (the deterministic bytes of Synth.ts), and
 * STOREs the new complete chunks. Two transfer modes (`--transfer-mode`):
 *
 * - `lmcache-driven`: its own shared-memory paged KV cache, registered with
 *   REGISTER_KV_CACHE; blocks 1…n hold the request's tokens in order (block
 *   0 is vLLM's null block, which the server never stores); the server
 *   copies between those blocks and L1 (STORE, RETRIEVE).
 * - `engine-driven`: an engine-driven context (EngineDrivenWorkerAdapter);
 *   the worker holds each chunk's KV as its L1 object `[2, num_layers,
 *   chunk_size, num_heads × head_size]` and copies it itself into and out of
 *   the server's shared L1 pool, which it maps in its own process
 *   (PREPARE_STORE/COMMIT_STORE, PREPARE_RETRIEVE/COMMIT_RETRIEVE).
 *
 * Started by the driver with `child_process.fork` (IPC channel); exits after
 * a Shutdown message (unregistering first) or when the channel closes.
 */
import { NodeRuntime } from "@effect/platform-node"
import { Deferred, Effect, Queue } from "effect"
import { ClientLive } from "../layers/Client.ts"
import { dtypeBytes } from "../schema/Dtype.ts"
import { makeEngineDrivenWorkerAdapter } from "../services/client/EngineDrivenWorkerAdapter.ts"
import { makeCudaPagedKvCache } from "../services/client/CudaPagedKvCache.ts"
import { makePagedKvCache } from "../services/client/PagedKvCache.ts"
import { makeWorkerAdapter } from "../services/client/WorkerAdapter.ts"
import { KeyFileInvalid, readClientKeys } from "../services/auth/Curve.ts"
import type { Done, DriverMessage, RunRequest, WorkerMessage, WorkerSettings } from "./Messages.ts"
import { fillKv, modelSeed, tokensFor } from "./Synth.ts"

const settings = JSON.parse(process.argv[2] ?? "{}") as WorkerSettings

const send = (m: WorkerMessage) => Effect.sync(() => process.send?.(m))

/** The adapters' CURVE option from the settings' key files; fails with `KeyFileInvalid` naming the file. */
const curveOption = Effect.try({
  try: () =>
    settings.curve === undefined ? {} : { curve: readClientKeys(settings.curve.serverPublicKeyFile, settings.curve.secretKeyFile) },
  catch: (e) => e instanceof KeyFileInvalid ? e : new KeyFileInvalid({ path: settings.curve?.secretKeyFile ?? "", reason: String(e) })
})

/** A registered worker: its id, the server's chunk size, and one request's work. */
interface Runner {
  readonly instanceId: string
  readonly chunkSizeTokens: number
  readonly run: (r: RunRequest) => Effect.Effect<Done, { readonly message: string }>
}

const tokenBytes = settings.numHeads * settings.headSize * dtypeBytes(settings.dtype)
const seed = modelSeed(settings.modelName)

/** Mismatching chunk indices, ascending. */
const sortedMismatches = (mismatched: Set<number>) => [...mismatched].sort((a, b) => a - b)

/** What one request did, as the driver reads it. Chunk counts from token counts; times in ms. */
const doneMessage = (
  r: RunRequest,
  o: {
    readonly chunk: number
    readonly chunkBytes: number
    readonly hit: number
    readonly fullTokens: number
    readonly retrieveOk: boolean
    /** Whether the worker was healthy (not in degraded mode) when it asked for the RETRIEVE. */
    readonly healthyAtRetrieve: boolean
    readonly storeOk: boolean
    readonly mismatched: Set<number>
    readonly times: readonly [number, number, number, number]
    readonly reregistrations: number
    readonly healthy: boolean
  }
): Done => {
  const retrievedChunks = o.retrieveOk ? o.hit / o.chunk : 0
  const unserved = o.retrieveOk ? 0 : o.hit / o.chunk
  const storedChunks = o.fullTokens > o.hit && o.storeOk ? (o.fullTokens - o.hit) / o.chunk : 0
  const [t0, t1, t2, t3] = o.times
  return {
    _tag: "Done",
    index: r.index,
    retrieveOk: o.retrieveOk,
    storeOk: o.storeOk,
    retrievedChunks,
    storedChunks,
    retrievedBytes: retrievedChunks * o.chunkBytes,
    unservedRetrieveChunks: { notSent: o.healthyAtRetrieve ? 0 : unserved, failed: o.healthyAtRetrieve ? unserved : 0 },
    storedBytes: storedChunks * o.chunkBytes,
    mismatchedChunks: sortedMismatches(o.mismatched),
    retrieveMs: t1 - t0,
    computeMs: t2 - t1,
    storeMs: t3 - t2,
    reregistrations: o.reregistrations,
    healthy: o.healthy
  }
}

/** LMCache-driven: a paged KV cache in shared memory, registered with the server. */
const lmcacheDriven = Effect.gen(function*() {
  const geometry = {
    numLayers: settings.numLayers,
    numBlocks: settings.numBlocks,
    blockSizeTokens: settings.blockSizeTokens,
    numHeads: settings.numHeads,
    headSize: settings.headSize,
    dtype: settings.dtype
  }
  const cache = settings.device === "cuda"
    ? yield* makeCudaPagedKvCache(geometry)
    : yield* makePagedKvCache({ namePrefix: settings.namePrefix, ...geometry })
  const worker = yield* makeWorkerAdapter({
    endpoint: settings.endpoint,
    modelName: settings.modelName,
    worldSize: 1,
    kvRank: 0,
    heartbeatIntervalMs: settings.heartbeatIntervalMs,
    requestTimeoutMs: 30_000,
    ...(yield* curveOption)
  })
  yield* worker.registerPagedKvCache(cache)
  const chunk = worker.chunkSizeTokens
  const bs = settings.blockSizeTokens
  const chunkBytes = 2 * settings.numLayers * chunk * tokenBytes

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
      const healthyAtRetrieve = yield* worker.isHealthy
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
      return doneMessage(r, {
        chunk,
        chunkBytes,
        hit,
        fullTokens,
        retrieveOk,
        healthyAtRetrieve,
        storeOk,
        mismatched,
        times: [t0, t1, t2, t3],
        reregistrations: yield* worker.reregistrations,
        healthy: yield* worker.isHealthy
      })
    })

  return { instanceId: worker.instanceId.toString(), chunkSizeTokens: chunk, run } satisfies Runner
})

/** Engine-driven: chunk objects computed here, copied through the server's L1 pool by this process. */
const engineDriven = Effect.gen(function*() {
  const worker = yield* makeEngineDrivenWorkerAdapter({
    endpoint: settings.endpoint,
    modelName: settings.modelName,
    worldSize: 1,
    kvRank: 0,
    blockSizeTokens: settings.blockSizeTokens,
    numLayers: settings.numLayers,
    hiddenDimSize: settings.numHeads * settings.headSize,
    dtype: settings.dtype,
    heartbeatIntervalMs: settings.heartbeatIntervalMs,
    requestTimeoutMs: 30_000,
    ...(yield* curveOption)
  })
  yield* worker.register
  const chunk = worker.chunkSizeTokens
  const { chunkBytes } = worker.layout
  const perLayerBytes = chunk * tokenBytes

  /** Chunk c's L1 object `[2, num_layers, chunk, hidden]`: K of every layer, then V. */
  const expectedChunk = (c: number, hashIds: ReadonlyArray<number>) => {
    const out = new Uint8Array(chunkBytes)
    for (const kv of [0, 1] as const) {
      for (let l = 0; l < settings.numLayers; l++) {
        const at = (kv * settings.numLayers + l) * perLayerBytes
        fillKv(out.subarray(at, at + perLayerBytes), seed, l, kv, c * chunk, hashIds, tokenBytes)
      }
    }
    return out
  }

  const run = (r: RunRequest) =>
    Effect.gen(function*() {
      const fullTokens = Math.floor(r.inputLength / chunk) * chunk
      const tokenIds = tokensFor(r.hashIds, r.inputLength)
      const hit = Math.min(r.hitTokens, fullTokens)
      // 1. RETRIEVE the hit prefix and check every byte.
      let retrieveOk = true
      const mismatched = new Set<number>()
      const t0 = performance.now()
      const healthyAtRetrieve = yield* worker.isHealthy
      if (hit > 0) {
        const got = yield* worker.retrieve({ requestId: r.requestId, tokenIds, start: 0, end: hit })
        retrieveOk = got.ok
        if (got.ok) {
          for (let c = 0; c < hit / chunk; c++) {
            const have = got.chunks[c]
            if (have === undefined || !Buffer.from(have.buffer, have.byteOffset, have.byteLength).equals(expectedChunk(c, r.hashIds))) {
              mismatched.add(c)
            }
          }
        }
      }
      const t1 = performance.now()
      // 2. "Compute" the new chunks: what the engine's forward pass would produce.
      const computed = new Map<number, Uint8Array>()
      for (let c = hit / chunk; c < fullTokens / chunk; c++) computed.set(c, expectedChunk(c, r.hashIds))
      const t2 = performance.now()
      // 3. STORE the new complete chunks (the server asks only for those it does not hold).
      let storeOk = true
      if (fullTokens > hit) {
        storeOk = yield* worker.store(
          { requestId: r.requestId, tokenIds, start: hit, end: fullTokens },
          (i) => computed.get(hit / chunk + i)!
        )
      }
      const t3 = performance.now()
      return doneMessage(r, {
        chunk,
        chunkBytes,
        hit,
        fullTokens,
        retrieveOk,
        healthyAtRetrieve,
        storeOk,
        mismatched,
        times: [t0, t1, t2, t3],
        reregistrations: yield* worker.reregistrations,
        healthy: yield* worker.isHealthy
      })
    })

  return { instanceId: worker.instanceId.toString(), chunkSizeTokens: chunk, run } satisfies Runner
})

const program = Effect.gen(function*() {
  const inbox = yield* Queue.unbounded<DriverMessage>()
  const closed = yield* Deferred.make<void>()
  process.on("message", (m: DriverMessage) => Queue.offerUnsafe(inbox, m))
  process.on("disconnect", () => Deferred.doneUnsafe(closed, Effect.void))
  const runner: Runner = settings.transferMode === "engine-driven" ? yield* engineDriven : yield* lmcacheDriven
  yield* send({ _tag: "Ready", instanceId: runner.instanceId, pid: process.pid, chunkSizeTokens: runner.chunkSizeTokens })

  const run = (r: RunRequest) =>
    runner.run(r).pipe(
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

NodeRuntime.runMain(program.pipe(Effect.scoped, Effect.provide(ClientLive)), {
  teardown: (exit, onExit) => {
    const code = exit._tag === "Success" || exit.cause.reasons.every((r) => r._tag === "Interrupt") ? 0 : 1
    if (process.connected) process.disconnect()
    onExit(code)
  }
})
