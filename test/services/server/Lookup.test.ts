import { assert, describe, it } from "@effect/vitest"
import { Effect, Layer } from "effect"
import { TestClock } from "effect/testing"
import { NativeMemoryLive } from "../../../src/layers/NativeMemory.ts"
import { ServerConfig } from "../../../src/services/server/ServerConfig.ts"
import type { CacheKey } from "../../../src/schema/CacheKey.ts"
import { L1Store } from "../../../src/services/server/L1Store.ts"
import { LayoutRegistry } from "../../../src/services/server/LayoutRegistry.ts"
import { Lookup, objectKeysOf } from "../../../src/services/server/Lookup.ts"
import { chunkHashes } from "../../../src/services/kv/TokenHasher.ts"

const CHUNK = 4
const tokens = Array.from({ length: 18 }, (_, i) => 100 + i)

const key = (over: Partial<CacheKey> = {}): CacheKey => ({
  model_name: "m",
  world_size: 2,
  worker_id: null,
  token_ids: tokens,
  start: 0,
  end: 16,
  request_id: "req-1",
  cache_salt: "",
  ...over
})

const Env = Lookup.layer.pipe(
  Layer.provideMerge(Layer.mergeAll(L1Store.layer, LayoutRegistry.layer).pipe(Layer.provide(NativeMemoryLive))),
  Layer.provideMerge(ServerConfig.layerTest({ chunkSize: CHUNK, l1SizeGb: 1 / 2 ** 30 * 1000, lookupLockTtlSeconds: 60 }))
)

/** Puts chunks [0, n) of `tokens` for `rank` into L1 (100 bytes each). */
const putChunks = (n: number, rank: number) =>
  Effect.gen(function*() {
    const l1 = yield* L1Store
    for (const k of objectKeysOf(key(), chunkHashes(tokens, CHUNK, n), rank)) {
      const r = yield* l1.reserveWrite(k, 100)
      if (r._tag === "Reserved") yield* l1.commit(r.reservation)
    }
  })

const registerLayout = Effect.gen(function*() {
  const layouts = yield* LayoutRegistry
  yield* layouts.register("m", 2, { numLayers: 1, hiddenDim: 1, elementBytes: 1, dtype: "uint8", chunkBytes: 100 })
})

describe("Lookup", () => {
  it.effect("a model with no registered layout gets a 0-hit job", () =>
    Effect.gen(function*() {
      const lookup = yield* Lookup
      yield* putChunks(4, 0)
      yield* lookup.lookup(key())
      assert.strictEqual(yield* lookup.queryPrefetchStatus("req-1"), 0)
      assert.deepStrictEqual(lookup.stats(), { sessions: 0, heldLocks: 0, pendingJobs: 0 })
    }).pipe(Effect.provide(Env)))

  it.effect("worker_id nil counts the prefix every rank holds, locks it, and reports it exactly once", () =>
    Effect.gen(function*() {
      const lookup = yield* Lookup
      const l1 = yield* L1Store
      yield* registerLayout
      yield* putChunks(3, 0)
      yield* putChunks(2, 1)
      yield* lookup.lookup(key())
      assert.strictEqual(yield* lookup.queryPrefetchStatus("req-1"), 2)
      assert.strictEqual(yield* lookup.queryPrefetchStatus("req-1"), 0)
      assert.strictEqual(yield* lookup.queryPrefetchStatus("unknown"), 0)
      assert.deepStrictEqual(lookup.stats(), { sessions: 1, heldLocks: 4, pendingJobs: 0 })
      assert.strictEqual(l1.stats().lockedObjects, 4)
    }).pipe(Effect.provide(Env)))

  it.effect("a lookup naming one rank counts that rank only", () =>
    Effect.gen(function*() {
      const lookup = yield* Lookup
      yield* registerLayout
      yield* putChunks(3, 0)
      yield* lookup.lookup(key({ worker_id: 0 }))
      assert.strictEqual(yield* lookup.queryPrefetchStatus("req-1"), 3)
      assert.strictEqual(lookup.stats().heldLocks, 3)
    }).pipe(Effect.provide(Env)))

  it.effect("locked chunks survive eviction; FREE_LOOKUP_LOCKS releases exactly its range; END_SESSION the rest", () =>
    Effect.gen(function*() {
      const lookup = yield* Lookup
      const l1 = yield* L1Store
      yield* registerLayout
      yield* putChunks(4, 0)
      yield* lookup.lookup(key({ worker_id: 0 }))
      assert.strictEqual(yield* lookup.queryPrefetchStatus("req-1"), 4)
      // L1 holds 1000 bytes: 10 objects of 100; all 4 are locked, so 6 more fit and the 7th is refused.
      for (let i = 0; i < 6; i++) {
        const r = yield* l1.reserveWrite({ hash: new Uint8Array(32).fill(i + 1), modelName: "x", kvRank: 0, cacheSalt: "" }, 100)
        assert.strictEqual(r._tag, "Reserved")
        if (r._tag === "Reserved") yield* l1.commit(r.reservation)
      }
      yield* lookup.freeLookupLocks(key({ worker_id: 0, start: 8, end: 16 }))
      assert.strictEqual(lookup.stats().heldLocks, 2)
      assert.strictEqual(l1.stats().lockedObjects, 2)
      yield* lookup.endSession("req-1")
      assert.deepStrictEqual(lookup.stats(), { sessions: 0, heldLocks: 0, pendingJobs: 0 })
      assert.strictEqual(l1.stats().lockedObjects, 0)
    }).pipe(Effect.provide(Env)))

  it.effect("a RETRIEVE takes the session's lock; without one it locks a present object", () =>
    Effect.gen(function*() {
      const lookup = yield* Lookup
      const l1 = yield* L1Store
      yield* registerLayout
      yield* putChunks(2, 0)
      yield* lookup.lookup(key({ worker_id: 0 }))
      const [k0, k1] = objectKeysOf(key(), chunkHashes(tokens, CHUNK, 2), 0)
      const h0 = yield* lookup.acquireForRetrieve("req-1", k0!)
      assert.isDefined(h0)
      assert.strictEqual(lookup.stats().heldLocks, 1)
      const other = yield* lookup.acquireForRetrieve("req-2", k1!)
      assert.isDefined(other)
      assert.strictEqual(l1.stats().lockedObjects, 2)
      lookup.release(h0!)
      lookup.release(other!)
      assert.strictEqual(l1.stats().lockedObjects, 1)
      const absent = { hash: new Uint8Array(32), modelName: "m", kvRank: 0, cacheSalt: "" }
      assert.strictEqual(yield* lookup.acquireForRetrieve("req-1", absent), undefined)
    }).pipe(Effect.provide(Env)))

  it.effect("locks of a session idle longer than the TTL are released by the sweeper, not before", () =>
    Effect.gen(function*() {
      const lookup = yield* Lookup
      const l1 = yield* L1Store
      yield* registerLayout
      yield* putChunks(2, 0)
      yield* lookup.lookup(key({ worker_id: 0 }))
      yield* TestClock.adjust("60 seconds")
      assert.strictEqual(l1.stats().lockedObjects, 2)
      yield* TestClock.adjust("15 seconds")
      assert.strictEqual(l1.stats().lockedObjects, 0)
      assert.deepStrictEqual(lookup.stats(), { sessions: 0, heldLocks: 0, pendingJobs: 0 })
    }).pipe(Effect.provide(Env)))

  it.effect("a job nobody queries is dropped after the lock TTL, with or without a session (issue 18: pending_jobs returns to 0)", () =>
    Effect.gen(function*() {
      const lookup = yield* Lookup
      // No registered layout: a job without a session. Then a registered one with no hits: a session without locks.
      yield* lookup.lookup(key({ request_id: "no-layout" }))
      yield* registerLayout
      yield* lookup.lookup(key({ request_id: "no-hits", worker_id: 0 }))
      assert.deepStrictEqual(lookup.stats(), { sessions: 1, heldLocks: 0, pendingJobs: 2 })
      yield* TestClock.adjust("60 seconds")
      assert.deepStrictEqual(lookup.stats(), { sessions: 1, heldLocks: 0, pendingJobs: 2 })
      yield* TestClock.adjust("15 seconds")
      assert.deepStrictEqual(lookup.stats(), { sessions: 0, heldLocks: 0, pendingJobs: 0 })
      assert.strictEqual(yield* lookup.queryPrefetchStatus("no-layout"), 0)
    }).pipe(Effect.provide(Env)))
})
