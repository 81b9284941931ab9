/**
 * The server's modules without sockets, on the TestClock: configuration,
 * native memory, L1, lookup, the LMCache-driven transfer module, the
 * connection tracker and the management module with its reaper. Each test
 * provides its own, so each gets a fresh clock.
 */
import { randomUUID } from "node:crypto"
import { Effect, Layer } from "effect"
import { NativeMemoryLive } from "../../src/layers/NativeMemory.ts"
import { ServerConfig, type ServerConfigInput } from "../../src/services/server/ServerConfig.ts"
import type { CacheKey } from "../../src/schema/CacheKey.ts"
import { makeInstanceId } from "../../src/schema/InstanceId.ts"
import { Connections } from "../../src/services/liveness/Connections.ts"
import { L1Store } from "../../src/services/server/L1Store.ts"
import { LayoutRegistry } from "../../src/services/server/LayoutRegistry.ts"
import { LivenessTargets } from "../../src/services/liveness/LivenessTarget.ts"
import { LmcacheDrivenTransfer } from "../../src/services/server/LmcacheDrivenTransfer.ts"
import { Lookup } from "../../src/services/server/Lookup.ts"
import { Management } from "../../src/services/server/Management.ts"
import { makePagedKvCache } from "../../src/services/client/PagedKvCache.ts"
import { RequestBarrier } from "../../src/services/liveness/RequestBarrier.ts"

export const livenessEnv = (
  config: Partial<ServerConfigInput> = {},
  barrier: Layer.Layer<RequestBarrier> = RequestBarrier.layerNoop
) => {
  const transfer = LmcacheDrivenTransfer.layer.pipe(
    Layer.provideMerge(Lookup.layer),
    Layer.provideMerge(Layer.mergeAll(L1Store.layer, LayoutRegistry.layer).pipe(Layer.provideMerge(NativeMemoryLive)))
  )
  const targets = Layer.effect(
    LivenessTargets,
    Effect.gen(function*() {
      const t = yield* LmcacheDrivenTransfer
      return [t.target]
    })
  )
  return Management.layer.pipe(
    Layer.provideMerge(Connections.layer),
    Layer.provideMerge(Layer.mergeAll(targets, L1Store.layerCacheControl, barrier)),
    Layer.provideMerge(transfer),
    Layer.provideMerge(ServerConfig.layerTest({ chunkSize: 32, ...config }))
  )
}

/** A worker's KV cache (real shared memory) for registering. */
export const workerCache = Effect.suspend(() =>
  makePagedKvCache({
    namePrefix: `mpcache-test-${randomUUID()}`,
    numLayers: 1,
    numBlocks: 4,
    blockSizeTokens: 16,
    numHeads: 1,
    headSize: 8,
    dtype: "float16"
  })
)

export const id = (n: number) => makeInstanceId(BigInt(n))

/** An empty-range key: a STORE with it touches the context and moves no bytes. */
export const emptyKey: CacheKey = {
  model_name: "m",
  world_size: 1,
  worker_id: 0,
  token_ids: [],
  start: 0,
  end: 0,
  request_id: "r",
  cache_salt: ""
}
