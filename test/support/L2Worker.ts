/**
 * The worker side of the L2 e2e suites (test/e2e/l2*.test.ts): `mpcache
 * serve --l2-url` as a child process with a client in this process that
 * registered one KV cache of the "tiny" model (real shared memory, real
 * ZeroMQ), and the requests they send: token prefixes, their CacheKeys,
 * runs of block ids, and a LOOKUP that waits for the L2 prefetch; and the
 * L2 key the server gives each chunk, for tests that look into Redis.
 */
import { randomUUID } from "node:crypto"
import { Effect, Layer } from "effect"
import { NativeMemoryLive } from "../../src/layers/NativeMemory.ts"
import { ZmqSocketsLive } from "../../src/layers/Zmq.ts"
import type { CacheKey } from "../../src/schema/CacheKey.ts"
import { makeInstanceId } from "../../src/schema/InstanceId.ts"
import { Lookup, QueryPrefetchStatus, RegisterKvCache } from "../../src/schema/Op.ts"
import { chunkHashes } from "../../src/services/kv/TokenHasher.ts"
import type { KvLayout } from "../../src/services/server/LayoutRegistry.ts"
import { objectKeysOf } from "../../src/services/server/Lookup.ts"
import { l2KeyOf, layoutFingerprint } from "../../src/services/server/l2/L2Value.ts"
import { makeMqClient, type MqClientShape } from "../../src/services/client/MqClient.ts"
import { makePagedKvCache } from "../../src/services/client/PagedKvCache.ts"
import { eventually, ipcEndpoint, startServer, statusOf } from "./LiveFleet.ts"

/** Tokens per chunk: startServer's --chunk-size. */
export const CHUNK = 64
/** The worker's KV cache: 3 layers of [2, 512, 16, 2 × 8] float16. */
export const geometry = { numLayers: 3, numBlocks: 512, blockSizeTokens: 16, numHeads: 2, headSize: 8, dtype: "float16" as const }

/** The layout of one L1 object (one chunk of one rank) of the worker's cache, as the server fingerprints it. */
export const objectLayout: KvLayout = { numLayers: 3, hiddenDim: 16, elementBytes: 2, dtype: "float16", chunkBytes: 2 * 3 * CHUNK * 16 * 2 }

/** Env of the worker side: native memory for its KV caches, ZeroMQ for its clients. */
export const WorkerEnv = Layer.mergeAll(NativeMemoryLive, ZmqSocketsLive)

/** `n` token ids, deterministic in `seed` (different seeds give different chunk hashes). */
export const tokensOf = (n: number, seed: number): Array<number> => Array.from({ length: n }, (_, i) => (i * 31 + seed * 7919) % 50000)

/** The CacheKey of all of `tokens` (rank 0 of 1, no salt, a fresh request id), with `over` applied. */
export const keyOf = (tokens: ReadonlyArray<number>, over: Partial<CacheKey> = {}): CacheKey => ({
  model_name: "tiny",
  world_size: 1,
  worker_id: 0,
  token_ids: tokens,
  start: 0,
  end: tokens.length,
  request_id: `r-${randomUUID()}`,
  cache_salt: "",
  ...over
})

/** The L2 key of chunk `i` of `tokens` (rank 0, no salt) under `prefix`: the key the server reads and writes. */
export const l2KeyOfChunk = (tokens: ReadonlyArray<number>, i: number, prefix = "mpc"): string =>
  l2KeyOf(prefix, layoutFingerprint(objectLayout, CHUNK), objectKeysOf(keyOf(tokens), chunkHashes(tokens, CHUNK, i + 1), 0)[i]!)

/** Block ids `from`, `from + 1`, … (`n` of them). */
export const range = (from: number, n: number): Array<number> => Array.from({ length: n }, (_, i) => from + i)

/**
 * A server with L2 at `url` (more `flags`, the child's `env` added) and a
 * client of it with one KV cache registered as `id`, once the L2 breaker has
 * left its first `probing` state (ok, or open when the store is unreachable).
 */
export const serverWithWorker = (
  url: string,
  id: bigint,
  options: { readonly flags?: ReadonlyArray<string>; readonly env?: Readonly<Record<string, string>> } = {}
) =>
  Effect.gen(function*() {
    const endpoint = ipcEndpoint()
    const { server, httpPort } = yield* startServer(endpoint, [
      // Lookups get 1 s, not 50 ms: this machine is shared, and timeouts are L2Tier.test.ts's subject (TestClock).
      "--l2-url", url, "--l1-size-gb", "0.0625", "--no-l1-prefault", "--l2-breaker-probe-max-ms", "1000", "--l2-lookup-timeout-ms", "1000",
      ...(options.flags ?? [])
    ], undefined, options.env)
    const client = yield* makeMqClient({ endpoint, requestTimeoutMs: 10_000 })
    const cache = yield* makePagedKvCache({ backing: "cpu_shm", namePrefix: `mpcache-l2-${randomUUID()}`, ...geometry })
    yield* client.request(RegisterKvCache, [makeInstanceId(id), cache.descriptors, "tiny", 1, "vllm", {}, []])
    // The breaker starts probing (writes dropped, LOOKUP L1 only) until its first PING: ok, or open when unreachable.
    yield* eventually(statusOf(httpPort), (s) => s.l2 !== null && s.l2.state !== "probing", 10_000)
    return { server, httpPort, client, cache, id: makeInstanceId(id) }
  })

/** LOOKUP then QUERY_PREFETCH_STATUS until it is not nil (the L2 prefetch ended): the prefix in chunks, -1 if it never ended. */
export const lookupPrefix = (client: MqClientShape, key: CacheKey) =>
  Effect.gen(function*() {
    yield* client.request(Lookup, [{ ...key, worker_id: null }, 1])
    const n = yield* eventually(client.request(QueryPrefetchStatus, [key.request_id]).pipe(Effect.orDie), (n) => n !== null, 10_000)
    return n ?? -1
  })
