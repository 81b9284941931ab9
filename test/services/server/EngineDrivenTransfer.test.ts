/**
 * The engine-driven transfer module (DESIGN §4 "Engine-driven", §5;
 * reference §4) without sockets: registration and its validation, the
 * PREPARE/COMMIT rows of both transports with a real shared-memory pool
 * (the "worker" maps it and copies like a worker would), the failure rows,
 * and what releasing an entry does to its pending writes and reads.
 */
import { assert, describe, it } from "@effect/vitest"
import { Context, Effect, Exit, Layer, Scope } from "effect"
import { TestClock } from "effect/testing"
import { NativeMemoryLive } from "../../../src/layers/NativeMemory.ts"
import { ServerConfig, type ServerConfigInput } from "../../../src/services/server/ServerConfig.ts"
import { NativeMemory } from "../../../src/native/Native.ts"
import type { CacheKey } from "../../../src/schema/CacheKey.ts"
import type { RegisterEngineDrivenContext } from "../../../src/schema/EngineDriven.ts"
import { makeInstanceId } from "../../../src/schema/InstanceId.ts"
import { InvalidArgument, NotRegistered } from "../../../src/schema/WireError.ts"
import { EngineDrivenTransfer } from "../../../src/services/server/EngineDrivenTransfer.ts"
import { L1Store } from "../../../src/services/server/L1Store.ts"
import { LayoutRegistry } from "../../../src/services/server/LayoutRegistry.ts"
import { Lookup } from "../../../src/services/server/Lookup.ts"
import { atEveryStep, faultyL1, makeFaultSteps } from "../../support/FaultSteps.ts"

const CHUNK = 32
/** [2, 2 layers, 32 tokens, 8] float16. */
const CHUNK_BYTES = 2 * 2 * CHUNK * 8 * 2
const tokens = Array.from({ length: 200 }, (_, i) => (i * 13 + 5) % 7000)

const id = (n: number) => makeInstanceId(BigInt(n))

const registration = (n: number, over: Partial<RegisterEngineDrivenContext> = {}): RegisterEngineDrivenContext => ({
  instance_id: id(n),
  model_name: "ed",
  world_size: 1,
  block_size: 16,
  num_layers: 2,
  hidden_dim_size: 8,
  dtype_str: "float16",
  use_mla: false,
  ...over
})

const key = (over: Partial<CacheKey> = {}): CacheKey => ({
  model_name: "ed",
  world_size: 1,
  worker_id: 0,
  token_ids: tokens,
  start: 0,
  end: 128,
  request_id: "r1",
  cache_salt: "",
  ...over
})

const modules = EngineDrivenTransfer.layer.pipe(
  Layer.provideMerge(Lookup.layer),
  Layer.provideMerge(Layer.mergeAll(L1Store.layer, LayoutRegistry.layer).pipe(Layer.provideMerge(NativeMemoryLive)))
)

/** The module over a real 32-object L1 pool. */
const env = (config: Partial<ServerConfigInput> = {}) =>
  EngineDrivenTransfer.layerTest({ chunkSize: CHUNK, l1SizeGb: (32 * CHUNK_BYTES) / 2 ** 30, ...config }).pipe(Layer.provideMerge(NativeMemoryLive))

/** Chunk c's bytes as a worker would compute them. */
const chunkContent = (seed: number, c: number) => {
  const out = new Uint8Array(CHUNK_BYTES)
  let x = (seed * 2654435761 + c * 40503) >>> 0
  for (let i = 0; i < out.length; i++) {
    x = (x * 1103515245 + 12345) >>> 0
    out[i] = x >>> 24
  }
  return out
}

/** A worker's mapping of the server's pool (shm transport). */
const workerView = Effect.gen(function*() {
  const l1 = yield* L1Store
  const native = yield* NativeMemory
  return yield* native.map(l1.pool!.shmName, l1.pool!.sizeBytes)
})

/** PREPARE_STORE, the worker's copy into the slots, COMMIT_STORE (shm). */
const storeShm = (n: number, k: CacheKey, seed: number) =>
  Effect.gen(function*() {
    const ed = yield* EngineDrivenTransfer
    const native = yield* NativeMemory
    const view = yield* workerView
    const prepared = yield* ed.prepareStore(k, id(n))
    const first = k.start / CHUNK
    yield* Effect.forEach(prepared.context.slots, (s, j) =>
      native.scatter(view, Float64Array.of(s.offset, 0, s.length), chunkContent(seed, first + prepared.context.chunk_indices[j]!)))
    return { prepared, committed: yield* ed.commitStore(k, id(n), new Uint8Array(0)) }
  })

/** LOOKUP through the lookup module; the hit chunk count. */
const lookupHits = (k: CacheKey) =>
  Effect.gen(function*() {
    const lookup = yield* Lookup
    yield* lookup.lookup({ ...k, worker_id: null })
    return yield* lookup.queryPrefetchStatus(k.request_id)
  })

describe("registration", () => {
  it.effect("answers the L1 pool, registers the layout, and is tracked as engine_driven", () =>
    Effect.gen(function*() {
      const ed = yield* EngineDrivenTransfer
      const l1 = yield* L1Store
      const answer = yield* ed.register(registration(1))
      assert.deepStrictEqual(answer, { shm_name: l1.pool!.shmName, pool_size: l1.pool!.sizeBytes })
      assert.deepStrictEqual(yield* (yield* LayoutRegistry).get("ed", 1), {
        numLayers: 2,
        hiddenDim: 8,
        elementBytes: 2,
        dtype: "float16",
        chunkBytes: CHUNK_BYTES
      })
      const [instance] = yield* ed.target.instances()
      assert.strictEqual(instance?.kind, "engine_driven")
      assert.strictEqual(instance?.instance_id, "1")
      assert.deepStrictEqual(instance?.details["layout"], {
        num_layers: 2,
        hidden_dim_size: 8,
        block_size: 16,
        dtype: "float16",
        use_mla: false,
        object_shape: [2, 2, CHUNK, 8],
        chunk_bytes: CHUNK_BYTES
      })
      assert.isTrue(yield* ed.target.holdsInstance(id(1)))
      assert.isFalse(yield* ed.target.holdsInstance(id(2)))
    }).pipe(Effect.provide(env())))

  it.effect("with --engine-driven-transport inline it answers shm_name \"\" and pool_size 0", () =>
    Effect.gen(function*() {
      const ed = yield* EngineDrivenTransfer
      assert.deepStrictEqual(yield* ed.register(registration(1)), { shm_name: "", pool_size: 0 })
      assert.strictEqual(ed.transport, "inline")
    }).pipe(Effect.provide(env({ engineDrivenTransport: "inline" }))))

  it.effect("each bad field is an invalid_argument naming it, and nothing is registered", () =>
    Effect.gen(function*() {
      const ed = yield* EngineDrivenTransfer
      const fail = (over: Partial<RegisterEngineDrivenContext>) => Effect.map(Effect.flip(ed.register(registration(1, over))), (e) => e.message)
      assert.strictEqual(
        yield* fail({ block_size: 48 }),
        "register_kv_cache_engine_driven_context: block_size: 48 tokens must divide the server's chunk size (32 tokens)"
      )
      assert.strictEqual(yield* fail({ num_layers: 0 }), "register_kv_cache_engine_driven_context: num_layers: must be an integer ≥ 1, got 0")
      assert.strictEqual(yield* fail({ hidden_dim_size: 1.5 }), "register_kv_cache_engine_driven_context: hidden_dim_size: must be an integer ≥ 1, got 1.5")
      assert.strictEqual(
        yield* fail({ hidden_dim_size: 4096 }),
        `register_kv_cache_engine_driven_context: num_layers, hidden_dim_size: one chunk object [2, 2, 32, 4096] of float16 takes ${2 * 2 * 32 * 4096 * 2} bytes, more than the L1 capacity (${32 * CHUNK_BYTES} bytes)`
      )
      assert.strictEqual(yield* ed.target.trackedInstanceCount(), 0)
      assert.isUndefined(yield* (yield* LayoutRegistry).get("ed", 1))
      assert.instanceOf(yield* Effect.flip(ed.register(registration(1, { block_size: 0 }))), InvalidArgument)
    }).pipe(Effect.provide(env())))

  it.effect("use_mla: the object is [num_layers, chunk, hidden]", () =>
    Effect.gen(function*() {
      const ed = yield* EngineDrivenTransfer
      yield* ed.register(registration(1, { use_mla: true }))
      const prepared = yield* ed.prepareStore(key({ end: 64 }), id(1))
      assert.deepStrictEqual(prepared.context.slots.map((s) => [s.length, s.shape, s.dtype]), [
        [CHUNK_BYTES / 2, [2, CHUNK, 8], "float16"],
        [CHUNK_BYTES / 2, [2, CHUNK, 8], "float16"]
      ])
      assert.strictEqual((yield* (yield* LayoutRegistry).get("ed", 1))?.chunkBytes, CHUNK_BYTES / 2)
    }).pipe(Effect.provide(env())))

  it.effect("the same payload again only refreshes last_seen; a different payload under the id is refused", () =>
    Effect.gen(function*() {
      const ed = yield* EngineDrivenTransfer
      yield* ed.register(registration(1))
      const before = yield* ed.contextOf(id(1))
      yield* TestClock.adjust("5 seconds")
      yield* ed.register(registration(1))
      assert.strictEqual(yield* ed.contextOf(id(1)), before)
      assert.strictEqual((yield* ed.target.instances())[0]?.last_seen_age_seconds, 0)
      const error = yield* Effect.flip(ed.register(registration(1, { num_layers: 3 })))
      assert.instanceOf(error, InvalidArgument)
      assert.include(error.message, "instance 1 is already registered with a different context")
      assert.strictEqual(yield* ed.contextOf(id(1)), before)
    }).pipe(Effect.provide(env())))

  it.effect("a model already registered with another layout is refused; the layout is refcounted across instances", () =>
    Effect.gen(function*() {
      const ed = yield* EngineDrivenTransfer
      const layouts = yield* LayoutRegistry
      yield* ed.register(registration(1))
      const error = yield* Effect.flip(ed.register(registration(2, { dtype_str: "float32" })))
      assert.instanceOf(error, InvalidArgument)
      assert.include(error.message, "num_layers, hidden_dim_size, dtype_str, use_mla: model ed (world size 1) is registered with 2 layers × 8 of 2-byte elements")
      yield* ed.register(registration(2))
      yield* ed.unregister(id(1))
      assert.isDefined(yield* layouts.get("ed", 1))
      yield* ed.unregister(id(2))
      assert.isUndefined(yield* layouts.get("ed", 1))
      yield* ed.unregister(id(2)) // unknown: a WARNING, no failure
    }).pipe(Effect.provide(env())))
})

describe("shared-memory slots", () => {
  it.effect("PREPARE_STORE hands out one slot per chunk; the worker copies; COMMIT_STORE publishes; PREPARE_RETRIEVE hands the same bytes back under read locks", () =>
    Effect.gen(function*() {
      const ed = yield* EngineDrivenTransfer
      const native = yield* NativeMemory
      const l1 = yield* L1Store
      yield* ed.register(registration(1))
      yield* ed.register(registration(2))
      const { prepared, committed } = yield* storeShm(1, key(), 7)
      assert.deepStrictEqual(prepared.context.chunk_indices, [0, 1, 2, 3])
      assert.deepStrictEqual(prepared.context.slots.map((s) => [s.length, s.shape, s.dtype]), Array(4).fill([CHUNK_BYTES, [2, 2, CHUNK, 8], "float16"]))
      assert.strictEqual(new Set(prepared.context.slots.map((s) => s.offset)).size, 4)
      assert.isTrue(committed)
      assert.deepStrictEqual([l1.stats().objects, l1.stats().reservedObjects], [4, 0])
      assert.strictEqual(yield* lookupHits(key()), 4)
      const r = yield* ed.prepareRetrieve(key(), id(2))
      assert.isTrue(r.success)
      assert.strictEqual(r.data.length, 0)
      assert.deepStrictEqual(r.context.chunk_indices, [0, 1, 2, 3])
      const view = yield* workerView
      for (const [j, s] of (r.context.slots ?? []).entries()) {
        const got = new Uint8Array(s.length)
        yield* native.gather(view, Float64Array.of(s.offset, 0, s.length), got)
        assert.deepStrictEqual(got, chunkContent(7, j))
      }
      assert.strictEqual(l1.stats().lockedObjects, 4)
      assert.isTrue(yield* ed.commitRetrieve(key(), id(2)))
      assert.strictEqual(l1.stats().lockedObjects, 0)
      assert.isFalse(yield* ed.commitRetrieve(key(), id(2)))
    }).pipe(Effect.scoped, Effect.provide(env())))

  it.effect("cached chunks get no slot: empty slots mean everything is cached; chunk_indices name the missing ones", () =>
    Effect.gen(function*() {
      const ed = yield* EngineDrivenTransfer
      yield* ed.register(registration(1))
      yield* storeShm(1, key({ end: 64 }), 3)
      const again = yield* ed.prepareStore(key({ end: 64, request_id: "r2" }), id(1))
      assert.deepStrictEqual(again.context, { slots: [], chunk_indices: [] })
      const more = yield* ed.prepareStore(key({ end: 160, request_id: "r3" }), id(1))
      assert.deepStrictEqual(more.context.chunk_indices, [2, 3, 4])
      const tail = yield* ed.prepareStore(key({ start: 64, end: 128, request_id: "r4" }), id(1))
      // Chunks 2 and 3 are being written by r3: nobody else reserves them.
      assert.deepStrictEqual(tail.context.chunk_indices, [])
    }).pipe(Effect.scoped, Effect.provide(env())))

  it.effect("COMMIT_STORE without a pending PREPARE_STORE answers false; a second commit too", () =>
    Effect.gen(function*() {
      const ed = yield* EngineDrivenTransfer
      yield* ed.register(registration(1))
      assert.isFalse(yield* ed.commitStore(key(), id(1), new Uint8Array(0)))
      const { committed } = yield* storeShm(1, key(), 1)
      assert.isTrue(committed)
      assert.isFalse(yield* ed.commitStore(key(), id(1), new Uint8Array(0)))
    }).pipe(Effect.scoped, Effect.provide(env())))

  it.effect("a PREPARE_RETRIEVE with a chunk not in L1 answers success false with nothing locked", () =>
    Effect.gen(function*() {
      const ed = yield* EngineDrivenTransfer
      const l1 = yield* L1Store
      yield* ed.register(registration(1))
      yield* storeShm(1, key({ end: 64 }), 1)
      const r = yield* ed.prepareRetrieve(key(), id(1))
      assert.deepStrictEqual(r, { success: false, data: new Uint8Array(0), context: {} })
      assert.strictEqual(l1.stats().lockedObjects, 0)
      assert.isFalse(yield* ed.commitRetrieve(key(), id(1)))
    }).pipe(Effect.scoped, Effect.provide(env())))

  it.effect("PREPARE_RETRIEVE takes the read locks LOOKUP's prefetch holds; COMMIT_RETRIEVE releases them", () =>
    Effect.gen(function*() {
      const ed = yield* EngineDrivenTransfer
      const l1 = yield* L1Store
      const lookup = yield* Lookup
      yield* ed.register(registration(1))
      yield* storeShm(1, key(), 2)
      assert.strictEqual(yield* lookupHits(key({ request_id: "s" })), 4)
      assert.strictEqual(lookup.stats().heldLocks, 4)
      yield* ed.prepareRetrieve(key({ request_id: "s" }), id(1))
      assert.strictEqual(lookup.stats().heldLocks, 0)
      assert.strictEqual(l1.stats().lockedObjects, 4)
      yield* ed.commitRetrieve(key({ request_id: "s" }), id(1))
      assert.strictEqual(l1.stats().lockedObjects, 0)
    }).pipe(Effect.scoped, Effect.provide(env())))

  it.effect("inline bytes also work on an shm server; cpu_data of the wrong length publishes nothing and frees the reservations", () =>
    Effect.gen(function*() {
      const ed = yield* EngineDrivenTransfer
      const l1 = yield* L1Store
      yield* ed.register(registration(1))
      yield* ed.prepareStore(key({ end: 64 }), id(1))
      assert.isFalse(yield* ed.commitStore(key({ end: 64 }), id(1), new Uint8Array(CHUNK_BYTES)))
      assert.deepStrictEqual([l1.stats().objects, l1.stats().usedBytes], [0, 0])
      yield* ed.prepareStore(key({ end: 64 }), id(1))
      const data = Buffer.concat([chunkContent(9, 0), chunkContent(9, 1)])
      assert.isTrue(yield* ed.commitStore(key({ end: 64 }), id(1), data))
      const r = yield* ed.prepareRetrieve(key({ end: 64 }), id(1))
      const view = yield* workerView
      const got = new Uint8Array(CHUNK_BYTES)
      yield* (yield* NativeMemory).gather(view, Float64Array.of(r.context.slots![1]!.offset, 0, CHUNK_BYTES), got)
      assert.deepStrictEqual(got, chunkContent(9, 1))
    }).pipe(Effect.scoped, Effect.provide(env())))
})

describe("inline transport", () => {
  it.effect("COMMIT_STORE carries the reserved chunks concatenated; PREPARE_RETRIEVE answers them in data with nothing left locked", () =>
    Effect.gen(function*() {
      const ed = yield* EngineDrivenTransfer
      const l1 = yield* L1Store
      yield* ed.register(registration(1))
      yield* ed.register(registration(2))
      yield* ed.prepareStore(key({ end: 64 }), id(1))
      assert.isTrue(yield* ed.commitStore(key({ end: 64 }), id(1), Buffer.concat([chunkContent(4, 0), chunkContent(4, 1)])))
      const prepared = yield* ed.prepareStore(key(), id(1))
      assert.deepStrictEqual(prepared.context.chunk_indices, [2, 3])
      // Empty cpu_data: the inline transport has no other way to get the bytes.
      assert.isFalse(yield* ed.commitStore(key(), id(1), new Uint8Array(0)))
      assert.deepStrictEqual([l1.stats().objects, l1.stats().reservedObjects], [2, 0])
      yield* ed.prepareStore(key(), id(1))
      assert.isTrue(yield* ed.commitStore(key(), id(1), Buffer.concat([chunkContent(4, 2), chunkContent(4, 3)])))
      const r = yield* ed.prepareRetrieve(key(), id(2))
      assert.isTrue(r.success)
      assert.deepStrictEqual(r.context, { slots: [], chunk_indices: [0, 1, 2, 3] })
      assert.deepStrictEqual(new Uint8Array(r.data), new Uint8Array(Buffer.concat([0, 1, 2, 3].map((c) => chunkContent(4, c)))))
      assert.strictEqual(l1.stats().lockedObjects, 0)
      assert.isTrue(yield* ed.commitRetrieve(key(), id(2)))
    }).pipe(Effect.provide(env({ engineDrivenTransport: "inline" }))))
})

describe("failure rows", () => {
  it.effect("every transfer for an id the server does not hold is not_registered", () =>
    Effect.gen(function*() {
      const ed = yield* EngineDrivenTransfer
      const errors = yield* Effect.all([
        Effect.flip(ed.prepareStore(key(), id(5))),
        Effect.flip(ed.commitStore(key(), id(5), new Uint8Array(0))),
        Effect.flip(ed.prepareRetrieve(key(), id(5))),
        Effect.flip(ed.commitRetrieve(key(), id(5)))
      ])
      assert.isTrue(errors.every((e) => e instanceof NotRegistered))
      assert.strictEqual(errors[0]!.message, "prepare_store: instance 5 has no engine-driven context (never registered, unregistered or reaped); register it again")
    }).pipe(Effect.provide(env())))

  it.effect("a key that does not fit the context fails closed with invalid_argument naming the field, nothing reserved", () =>
    Effect.gen(function*() {
      const ed = yield* EngineDrivenTransfer
      const l1 = yield* L1Store
      yield* ed.register(registration(1))
      const message = (k: CacheKey) => Effect.map(Effect.flip(ed.prepareStore(k, id(1))), (e) => e.message)
      assert.strictEqual(yield* message(key({ worker_id: null })), "prepare_store: key.worker_id is nil; a prepare_store names the kv rank it moves")
      assert.strictEqual(yield* message(key({ start: 16 })), "prepare_store: key.start (16) must be a multiple of the chunk size (32)")
      assert.strictEqual(yield* message(key({ model_name: "other" })), "prepare_store: key.model_name (other) is not the model of instance 1's context (ed)")
      assert.strictEqual(yield* message(key({ world_size: 2, worker_id: 1 })), "prepare_store: key.world_size (2) is not the world size of the context (1)")
      assert.strictEqual(l1.stats().objects, 0)
    }).pipe(Effect.provide(env())))

  it.effect("every PREPARE/COMMIT refreshes last_seen and latches transfer activity of that context only", () =>
    Effect.gen(function*() {
      const ed = yield* EngineDrivenTransfer
      yield* ed.register(registration(1))
      yield* ed.register(registration(2))
      yield* TestClock.adjust("10 seconds")
      yield* ed.commitRetrieve(key(), id(1))
      const byId = new Map((yield* ed.target.instances()).map((i) => [i.instance_id, i]))
      assert.deepStrictEqual([byId.get("1")?.last_seen_age_seconds, byId.get("1")?.has_transfer_activity], [0, true])
      assert.deepStrictEqual([byId.get("2")?.last_seen_age_seconds, byId.get("2")?.has_transfer_activity], [10, false])
    }).pipe(Effect.provide(env())))
})

describe("releasing an entry", () => {
  const pendingBoth = Effect.gen(function*() {
    const ed = yield* EngineDrivenTransfer
    const native = yield* NativeMemory
    yield* ed.register(registration(1))
    yield* ed.register(registration(2))
    yield* storeShm(2, key({ end: 64, request_id: "old" }), 5)
    const read = yield* ed.prepareRetrieve(key({ end: 64, request_id: "old" }), id(1))
    assert.isTrue(read.success)
    const prepared = yield* ed.prepareStore(key({ request_id: "new" }), id(1))
    assert.deepStrictEqual(prepared.context.chunk_indices, [2, 3])
    // The worker writes its chunks, then dies before COMMIT_STORE.
    const view = yield* workerView
    yield* Effect.forEach(prepared.context.slots, (s, j) => native.scatter(view, Float64Array.of(s.offset, 0, s.length), chunkContent(5, 2 + j)))
    return (yield* ed.contextOf(id(1)))!
  })

  const nothingLeft = Effect.gen(function*() {
    const l1 = yield* L1Store
    assert.deepStrictEqual([l1.stats().objects, l1.stats().reservedObjects, l1.stats().lockedObjects], [2, 0, 0])
    assert.strictEqual(l1.stats().usedBytes, 2 * CHUNK_BYTES)
    // A later LOOKUP finds only the two chunks committed before: none of the pending ones was published.
    assert.strictEqual(yield* lookupHits(key({ request_id: "after" })), 2)
    yield* (yield* Lookup).endSession("after")
  })

  it.effect("UNREGISTER with a pending PREPARE_STORE publishes nothing, frees its reservations and releases its pending reads", () =>
    Effect.gen(function*() {
      const ed = yield* EngineDrivenTransfer
      const context = yield* pendingBoth
      assert.deepStrictEqual([context.strategy.pendingStores(), context.strategy.pendingRetrieves()], [
        { requests: 1, chunks: 2 },
        { requests: 1, chunks: 2 }
      ])
      yield* ed.unregister(id(1))
      assert.isFalse(context.strategy.isOpen())
      assert.deepStrictEqual([context.strategy.pendingStores(), context.strategy.pendingRetrieves()], [
        { requests: 0, chunks: 0 },
        { requests: 0, chunks: 0 }
      ])
      yield* nothingLeft
      // A late commit of the released context is not_registered, and publishes nothing.
      assert.instanceOf(yield* Effect.flip(ed.commitStore(key({ request_id: "new" }), id(1), new Uint8Array(0))), NotRegistered)
      yield* nothingLeft
    }).pipe(Effect.scoped, Effect.provide(env())))

  it.effect("a reap releases the same way", () =>
    Effect.gen(function*() {
      const ed = yield* EngineDrivenTransfer
      const context = yield* pendingBoth
      yield* ed.target.touchInstance(id(2))
      yield* TestClock.adjust("200 seconds")
      yield* ed.target.touchInstance(id(2))
      const reaped = yield* ed.target.reapStaleInstances({
        nowMs: 200_000,
        reapTimeoutMs: 120_000,
        registrationGraceMs: 150_000,
        suspects: new Map(),
        disconnectGraceMs: 0
      })
      assert.deepStrictEqual(reaped.map((r) => [r.id, r.reason]), [[id(1), "grace"]])
      assert.isFalse(context.strategy.isOpen())
      assert.isTrue(yield* ed.target.holdsInstance(id(2)))
      yield* nothingLeft
    }).pipe(Effect.scoped, Effect.provide(env())))

  it.effect("server shutdown releases every context through the same finalizer", () =>
    Effect.gen(function*() {
      const scope = yield* Scope.make()
      const ctx = yield* Layer.buildWithScope(modules, scope)
      const ed = Context.get(ctx, EngineDrivenTransfer)
      const l1 = Context.get(ctx, L1Store)
      const context = yield* pendingBoth.pipe(Effect.provide(ctx))
      yield* Scope.close(scope, Exit.void)
      assert.isFalse(context.strategy.isOpen())
      assert.strictEqual(yield* ed.target.trackedInstanceCount(), 0)
      assert.deepStrictEqual([l1.stats().reservedObjects, l1.stats().lockedObjects], [0, 0])
    }).pipe(Effect.scoped, Effect.provide(ServerConfig.layerTest({ chunkSize: CHUNK, l1SizeGb: (32 * CHUNK_BYTES) / 2 ** 30 }))))
})

describe("prepare TTL (issue 18)", () => {
  /** `engine_driven.pending_*` of /api/status and L1's reserved and locked objects. */
  const pending = Effect.gen(function*() {
    const ed = yield* EngineDrivenTransfer
    const l1 = yield* L1Store
    const block = (yield* ed.status())["engine_driven"] as { pending_stores: number; pending_retrieves: number }
    return {
      stores: block.pending_stores,
      retrieves: block.pending_retrieves,
      reserved: l1.stats().reservedObjects,
      locked: l1.stats().lockedObjects
    }
  })

  it.effect("a PREPARE_STORE never committed is kept at the TTL and released 1 ms past it; the late COMMIT answers false and publishes nothing", () =>
    Effect.gen(function*() {
      const ed = yield* EngineDrivenTransfer
      const native = yield* NativeMemory
      const l1 = yield* L1Store
      yield* ed.register(registration(1))
      const prepared = yield* ed.prepareStore(key(), id(1))
      assert.deepStrictEqual(prepared.context.chunk_indices, [0, 1, 2, 3])
      // The worker copies its chunks, then never commits.
      const view = yield* workerView
      yield* Effect.forEach(prepared.context.slots, (s, j) => native.scatter(view, Float64Array.of(s.offset, 0, s.length), chunkContent(6, j)))
      yield* TestClock.adjust("5 seconds")
      assert.deepStrictEqual(yield* pending, { stores: 1, retrieves: 0, reserved: 4, locked: 0 })
      yield* TestClock.adjust("1 millis")
      assert.deepStrictEqual(yield* pending, { stores: 0, retrieves: 0, reserved: 0, locked: 0 })
      assert.deepStrictEqual((yield* ed.contextOf(id(1)))!.strategy.expired(), { stores: 1, retrieves: 0 })
      assert.isFalse(yield* ed.commitStore(key(), id(1), new Uint8Array(0)))
      assert.deepStrictEqual([l1.stats().objects, l1.stats().usedBytes], [0, 0])
      assert.strictEqual(yield* lookupHits(key({ request_id: "after" })), 0)
      // The chunks can be prepared afresh.
      assert.deepStrictEqual((yield* ed.prepareStore(key({ request_id: "r2" }), id(1))).context.chunk_indices, [0, 1, 2, 3])
    }).pipe(Effect.scoped, Effect.provide(env({ prepareTtlSeconds: 5 }))))

  it.effect("a PREPARE_RETRIEVE never committed keeps its read locks for the TTL (default 60 s), releases them 1 ms past it; the late COMMIT answers false", () =>
    Effect.gen(function*() {
      const ed = yield* EngineDrivenTransfer
      yield* ed.register(registration(1))
      yield* storeShm(1, key(), 2)
      const r = yield* ed.prepareRetrieve(key({ request_id: "s" }), id(1))
      assert.isTrue(r.success)
      yield* TestClock.adjust("60 seconds")
      assert.deepStrictEqual(yield* pending, { stores: 0, retrieves: 1, reserved: 0, locked: 4 })
      yield* TestClock.adjust("1 millis")
      assert.deepStrictEqual(yield* pending, { stores: 0, retrieves: 0, reserved: 0, locked: 0 })
      assert.deepStrictEqual((yield* ed.contextOf(id(1)))!.strategy.expired(), { stores: 0, retrieves: 1 })
      assert.isFalse(yield* ed.commitRetrieve(key({ request_id: "s" }), id(1)))
      // The published chunks stay.
      assert.strictEqual(yield* lookupHits(key({ request_id: "after" })), 4)
    }).pipe(Effect.scoped, Effect.provide(env())))

  it.effect("a COMMIT at exactly the TTL still works, and nothing expires after it", () =>
    Effect.gen(function*() {
      const ed = yield* EngineDrivenTransfer
      const l1 = yield* L1Store
      yield* ed.register(registration(1))
      yield* ed.prepareStore(key({ end: 64 }), id(1))
      yield* TestClock.adjust("60 seconds")
      assert.isTrue(yield* ed.commitStore(key({ end: 64 }), id(1), Buffer.concat([chunkContent(3, 0), chunkContent(3, 1)])))
      yield* storeShm(1, key({ start: 64, end: 128, request_id: "r3" }), 3)
      yield* ed.prepareRetrieve(key({ request_id: "s" }), id(1))
      yield* TestClock.adjust("60 seconds")
      assert.isTrue(yield* ed.commitRetrieve(key({ request_id: "s" }), id(1)))
      yield* TestClock.adjust("10 minutes")
      assert.deepStrictEqual(yield* pending, { stores: 0, retrieves: 0, reserved: 0, locked: 0 })
      assert.deepStrictEqual((yield* ed.contextOf(id(1)))!.strategy.expired(), { stores: 0, retrieves: 0 })
      assert.strictEqual(l1.stats().objects, 4)
      assert.strictEqual(yield* lookupHits(key({ request_id: "after" })), 4)
    }).pipe(Effect.scoped, Effect.provide(env())))

  it.effect("a PREPARE again of the same pending key restarts the TTL: the first one's timer releases nothing", () =>
    Effect.gen(function*() {
      const ed = yield* EngineDrivenTransfer
      yield* ed.register(registration(1))
      yield* ed.prepareStore(key(), id(1))
      yield* TestClock.adjust("30 seconds")
      yield* ed.prepareStore(key(), id(1))
      yield* TestClock.adjust("30001 millis")
      assert.deepStrictEqual(yield* pending, { stores: 1, retrieves: 0, reserved: 4, locked: 0 })
      yield* TestClock.adjust("30 seconds")
      assert.deepStrictEqual(yield* pending, { stores: 0, retrieves: 0, reserved: 0, locked: 0 })
      assert.deepStrictEqual((yield* ed.contextOf(id(1)))!.strategy.expired(), { stores: 1, retrieves: 0 })
    }).pipe(Effect.provide(env())))

  it.effect("a worker's abort (COMMIT_STORE with one byte) drops the reservations at once and answers false", () =>
    Effect.gen(function*() {
      const ed = yield* EngineDrivenTransfer
      const l1 = yield* L1Store
      yield* ed.register(registration(1))
      yield* ed.prepareStore(key(), id(1))
      assert.isFalse(yield* ed.commitStore(key(), id(1), new Uint8Array(1)))
      assert.deepStrictEqual(yield* pending, { stores: 0, retrieves: 0, reserved: 0, locked: 0 })
      assert.strictEqual(l1.stats().objects, 0)
      yield* TestClock.adjust("61 seconds")
      assert.deepStrictEqual((yield* ed.contextOf(id(1)))!.strategy.expired(), { stores: 0, retrieves: 0 })
    }).pipe(Effect.provide(env())))

  it.effect("unregister before the TTL releases once; the timers die with the entry", () =>
    Effect.gen(function*() {
      const ed = yield* EngineDrivenTransfer
      yield* ed.register(registration(1))
      yield* ed.prepareStore(key(), id(1))
      const context = (yield* ed.contextOf(id(1)))!
      yield* ed.unregister(id(1))
      assert.deepStrictEqual(yield* pending, { stores: 0, retrieves: 0, reserved: 0, locked: 0 })
      yield* TestClock.adjust("61 seconds")
      assert.deepStrictEqual(context.strategy.expired(), { stores: 0, retrieves: 0 })
    }).pipe(Effect.provide(env())))
})

describe("a defect or an interruption at every step of PREPARE/COMMIT leaves L1 holding nothing (issue 25 item 2)", () => {
  const faults = makeFaultSteps()
  const faultyEnv = (config: Partial<ServerConfigInput> = {}) =>
    EngineDrivenTransfer.layer.pipe(
      Layer.provideMerge(Lookup.layer),
      Layer.provideMerge(
        Layer.mergeAll(faultyL1(faults).pipe(Layer.provide(L1Store.layer)), LayoutRegistry.layer).pipe(Layer.provideMerge(NativeMemoryLive))
      ),
      Layer.provideMerge(ServerConfig.layerTest({ chunkSize: CHUNK, l1SizeGb: (32 * CHUNK_BYTES) / 2 ** 30, ...config }))
    )
  /** 4 chunks: [0, 128). */
  const k = key()
  const inlineBytes = new Uint8Array(4 * CHUNK_BYTES).fill(7)

  const holdsNothing = (label: string) =>
    Effect.gen(function*() {
      const s = (yield* L1Store).stats()
      assert.deepStrictEqual({ reserved: s.reservedObjects, locked: s.lockedObjects }, { reserved: 0, locked: 0 }, label)
    })
  const cleared = Effect.gen(function*() {
    yield* (yield* L1Store).clear(false)
  })

  for (const transport of ["shm", "inline"] as const) {
    const cpuData = transport === "inline" ? inlineBytes : new Uint8Array(0)

    it.effect(`${transport}: PREPARE_STORE then COMMIT_STORE`, () =>
      Effect.gen(function*() {
        const ed = yield* EngineDrivenTransfer
        yield* ed.register(registration(1))
        const steps = yield* atEveryStep(faults, {
          setup: cleared,
          path: Effect.andThen(ed.prepareStore(k, id(1)), ed.commitStore(k, id(1), cpuData)),
          check: (exit, run) =>
            Effect.gen(function*() {
              yield* holdsNothing(run.label)
              if (!run.fired) assert.isTrue(Exit.isSuccess(exit) && exit.value, run.label)
              else if (run.kind === "defect") assert.isTrue(Exit.hasDies(exit), run.label)
            })
        })
        assert.deepStrictEqual(steps, [...Array(4).fill("l1.reserveWrite"), ...Array(4).fill("l1.commit")])
      }).pipe(Effect.provide(faultyEnv({ engineDrivenTransport: transport }))))

    it.effect(`${transport}: PREPARE_RETRIEVE then COMMIT_RETRIEVE`, () =>
      Effect.gen(function*() {
        const ed = yield* EngineDrivenTransfer
        yield* ed.register(registration(1))
        const steps = yield* atEveryStep(faults, {
          setup: Effect.gen(function*() {
            yield* cleared
            yield* ed.prepareStore(k, id(1))
            assert.isTrue(yield* ed.commitStore(k, id(1), cpuData))
          }),
          path: Effect.andThen(ed.prepareRetrieve(k, id(1)), ed.commitRetrieve(k, id(1))),
          check: (exit, run) =>
            Effect.gen(function*() {
              yield* holdsNothing(run.label)
              if (!run.fired) assert.isTrue(Exit.isSuccess(exit) && exit.value, run.label)
              else if (run.kind === "defect") assert.isTrue(Exit.hasDies(exit), run.label)
            })
        })
        assert.deepStrictEqual(steps, Array(4).fill("l1.lockRead"))
      }).pipe(Effect.provide(faultyEnv({ engineDrivenTransport: transport }))))
  }
})
