/**
 * Worker memory of the LMCache-driven transfer module
 * (src/services/server/internal/WorkerMemory.ts): a validated KV cache's
 * segments mapped into the entry's Scope (each once) with the model's
 * layout reference, both released when it closes; a transfer's block ids
 * checked against the registered blocks (fail closed); a chunk's copy parts
 * one per segment over the mapped segments; passed descriptors refused
 * without a descriptor socket.
 */
import { assert, describe, it } from "@effect/vitest"
import { Context, Effect, Exit, Layer, Scope } from "effect"
import { NativeMemoryLive } from "../../../src/layers/NativeMemory.ts"
import { NativeMemory } from "../../../src/native/Native.ts"
import { makeInstanceId } from "../../../src/schema/InstanceId.ts"
import type { TensorDescriptor } from "../../../src/schema/TensorDescriptor.ts"
import { InvalidArgument } from "../../../src/schema/WireError.ts"
import { validateKvCaches } from "../../../src/services/kv/KvCacheLayout.ts"
import { chunkRanges } from "../../../src/services/server/internal/CopyPlan.ts"
import { kvLayoutOf, makeWorkerMemory } from "../../../src/services/server/internal/WorkerMemory.ts"
import { LayoutRegistry } from "../../../src/services/server/LayoutRegistry.ts"
import type { ContextEntry } from "../../../src/services/server/LmcacheDrivenTransfer.ts"
import { workerCache } from "../../support/LivenessEnv.ts"

const CHUNK = 32
const ID = makeInstanceId(5n)

const env = Layer.mergeAll(NativeMemoryLive, LayoutRegistry.layer)

describe("mapContext", () => {
  it.live("maps each segment once into the entry's scope with the layout reference; closing the scope releases both", () =>
    Effect.gen(function*() {
      const ctx = yield* Effect.context<NativeMemory | LayoutRegistry>()
      const native = Context.get(ctx, NativeMemory)
      const layouts = Context.get(ctx, LayoutRegistry)
      const memory = makeWorkerMemory({ native, layouts, fdExchange: undefined, chunk: CHUNK })
      const cache = yield* workerCache
      const validated = validateKvCaches(cache.descriptors, CHUNK)
      if ("error" in validated) return assert.fail(validated.error)
      const scope = yield* Scope.make()
      const mappings = yield* memory.mapContext(scope, ID, cache.descriptors, validated, new Map(), "m", 1)
      assert.deepStrictEqual([...mappings.keys()], [...validated.segments.keys()])
      assert.deepStrictEqual(yield* layouts.get("m", 1), kvLayoutOf(validated.geometry, CHUNK))
      const entry: ContextEntry = {
        modelName: "m",
        worldSize: 1,
        engineType: "vllm",
        descriptors: cache.descriptors,
        geometry: validated.geometry,
        layers: validated.layers,
        mappings,
        memfd: undefined,
        memoryIdentities: memory.memoryIdentities(cache.descriptors, new Map()),
        scope
      }
      assert.deepStrictEqual(entry.memoryIdentities, cache.descriptors.map(() => ""))
      // One part per segment, over the mapping of that segment, with the copy plan's ranges.
      const parts = memory.copyParts(entry, [3, 1], 16)
      const expected = chunkRanges(validated.geometry, validated.layers, CHUNK, [3, 1], 16)
      assert.strictEqual(parts.length, expected.length)
      assert.deepStrictEqual(parts.map((p) => p.mapping), [...mappings.values()])
      assert.deepStrictEqual(parts.map((p) => [...p.ranges]), expected.map((r) => [...r]))
      yield* Scope.close(scope, Exit.void)
      assert.deepStrictEqual([...mappings.values()].map((m) => [m.isClosed(), m.releases()]), [...mappings.values()].map(() => [true, 1]))
      assert.isUndefined(yield* layouts.get("m", 1))
    }).pipe(Effect.scoped, Effect.provide(env)))
})

describe("blocksFor", () => {
  const memory = makeWorkerMemory({
    native: undefined as never,
    layouts: undefined as never,
    fdExchange: undefined,
    chunk: CHUNK
  })
  const entry = { geometry: { blockSizeTokens: 16, numBlocks: 8 } } as ContextEntry

  it("2 chunks of 2 blocks need 4 ids, each below the registered blocks", () => {
    assert.deepStrictEqual(memory.blocksFor(entry, [[1, 2, 3, 4, 5]], 2), { perChunk: 2, list: [1, 2, 3, 4, 5] })
    assert.deepStrictEqual(memory.blocksFor(entry, [[1, 2, 3]], 2), { error: "block_ids[0] has 3 ids; 2 chunk(s) of 2 blocks need 4" })
    assert.deepStrictEqual(memory.blocksFor(entry, [], 1), { error: "block_ids[0] has 0 ids; 1 chunk(s) of 2 blocks need 2" })
    assert.deepStrictEqual(memory.blocksFor(entry, [[1, 8, 9]], 1), { error: "block_ids[0][1] = 8 is outside the registered 8 blocks" })
  })
})

describe("claimTokens", () => {
  it.effect("a passed descriptor on a server without a descriptor socket: invalid_argument naming its fd_token", () =>
    Effect.gen(function*() {
      const memory = makeWorkerMemory({ native: undefined as never, layouts: undefined as never, fdExchange: undefined, chunk: CHUNK })
      const shm: TensorDescriptor = { kind: "cpu_shm", shm_name: "a", device_uuid: "cpu", nbytes: 64, dtype: "float16", shape: [2, 1, 16, 1], stride: [16, 16, 1, 1], storage_offset: 0 }
      const { shm_name: _, ...common } = shm
      const passed: TensorDescriptor = { ...common, kind: "cpu_memfd", fd_token: new Uint8Array(16), fd_index: 0 }
      assert.strictEqual((yield* memory.claimTokens("peer", ID, [shm])).size, 0)
      const e = yield* Effect.flip(memory.claimTokens("peer", ID, [shm, passed]))
      assert.instanceOf(e, InvalidArgument)
      assert.strictEqual(e.field, "kv_caches[1].fd_token")
      assert.strictEqual(e.message, "register_kv_cache: kv_caches[1].fd_token names passed descriptors, but this server has no descriptor socket")
    }).pipe(Effect.scoped))
})

describe("kvLayoutOf", () => {
  it("a chunk object is [2, num_layers, chunk, hidden] of the element size", () => {
    const g = { numLayers: 3, hiddenDim: 16, elementBytes: 2, dtype: "float16" } as Parameters<typeof kvLayoutOf>[0]
    assert.deepStrictEqual(kvLayoutOf(g, 64), { numLayers: 3, hiddenDim: 16, elementBytes: 2, dtype: "float16", chunkBytes: 2 * 3 * 64 * 16 * 2 })
  })
})
