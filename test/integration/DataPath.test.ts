/**
 * The LMCache-driven data path over real sockets and real shared memory, in
 * one process: register, store, lookup, retrieve, and the failure rows.
 * The whole suite runs with CURVE off and on (test/support/CurveMode.ts, issue 14).
 */
import { randomUUID } from "node:crypto"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { NativeMemory } from "../../src/native/Native.ts"
import type { CacheKey } from "../../src/schema/CacheKey.ts"
import { makeInstanceId } from "../../src/schema/InstanceId.ts"
import {
  EndSession,
  Lookup,
  Noop,
  Ping,
  QueryPrefetchStatus,
  RegisterKvCache,
  Retrieve,
  Store,
  UnregisterKvCache
} from "../../src/schema/Op.ts"
import type { TensorDescriptor } from "../../src/schema/TensorDescriptor.ts"
import { BadRequest, InvalidArgument, NotRegistered } from "../../src/schema/WireError.ts"
import { L1Store } from "../../src/services/server/L1Store.ts"
import { LmcacheDrivenTransfer } from "../../src/services/server/LmcacheDrivenTransfer.ts"
import { MqClient } from "../../src/services/client/MqClient.ts"
import { makePagedKvCache, type PagedKvCache } from "../../src/services/client/PagedKvCache.ts"
import { verifyTokens, writeTokens } from "../support/KvData.ts"
import { CURVE_MODES, curveFixture } from "../support/CurveMode.ts"
import { testServer } from "../support/TestServer.ts"

const CHUNK = 32
const BLOCK = 16
const geometry = { numLayers: 3, numBlocks: 64, blockSizeTokens: BLOCK, numHeads: 2, headSize: 8, dtype: "float16" as const }
const tokens = Array.from({ length: 200 }, (_, i) => (i * 7 + 3) % 5000)
const EVENT = new Uint8Array([1, 2, 3])

const key = (over: Partial<CacheKey> = {}): CacheKey => ({
  model_name: "tiny",
  world_size: 1,
  worker_id: 0,
  token_ids: tokens,
  start: 0,
  end: 128,
  request_id: "r1",
  cache_salt: "",
  ...over
})

const newCache = () => makePagedKvCache({ backing: "cpu_shm", namePrefix: `mpcache-test-${randomUUID()}`, ...geometry })

const register = (id: bigint, cache: PagedKvCache, model = "tiny") =>
  Effect.gen(function*() {
    const client = yield* MqClient
    yield* client.request(RegisterKvCache, [makeInstanceId(id), cache.descriptors, model, 1, "vllm", {}, []])
  })

describe.each(CURVE_MODES)("LMCache-driven data path (CURVE $curve)", ({ curve }) => {
  const fx = curveFixture(curve)

  const env = (config = {}) => testServer({ curve: fx, config: { chunkSize: CHUNK, ...config } })

  describe("store and retrieve", () => {
    it.live("chunks stored from one KV cache are retrieved byte-exact into other block ids of another", () =>
      Effect.gen(function*() {
        const client = yield* MqClient
        const a = yield* newCache()
        const b = yield* newCache()
        yield* register(1n, a)
        yield* register(2n, b)
        const blocksA = [1, 2, 3, 4, 5, 6, 7, 8]
        const blocksB = [40, 41, 30, 31, 20, 21, 10, 11]
        yield* writeTokens(a, 7, blocksA)
        assert.deepStrictEqual(yield* client.request(Store, [key(), makeInstanceId(1n), [blocksA], EVENT]), [EVENT, true])
        yield* client.request(Lookup, [key({ worker_id: null }), 1])
        assert.strictEqual(yield* client.request(QueryPrefetchStatus, ["r1"]), 4)
        assert.deepStrictEqual(yield* client.request(Retrieve, [key(), makeInstanceId(2n), [blocksB], EVENT, 0]), [EVENT, true])
        assert.deepStrictEqual(yield* verifyTokens(b, 7, blocksB), [])
        yield* client.request(EndSession, ["r1"])
        const l1 = yield* L1Store
        assert.strictEqual(l1.stats().objects, 4)
        assert.strictEqual(l1.stats().lockedObjects, 0)
      }).pipe(Effect.scoped, Effect.provide(env())))

    it.live("skip_first_n_tokens leaves the first tokens of the range untouched", () =>
      Effect.gen(function*() {
        const client = yield* MqClient
        const a = yield* newCache()
        const b = yield* newCache()
        yield* register(1n, a)
        yield* register(2n, b)
        yield* writeTokens(a, 3, [1, 2, 3, 4])
        yield* writeTokens(b, 99, [5, 6, 7, 8])
        yield* client.request(Store, [key({ end: 64 }), makeInstanceId(1n), [[1, 2, 3, 4]], EVENT])
        const r = yield* client.request(Retrieve, [key({ end: 64 }), makeInstanceId(2n), [[5, 6, 7, 8]], EVENT, 24])
        assert.deepStrictEqual(r, [EVENT, true])
        // Block 0 (tokens 0-15) untouched; block 1 (16-31): tokens 16-23 untouched, 24-31 retrieved; blocks 2-3 retrieved.
        assert.deepStrictEqual(yield* verifyTokens(b, 99, [5]), [])
        assert.deepStrictEqual(yield* verifyTokens(b, 3, [1, 2, 3, 4].map((_, j) => [5, 6, 7, 8][j]!), 2), [])
        const half = yield* b.readBlock(0, 0, 6)
        const tokenBytes = b.geometry.blockBytes / BLOCK
        const expectOld = (yield* Effect.gen(function*() {
          const { blockContent } = yield* Effect.promise(() => import("../support/KvData.ts"))
          return [blockContent(b, 99, 0, 0, 16), blockContent(b, 3, 0, 0, 16)] as const
        }))
        assert.isTrue(half.subarray(0, 8 * tokenBytes).equals(expectOld[0].subarray(0, 8 * tokenBytes)))
        assert.isTrue(half.subarray(8 * tokenBytes).equals(expectOld[1].subarray(8 * tokenBytes)))
      }).pipe(Effect.scoped, Effect.provide(env())))

    it.live("a trailing partial chunk is not stored", () =>
      Effect.gen(function*() {
        const client = yield* MqClient
        const a = yield* newCache()
        yield* register(1n, a)
        yield* writeTokens(a, 1, [1, 2, 3, 4, 5])
        assert.deepStrictEqual(yield* client.request(Store, [key({ end: 80 }), makeInstanceId(1n), [[1, 2, 3, 4, 5]], EVENT]), [EVENT, true])
        const l1 = yield* L1Store
        assert.strictEqual(l1.stats().objects, 2)
        yield* client.request(Lookup, [key({ worker_id: null, end: 96 }), 1])
        assert.strictEqual(yield* client.request(QueryPrefetchStatus, ["r1"]), 2)
      }).pipe(Effect.scoped, Effect.provide(env())))

    it.live("a block list too short for the range fails closed: ok = false and nothing stored", () =>
      Effect.gen(function*() {
        const client = yield* MqClient
        const a = yield* newCache()
        yield* register(1n, a)
        assert.deepStrictEqual(yield* client.request(Store, [key(), makeInstanceId(1n), [[1, 2, 3]], EVENT]), [EVENT, false])
        assert.deepStrictEqual(yield* client.request(Store, [key(), makeInstanceId(1n), [], EVENT]), [EVENT, false])
        assert.deepStrictEqual(yield* client.request(Store, [key({ end: 32 }), makeInstanceId(1n), [[1, 99]], EVENT]), [EVENT, false])
        assert.strictEqual((yield* L1Store).stats().objects, 0)
        assert.deepStrictEqual(yield* client.request(Retrieve, [key(), makeInstanceId(1n), [[1]], EVENT, 0]), [EVENT, false])
      }).pipe(Effect.scoped, Effect.provide(env())))

    it.live("a retrieve of chunks not in L1 answers ok = false and writes nothing", () =>
      Effect.gen(function*() {
        const client = yield* MqClient
        const b = yield* newCache()
        yield* register(2n, b)
        yield* writeTokens(b, 5, [1, 2])
        assert.deepStrictEqual(yield* client.request(Retrieve, [key({ end: 32 }), makeInstanceId(2n), [[1, 2]], EVENT, 0]), [EVENT, false])
        assert.deepStrictEqual(yield* verifyTokens(b, 5, [1, 2]), [])
      }).pipe(Effect.scoped, Effect.provide(env())))

    it.live("eviction under a small capacity respects prefetch locks: the store is refused instead", () =>
      Effect.gen(function*() {
        const client = yield* MqClient
        const a = yield* newCache()
        yield* register(1n, a)
        // One object: 2 × 3 layers × 32 tokens × 16 × 2 bytes = 6144 bytes; L1 holds 4.
        const other = Array.from({ length: 200 }, (_, i) => 9000 + i)
        yield* writeTokens(a, 1, [1, 2, 3, 4, 5, 6, 7, 8])
        yield* client.request(Store, [key(), makeInstanceId(1n), [[1, 2, 3, 4, 5, 6, 7, 8]], EVENT])
        yield* client.request(Lookup, [key({ worker_id: null }), 1])
        assert.strictEqual(yield* client.request(QueryPrefetchStatus, ["r1"]), 4)
        const refused = yield* client.request(Store, [key({ token_ids: other, end: 64 }), makeInstanceId(1n), [[1, 2, 3, 4]], EVENT])
        assert.deepStrictEqual(refused, [EVENT, false])
        assert.strictEqual((yield* L1Store).stats().objects, 4)
        yield* client.request(EndSession, ["r1"])
        const stored = yield* client.request(Store, [key({ token_ids: other, end: 64 }), makeInstanceId(1n), [[1, 2, 3, 4]], EVENT])
        assert.deepStrictEqual(stored, [EVENT, true])
        assert.deepStrictEqual((yield* L1Store).stats().usedBytes, 4 * 6144)
      }).pipe(Effect.scoped, Effect.provide(env({ l1SizeGb: (4 * 6144) / 2 ** 30 }))))
  })

  describe("registration", () => {
    const bad = (mutate: (d: TensorDescriptor) => TensorDescriptor) =>
      Effect.gen(function*() {
        const client = yield* MqClient
        const a = yield* newCache()
        return yield* Effect.flip(
          client.request(RegisterKvCache, [makeInstanceId(9n), a.descriptors.map(mutate), "tiny", 1, "vllm", {}, []])
        )
      })

    it.live("bad descriptors each get a clear error, and the server keeps serving", () =>
      Effect.gen(function*() {
        const client = yield* MqClient
        const wrongNbytes = yield* bad((d) => ({ ...d, nbytes: d.nbytes - 2 }))
        assert.instanceOf(wrongNbytes, InvalidArgument)
        assert.include(wrongNbytes.message, "kv_caches[0].nbytes: the view ends at byte")
        const oversize = yield* bad((d) => ({ ...d, nbytes: d.nbytes * 4, shape: [2, 256, BLOCK, 2, 8], stride: [256 * BLOCK * 16, BLOCK * 16, 16, 8, 1] }))
        assert.instanceOf(oversize, InvalidArgument)
        assert.include(oversize.message, "holds")
        const missing = yield* bad((d) => ({ ...d, shm_name: `mpcache-test-missing-${randomUUID()}` }))
        assert.instanceOf(missing, InvalidArgument)
        assert.include(missing.message, "does not exist")
        const stride = yield* bad((d) => ({ ...d, stride: [1, 1, 1, 1, 1] }))
        assert.instanceOf(stride, InvalidArgument)
        assert.include(stride.message, "kv_caches[0].stride: expected the contiguous strides")
        const cuda = yield* bad((d) => ({ kind: "cuda_ipc", ipc_handle: new Uint8Array(64), device_uuid: "GPU-1", nbytes: d.nbytes, dtype: d.dtype, shape: d.shape, stride: d.stride, storage_offset: 0 }))
        // Without a usable libcudart (this host's case unless MPCACHE_CUDART names one) the reason follows in
        // parentheses; with one, the made-up device UUID is refused instead (test/native/CudaIpc.test.ts).
        if (yield* (yield* NativeMemory).cudaAvailable()) {
          assert.include(cuda.message, `register_kv_cache: openCudaIpcMapping: device_uuid "GPU-1" is not a GPU UUID`)
        } else {
          assert.match(cuda.message, /^register_kv_cache: kv_caches\[0\]\.kind: cuda_ipc: CUDA IPC backend not available on this host \(.+\)$/)
        }
        const dtype = yield* bad((d) => ({ ...d, dtype: "float13" as never }))
        assert.instanceOf(dtype, BadRequest)
        assert.include(dtype.message, "register_kv_cache: payload 1 (kv_caches)")
        assert.strictEqual(yield* client.request(Ping, [null]), true)
        assert.isFalse(yield* (yield* LmcacheDrivenTransfer).isRegistered(makeInstanceId(9n)))
        // The six worker-side caches' own mappings (3 layers each) and the server's L1 pool; no context of the server.
        assert.strictEqual((yield* NativeMemory).stats().openMappings, 18 + 1)
      }).pipe(Effect.scoped, Effect.provide(env())))

    it.live("re-registering the same memory refreshes; different memory under the same id is refused", () =>
      Effect.gen(function*() {
        const a = yield* newCache()
        const b = yield* newCache()
        yield* register(1n, a)
        yield* register(1n, a)
        const error = yield* Effect.flip(register(1n, b))
        assert.instanceOf(error, InvalidArgument)
        assert.include(error.message, "already registered with different memory")
        const instances = yield* (yield* LmcacheDrivenTransfer).target.instances()
        assert.deepStrictEqual(
          instances.map((i) => [i.instance_id, (i.details["layout"] as { segments: ReadonlyArray<string> }).segments]),
          [["1", a.segmentNames]]
        )
      }).pipe(Effect.scoped, Effect.provide(env())))

    it.live("unregister of an unknown id succeeds; a transfer for it is not_registered", () =>
      Effect.gen(function*() {
        const client = yield* MqClient
        const a = yield* newCache()
        yield* register(1n, a)
        yield* client.request(UnregisterKvCache, [makeInstanceId(1n)])
        yield* client.request(UnregisterKvCache, [makeInstanceId(1n)])
        const error = yield* Effect.flip(client.request(Store, [key(), makeInstanceId(1n), [[1, 2, 3, 4]], EVENT]))
        assert.instanceOf(error, NotRegistered)
        assert.include(error.message, "store: instance 1 is not registered")
        assert.strictEqual(yield* client.request(Noop, []), "OK")
      }).pipe(Effect.scoped, Effect.provide(env())))
  })
})
