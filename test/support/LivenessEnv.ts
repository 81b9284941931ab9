/**
 * The server's modules without sockets, on the TestClock: the server
 * assembly's `layerModulesTest` (configuration, native memory, L1, every
 * module, the connection tracker, the management module and the reaper).
 * Each test provides its own, so each gets a fresh clock.
 */
import { randomUUID } from "node:crypto"
import { Effect, type Layer } from "effect"
import { layerModulesTest } from "../../src/layers/Server.ts"
import type { ServerConfigInput } from "../../src/services/server/ServerConfig.ts"
import type { CacheKey } from "../../src/schema/CacheKey.ts"
import { makeInstanceId } from "../../src/schema/InstanceId.ts"
import { makePagedKvCache } from "../../src/services/client/PagedKvCache.ts"
import { RequestBarrier } from "../../src/services/liveness/RequestBarrier.ts"

export const livenessEnv = (
  config: Partial<ServerConfigInput> = {},
  barrier: Layer.Layer<RequestBarrier> = RequestBarrier.layerNoop
) => layerModulesTest({ config: { chunkSize: 32, ...config }, barrier })

/** A worker's KV cache (real shared memory) for registering. */
export const workerCache = Effect.suspend(() =>
  makePagedKvCache({
    backing: "cpu_shm",
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
