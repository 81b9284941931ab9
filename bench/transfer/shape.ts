/**
 * The shape of bench:transfer: the model and cache kinds it measures, its
 * load (streams, requests, block pools), its timing constants and targets.
 * Constants only; every other part of bench/transfer reads them from here.
 */
import type { Effect, Scope } from "effect"
import type { NativeError, NativeMemory } from "../../src/native/Native.ts"
import type { InvalidArgument } from "../../src/schema/WireError.ts"
import type { RequestError } from "../../src/services/client/MqClient.ts"
import { makePagedKvCache, type PagedKvCache, type PagedKvCacheOptions } from "../../src/services/client/PagedKvCache.ts"
import type { WorkerAdapterShape } from "../../src/services/client/WorkerAdapter.ts"
import type { ZmqSockets } from "../../src/services/zmq/Sockets.ts"
import { BLOCKS_PER_CHUNK, CHUNK_BYTES, CHUNK_TOKENS, layerBytes } from "../lib/kvChunks.ts"

export const HEADING = "## STORE and RETRIEVE throughput (bench:transfer)"

// Model geometry (one kv rank): bench/lib/kvChunks.ts.
export const MODEL = "bench-32l-8x128-f16"

/**
 * The descriptor kinds whose STORE/RETRIEVE the bench measures, each with
 * how its worker makes the KV cache in the worker's scope (`namePrefix` is
 * this run's unique tag) and registers it. Every phase, table row, summary
 * row and the byte check run once per entry.
 *
 * makePagedKvCache defaults to cpu_memfd, so the cpu_shm entry names its
 * backing (guardCost opens that cache's segments by name); a memfd cache is
 * registered through registerPagedKvCache, which hands its descriptors over.
 */
export interface CacheKind {
  readonly kind: "cpu_shm" | "cpu_memfd"
  readonly makeCache: (
    options: PagedKvCacheOptions
  ) => Effect.Effect<PagedKvCache, InvalidArgument | NativeError, NativeMemory | ZmqSockets | Scope.Scope>
  readonly register: (adapter: WorkerAdapterShape, cache: PagedKvCache) => Effect.Effect<void, RequestError>
}
/** REGISTER_KV_CACHE with the cache's descriptors as they are (cpu_shm). */
export const byDescriptors = (adapter: WorkerAdapterShape, cache: PagedKvCache) => adapter.registerKvCaches(cache.descriptors)
export const KINDS: ReadonlyArray<CacheKind> = [
  { kind: "cpu_shm", makeCache: (o) => makePagedKvCache({ ...o, backing: "cpu_shm" }), register: byDescriptors },
  { kind: "cpu_memfd", makeCache: (o) => makePagedKvCache({ ...o, backing: "cpu_memfd" }), register: (adapter, cache) => adapter.registerPagedKvCache(cache) }
]

// Load shape.
export const CHUNKS_PER_REQUEST = 4
/** Requests in flight, one per stream. */
export const STREAMS = 2
export const BLOCKS_PER_REQUEST = CHUNKS_PER_REQUEST * BLOCKS_PER_CHUNK
export const REQUEST_TOKENS = CHUNKS_PER_REQUEST * CHUNK_TOKENS
export const REQUEST_BYTES = CHUNKS_PER_REQUEST * CHUNK_BYTES
/** Requests stored once for the RETRIEVE phase: 1 GiB, far beyond any CPU cache. */
export const RETRIEVE_SET = 8
/** Block 0 (null, unused) + STREAMS × 64 source blocks + STREAMS × 64 destination blocks. */
export const NUM_BLOCKS = 1 + 2 * STREAMS * BLOCKS_PER_REQUEST
export const LAYER_BYTES = layerBytes(NUM_BLOCKS)
export const L1_SIZE_GB = 4

// Timing.
export const QUICK_PHASE_S = 4
export const QUICK_IDLE_S = 3
export const FULL_PHASE_S = 12
export const WARMUP_S = 1
/** A transfer window runs on past its duration until this many requests completed in it… */
export const MIN_REQUESTS = 8
/** …but no longer than this many times its duration. */
export const MAX_STRETCH = 4
export const MEMCPY_WARMUP_COPIES = 8
/** The guard-cost measurement: rounds of one chunk job of each variant, per direction (quick, full). */
export const GUARD_ROUNDS_QUICK = 150
export const GUARD_ROUNDS_FULL = 400
/** "The guard must cost under 5 %" (issue 13): guarded ÷ unguarded time below this. */
export const GUARD_TARGET = 1.05
export const READY_TIMEOUT_MS = 30_000
export const STOP_TIMEOUT_MS = 10_000
export const REQUEST_TIMEOUT_MS = 30_000
export const PROBE_TIMEOUT_MS = 5_000
export const PREFAULT_TIMEOUT_MS = 300_000
/** The PING probes' pace: 200 PINGs/s each, a light fixed load beside what they measure. */
export const PING_INTERVAL_MS = 5


// Block pools and token ids.

/** Deterministic shuffle (xorshift32) of `ids`, like an engine's block table after some churn. */
const shuffled = (ids: Array<number>, seed: number): Array<number> => {
  let x = seed >>> 0 || 1
  for (let i = ids.length - 1; i > 0; i--) {
    x ^= x << 13
    x >>>= 0
    x ^= x >>> 17
    x ^= x << 5
    x >>>= 0
    const j = x % (i + 1)
    ;[ids[i], ids[j]] = [ids[j]!, ids[i]!]
  }
  return ids
}
export const range = (from: number, count: number): Array<number> => Array.from({ length: count }, (_, i) => from + i)
const sourcePool = shuffled(range(1, STREAMS * BLOCKS_PER_REQUEST), 0x9e3779b9)
const destPool = shuffled(range(1 + STREAMS * BLOCKS_PER_REQUEST, STREAMS * BLOCKS_PER_REQUEST), 0x85ebca6b)
export const sourceBlocks = (stream: number) => sourcePool.slice(stream * BLOCKS_PER_REQUEST, (stream + 1) * BLOCKS_PER_REQUEST)
export const destBlocks = (stream: number) => destPool.slice(stream * BLOCKS_PER_REQUEST, (stream + 1) * BLOCKS_PER_REQUEST)

/** Token ids of request `n`: its first token makes every chunk hash of the request unique. */
export const tokensFor = (n: number): Array<number> =>
  Array.from({ length: REQUEST_TOKENS }, (_, i) => (i === 0 ? 100_000 + n : (i * 31 + 7) % 32_000))
export const SET_BASE = 1_000_000

/** STORE and RETRIEVE GB/s against memcpy of the same bytes (issue 16; the first round asked 0.5×). */
export const MEMCPY_TARGET = 0.6
