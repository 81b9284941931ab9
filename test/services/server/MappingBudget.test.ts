/**
 * The budget of worker-memory mappings (issue 24 items 4 and 12) through the
 * server's modules, with real shared memory and the real native layer:
 *
 * - `--max-segments-per-register`: refused `overloaded` before anything is
 *   mapped or validated, after looking at no more than limit + 1 segments.
 * - `--max-mappings` and `--max-mapped-bytes`: what the native layer holds
 *   open over every instance; an UNREGISTER makes room again through the
 *   mapping's one release; a REGISTER refreshing a held id is never refused;
 *   the server's own L1 pool is not counted.
 * - REGISTER touches none of the worker's pages: a sparse segment (only
 *   ftruncated) has 0 blocks allocated after it, and after a STORE and a
 *   RETRIEVE exactly the pages they copied.
 * - `/api/status`'s `mapping_limits` block says the bounds, what is held and
 *   what was refused.
 */
import { randomUUID } from "node:crypto"
import { readFileSync, statSync } from "node:fs"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Layer } from "effect"
import { NativeMemoryLive } from "../../../src/layers/NativeMemory.ts"
import { NativeMemory } from "../../../src/native/Native.ts"
import type { CacheKey } from "../../../src/schema/CacheKey.ts"
import type { TensorDescriptor } from "../../../src/schema/TensorDescriptor.ts"
import { InvalidArgument, Overloaded } from "../../../src/schema/WireError.ts"
import { makePagedKvCache } from "../../../src/services/client/PagedKvCache.ts"
import { LmcacheDrivenTransfer } from "../../../src/services/server/LmcacheDrivenTransfer.ts"
import { Lookup } from "../../../src/services/server/Lookup.ts"
import { MappingBudget } from "../../../src/services/server/MappingBudget.ts"
import { id, livenessEnv } from "../../support/LivenessEnv.ts"

/**
 * A worker's KV cache of `layers` segments of 2 × 4 blocks × 16 tokens × 1 × 8 fp16 (2 KiB each), real shared
 * memory, mapped by a native layer of its own (the worker's side), so the server's `usage()` sees only its own.
 */
const cacheOf = (layers: number) =>
  makePagedKvCache({
    backing: "cpu_shm",
    namePrefix: `mpcache-test-budget-${randomUUID()}`,
    numLayers: layers,
    numBlocks: 4,
    blockSizeTokens: 16,
    numHeads: 1,
    headSize: 8,
    dtype: "float16"
  }).pipe(Effect.provide(Layer.fresh(NativeMemoryLive)))
const LAYER_BYTES = 2 * 4 * 16 * 8 * 2

/** `count` descriptors, each its own (absent) segment; `read` counts the descriptors the server looked at. */
const distinctSegments = (count: number, read: { n: number }): Array<TensorDescriptor> =>
  Array.from({ length: count }, (_, i) => {
    const d = {
      kind: "cpu_shm" as const,
      shm_name: `mpcache-test-absent-${i}`,
      device_uuid: "cpu",
      dtype: "float16" as const,
      shape: [2, 1, 1, 1], // not the KV layout's 5 dimensions: refused by validation, which the budget comes before
      stride: [1, 1, 1, 1],
      storage_offset: 0,
      nbytes: 0
    }
    Object.defineProperty(d, "nbytes", {
      enumerable: true,
      get: () => {
        read.n++
        return 4096
      }
    })
    return d
  })

const overloaded = (e: unknown) => {
  assert.instanceOf(e, Overloaded)
  const o = e as Overloaded
  return { field: o.field, expected: o.expected, actual: o.actual, message: o.message }
}

describe("--max-segments-per-register", () => {
  it.effect("a REGISTER naming more distinct segments is overloaded before anything is mapped or validated; the walk stops past the limit", () =>
    Effect.gen(function*() {
      const transfer = yield* LmcacheDrivenTransfer
      const native = yield* NativeMemory
      const read = { n: 0 }
      const refused = yield* Effect.flip(transfer.register(id(1), distinctSegments(100_000, read), "m", 1, "vllm"))
      assert.deepStrictEqual(overloaded(refused), {
        field: "max-segments-per-register",
        expected: "at most 4 distinct segments per registration",
        actual: "more than 4 (100000 descriptors)",
        message:
          "register_kv_cache: instance 1: kv_caches names more than 4 distinct segments, over --max-segments-per-register (4); nothing was mapped: let layers share segments (one segment with offsets, DESIGN §3.2) or raise the limit"
      })
      assert.strictEqual(read.n, 5, "the walk looked at 5 descriptors of 100,000")
      assert.deepStrictEqual(native.usage(), { mappings: 0, hostBytes: 0, deviceBytes: 0 })
      assert.isFalse(yield* transfer.isRegistered(id(1)))
      // At the limit it gets past the budget, and only then is it validated (the shape) and mapped.
      const atLimit = yield* Effect.flip(transfer.register(id(1), distinctSegments(4, { n: 0 }), "m", 1, "vllm"))
      assert.instanceOf(atLimit, InvalidArgument)
      assert.include(atLimit.message, "kv_caches[0].shape: expected [2, num_blocks, block_size, num_heads, head_size]")
    }).pipe(Effect.scoped, Effect.provide(livenessEnv({ maxSegmentsPerRegister: 4 }))))

  it.effect("layers sharing one segment count once", () =>
    Effect.gen(function*() {
      const transfer = yield* LmcacheDrivenTransfer
      const cache = yield* cacheOf(2)
      // Four descriptors viewing the two segments: two to map.
      const shared = [...cache.descriptors, ...cache.descriptors]
      yield* transfer.register(id(1), shared, "m", 1, "vllm")
      assert.deepStrictEqual((yield* NativeMemory).usage(), { mappings: 2, hostBytes: 2 * LAYER_BYTES, deviceBytes: 0 })
    }).pipe(Effect.scoped, Effect.provide(livenessEnv({ maxSegmentsPerRegister: 2 }))))
})

describe("--max-mappings and --max-mapped-bytes: over every instance, as the native layer holds them", () => {
  it.effect("a REGISTER that would pass --max-mappings is overloaded, nothing mapped; an UNREGISTER makes room; a refresh of a held id is never refused", () =>
    Effect.gen(function*() {
      const transfer = yield* LmcacheDrivenTransfer
      const native = yield* NativeMemory
      const a = yield* cacheOf(2)
      const b = yield* cacheOf(2)
      yield* transfer.register(id(1), a.descriptors, "m", 1, "vllm")
      const refused = yield* Effect.flip(transfer.register(id(2), b.descriptors, "m", 1, "vllm"))
      assert.deepStrictEqual(overloaded(refused), {
        field: "max-mappings",
        expected: "at most 3 mappings of worker memory",
        actual: "2 held + 2 asked",
        message:
          "register_kv_cache: instance 2: mapping its 2 segment(s) would make 4 mappings of worker memory, over --max-mappings (3; 2 held now); nothing was mapped: retry once other instances unregister, or raise the limit"
      })
      assert.deepStrictEqual(native.usage(), { mappings: 2, hostBytes: 2 * LAYER_BYTES, deviceBytes: 0 })
      assert.isFalse(yield* transfer.isRegistered(id(2)))
      // Instance 1 again, the same memory: a refresh, nothing mapped, not refused.
      yield* transfer.register(id(1), a.descriptors, "m", 1, "vllm")
      yield* transfer.unregister(id(1))
      assert.deepStrictEqual(native.usage(), { mappings: 0, hostBytes: 0, deviceBytes: 0 })
      yield* transfer.register(id(2), b.descriptors, "m", 1, "vllm")
      assert.deepStrictEqual(native.usage(), { mappings: 2, hostBytes: 2 * LAYER_BYTES, deviceBytes: 0 })
    }).pipe(Effect.scoped, Effect.provide(livenessEnv({ maxMappings: 3 }))))

  it.effect("host bytes over --max-mapped-bytes are overloaded; the server's own L1 pool is not counted", () =>
    Effect.gen(function*() {
      const transfer = yield* LmcacheDrivenTransfer
      const a = yield* cacheOf(2)
      const b = yield* cacheOf(1)
      // The L1 pool (0.25 GiB here) is mapped, and counts for nothing.
      assert.deepStrictEqual((yield* NativeMemory).usage(), { mappings: 0, hostBytes: 0, deviceBytes: 0 })
      yield* transfer.register(id(1), a.descriptors, "m", 1, "vllm")
      const refused = yield* Effect.flip(transfer.register(id(2), b.descriptors, "m", 1, "vllm"))
      assert.deepStrictEqual(overloaded(refused), {
        field: "max-mapped-bytes",
        expected: `at most ${2 * LAYER_BYTES + 1} bytes of worker host memory mapped`,
        actual: `${2 * LAYER_BYTES} held + ${LAYER_BYTES} asked`,
        message: `register_kv_cache: instance 2: its host memory is ${LAYER_BYTES} bytes; with the ${2 * LAYER_BYTES} bytes of worker memory mapped now that is over --max-mapped-bytes (${
          2 * LAYER_BYTES + 1
        }); nothing was mapped: retry once other instances unregister, or raise the limit`
      })
      const status = (yield* (yield* MappingBudget).module.status!())["mapping_limits"] as Record<string, unknown>
      assert.deepStrictEqual({ ...status, process_maps: typeof status["process_maps"] }, {
        kernel_max_map_count: Number(readFileSync("/proc/sys/vm/max_map_count", "utf8")),
        kernel_max_map_count_source: "kernel",
        process_maps: "number",
        max_mappings: 8,
        mappings: 2,
        max_segments_per_register: 8,
        max_mapped_bytes: 2 * LAYER_BYTES + 1,
        host_mapped_bytes: 2 * LAYER_BYTES,
        device_mapped_bytes: 0,
        refused: { max_segments_per_register: 0, max_mappings: 0, max_mapped_bytes: 1 }
      })
      assert.isAbove(status["process_maps"] as number, 100)
    }).pipe(Effect.scoped, Effect.provide(livenessEnv({ maxMappings: 8, maxMappedBytes: 2 * LAYER_BYTES + 1, l1SizeGb: 0.25 }))))
})

describe("REGISTER touches no page of the worker's memory (issue 24 item 12)", () => {
  // 2 layers × (K, V) × 16 blocks of 16 tokens × 8 heads × 256 fp16: each block of K or V is 64 KiB, so pages are whole.
  const BLOCK = 16 * 8 * 256 * 2
  const key = (requestId: string): CacheKey => ({
    model_name: "m",
    world_size: 1,
    worker_id: 0,
    token_ids: Array.from({ length: 32 }, (_, i) => i + 1),
    start: 0,
    end: 32,
    request_id: requestId,
    cache_salt: ""
  })
  /** Bytes the file system has allocated to /dev/shm/`name` (st_blocks × 512). */
  const allocated = (name: string) => statSync(`/dev/shm/${name}`).blocks * 512

  it.effect("a sparse segment: 0 bytes allocated after REGISTER; after a STORE and a RETRIEVE exactly the blocks they copied", () =>
    Effect.gen(function*() {
      const transfer = yield* LmcacheDrivenTransfer
      const lookup = yield* Lookup
      const native = yield* NativeMemory
      const name = `mpcache-test-sparse-${randomUUID()}`
      const layerBytes = 2 * 16 * BLOCK
      // Only ftruncated: what the worker "allocated" is a size, no page.
      for (const l of [0, 1]) {
        yield* Effect.acquireRelease(native.createSegment(`${name}-L${l}`, layerBytes), () => Effect.ignore(native.unlinkSegment(`${name}-L${l}`)))
      }
      const descriptors: Array<TensorDescriptor> = [0, 1].map((l) => ({
        kind: "cpu_shm",
        shm_name: `${name}-L${l}`,
        device_uuid: "cpu",
        nbytes: layerBytes,
        dtype: "float16",
        shape: [2, 16, 16, 8, 256],
        stride: [16 * 16 * 8 * 256, 16 * 8 * 256, 8 * 256, 256, 1],
        storage_offset: 0
      }))
      yield* transfer.register(id(1), descriptors, "m", 1, "vllm")
      assert.deepStrictEqual([allocated(`${name}-L0`), allocated(`${name}-L1`)], [0, 0])
      // STORE of blocks 3 and 7 (one chunk of 32 tokens): their K and V in each layer, 4 × 64 KiB per segment.
      assert.isTrue(yield* transfer.store(key("s"), id(1), [[3, 7]]))
      assert.deepStrictEqual([allocated(`${name}-L0`), allocated(`${name}-L1`)], [4 * BLOCK, 4 * BLOCK])
      // RETRIEVE into blocks 10 and 11: 4 × 64 KiB more per segment; nothing else.
      yield* lookup.lookup(key("r"))
      assert.strictEqual(yield* lookup.queryPrefetchStatus("r"), 1)
      assert.isTrue(yield* transfer.retrieve(key("r"), id(1), [[10, 11]], 0))
      assert.deepStrictEqual([allocated(`${name}-L0`), allocated(`${name}-L1`)], [8 * BLOCK, 8 * BLOCK])
    }).pipe(Effect.scoped, Effect.provide(livenessEnv({ l1SizeGb: 0.25 }))))
})

describe("the budget alone (MappingBudget.layerTest: the native layer's counters given by the test)", () => {
  it.effect("admit at exactly --max-mappings and --max-mapped-bytes passes; one more of either is refused naming its flag, and counted in status", () => {
    let held = { mappings: 6, hostBytes: 1_000, deviceBytes: 0 }
    return Effect.gen(function*() {
      const budget = yield* MappingBudget
      yield* budget.admit("register_kv_cache", id(1), { segments: 2, hostBytes: 24, deviceBytes: 0 })
      const mappings = yield* Effect.flip(budget.admit("register_kv_cache", id(1), { segments: 3, hostBytes: 0, deviceBytes: 0 }))
      assert.strictEqual(mappings.field, "max-mappings")
      assert.strictEqual(mappings.actual, "6 held + 3 asked")
      held = { mappings: 0, hostBytes: 1_000, deviceBytes: 0 }
      const bytes = yield* Effect.flip(budget.admit("register_kv_cache", id(2), { segments: 1, hostBytes: 25, deviceBytes: 0 }))
      assert.deepStrictEqual(overloaded(bytes), {
        field: "max-mapped-bytes",
        expected: "at most 1024 bytes of worker host memory mapped",
        actual: "1000 held + 25 asked",
        message:
          "register_kv_cache: instance 2: its host memory is 25 bytes; with the 1000 bytes of worker memory mapped now that is over --max-mapped-bytes (1024); nothing was mapped: retry once other instances unregister, or raise the limit"
      })
      const status = (yield* budget.module.status!())["mapping_limits"] as Record<string, unknown>
      assert.deepStrictEqual(
        [status["max_mappings"], status["mappings"], status["max_mapped_bytes"], status["host_mapped_bytes"], status["refused"]],
        [8, 0, 1024, 1_000, { max_segments_per_register: 0, max_mappings: 1, max_mapped_bytes: 1 }]
      )
    }).pipe(Effect.provide(MappingBudget.layerTest({ maxMappings: 8, maxMappedBytes: 1024 }, () => held)))
  })
})
