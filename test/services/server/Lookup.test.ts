import { assert, describe, it } from "@effect/vitest"
import { Effect, Layer } from "effect"
import { TestClock } from "effect/testing"
import { NativeMemoryLive } from "../../../src/layers/NativeMemory.ts"
import { ServerConfig, type ServerConfigInput } from "../../../src/services/server/ServerConfig.ts"
import type { CacheKey } from "../../../src/schema/CacheKey.ts"
import { MAX_WORLD_SIZE } from "../../../src/schema/Limits.ts"
import { L1Store } from "../../../src/services/server/L1Store.ts"
import { LayoutRegistry } from "../../../src/services/server/LayoutRegistry.ts"
import { Lookup, objectKeysOf } from "../../../src/services/server/Lookup.ts"
import { chunkHashes } from "../../../src/services/kv/TokenHasher.ts"
import type { ObjectKey } from "../../../src/services/server/ObjectKey.ts"

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

/** Every `contains` the lookup asks L1, by key: the probe of how much work a LOOKUP does. */
const asked: Array<ObjectKey> = []

/** The real L1 store, its `contains` recorded in `asked`. */
const ProbedL1 = Layer.effect(
  L1Store,
  Effect.gen(function*() {
    const l1 = yield* L1Store
    return L1Store.of({
      ...l1,
      contains: (k) => {
        asked.push(k)
        return l1.contains(k)
      }
    })
  })
).pipe(Layer.provide(L1Store.layer))

const envOf = (config: Partial<ServerConfigInput> = {}) =>
  Lookup.layer.pipe(
    Layer.provideMerge(Layer.mergeAll(ProbedL1, LayoutRegistry.layer).pipe(Layer.provide(NativeMemoryLive))),
    Layer.provideMerge(ServerConfig.layerTest({ chunkSize: CHUNK, l1SizeGb: 1 / 2 ** 30 * 1000, lookupLockTtlSeconds: 60, ...config }))
  )
const Env = envOf()

/** Puts chunks [0, n) of `tokens` for `rank` into L1 (100 bytes each). */
const putChunks = (n: number, rank: number) =>
  Effect.gen(function*() {
    const l1 = yield* L1Store
    for (const k of objectKeysOf(key(), chunkHashes(tokens, CHUNK, n), rank)) {
      const r = yield* l1.reserveWrite(k, 100)
      if (r._tag === "Reserved") yield* l1.commit(r.reservation)
    }
  })

const registerLayout = (worldSize = 2) =>
  Effect.gen(function*() {
    const layouts = yield* LayoutRegistry
    yield* layouts.register("m", worldSize, { numLayers: 1, hiddenDim: 1, elementBytes: 1, dtype: "uint8", chunkBytes: 100 })
  })

/** The counts of `stats()` the older tests compare. */
const counts = (lookup: Lookup["Service"]) => {
  const s = lookup.stats()
  return { sessions: s.sessions, heldLocks: s.heldLocks, pendingJobs: s.pendingJobs }
}

/** The `lookup` block of /api/status. */
const statusOf = (lookup: Lookup["Service"]) =>
  Effect.map(lookup.module.status!(), (b) => b["lookup"] as Record<string, unknown>)

describe("Lookup", () => {
  it.effect("a LOOKUP of a model with no registered layout keeps nothing and answers 0 (issue 24 item 6)", () =>
    Effect.gen(function*() {
      const lookup = yield* Lookup
      yield* putChunks(4, 0)
      for (let i = 0; i < 100; i++) yield* lookup.lookup(key({ request_id: `unregistered-${i}` }), "peer-a")
      assert.deepStrictEqual(lookup.stats(), {
        sessions: 0,
        heldLocks: 0,
        pendingJobs: 0,
        peers: 0,
        released: { ttl: 0, max_pending_lookups_per_peer: 0, max_pending_lookups: 0, max_lookup_locks: 0 }
      })
      assert.strictEqual(yield* lookup.queryPrefetchStatus("unregistered-0"), 0)
      assert.strictEqual((yield* statusOf(lookup))["lookups"], 100)
    }).pipe(Effect.provide(Env)))

  it.effect("a LOOKUP that hits nothing keeps nothing either", () =>
    Effect.gen(function*() {
      const lookup = yield* Lookup
      yield* registerLayout()
      yield* lookup.lookup(key({ request_id: "no-hits", worker_id: 0 }))
      assert.deepStrictEqual(counts(lookup), { sessions: 0, heldLocks: 0, pendingJobs: 0 })
      assert.strictEqual(yield* lookup.queryPrefetchStatus("no-hits"), 0)
    }).pipe(Effect.provide(Lookup.layerTest({ chunkSize: CHUNK, lookupLockTtlSeconds: 60 }))))

  it.effect("worker_id nil counts the prefix every rank holds, locks it, and reports it exactly once", () =>
    Effect.gen(function*() {
      const lookup = yield* Lookup
      const l1 = yield* L1Store
      yield* registerLayout()
      yield* putChunks(3, 0)
      yield* putChunks(2, 1)
      yield* lookup.lookup(key())
      assert.strictEqual(yield* lookup.queryPrefetchStatus("req-1"), 2)
      assert.strictEqual(yield* lookup.queryPrefetchStatus("req-1"), 0)
      assert.strictEqual(yield* lookup.queryPrefetchStatus("unknown"), 0)
      assert.deepStrictEqual(counts(lookup), { sessions: 1, heldLocks: 4, pendingJobs: 0 })
      assert.strictEqual(l1.stats().lockedObjects, 4)
    }).pipe(Effect.provide(Lookup.layerTest({ chunkSize: CHUNK, lookupLockTtlSeconds: 60 }))))

  it.effect("worker_id nil with the largest world size: L1 is asked chunk by chunk and the scan stops at the first missing object (issue 24 item 5)", () =>
    Effect.gen(function*() {
      const lookup = yield* Lookup
      yield* registerLayout(MAX_WORLD_SIZE)
      yield* putChunks(4, 0)
      yield* putChunks(4, 1)
      asked.length = 0
      yield* lookup.lookup(key({ world_size: MAX_WORLD_SIZE }))
      // Chunk 0: ranks 0 and 1 hold it, rank 2 does not — three questions, not 4 chunks × 1024 ranks.
      assert.deepStrictEqual(asked.map((k) => k.kvRank), [0, 1, 2])
      assert.strictEqual(yield* lookup.queryPrefetchStatus("req-1"), 0)
      assert.deepStrictEqual(counts(lookup), { sessions: 0, heldLocks: 0, pendingJobs: 0 })
      // Every rank holding every chunk: 4 chunks × 1024 ranks asked, each found, then nothing past the key.
      for (let r = 2; r < MAX_WORLD_SIZE; r++) yield* putChunks(4, r)
      asked.length = 0
      yield* lookup.lookup(key({ world_size: MAX_WORLD_SIZE, request_id: "full" }))
      assert.strictEqual(asked.length, 4 * MAX_WORLD_SIZE)
      assert.strictEqual(yield* lookup.queryPrefetchStatus("full"), 4)
      assert.strictEqual(lookup.stats().heldLocks, 4 * MAX_WORLD_SIZE)
    }).pipe(Effect.provide(envOf({ l1SizeGb: (100 * 4 * MAX_WORLD_SIZE) / 2 ** 30 }))))

  it.effect("a lookup naming one rank counts that rank only", () =>
    Effect.gen(function*() {
      const lookup = yield* Lookup
      yield* registerLayout()
      yield* putChunks(3, 0)
      yield* lookup.lookup(key({ worker_id: 0 }))
      assert.strictEqual(yield* lookup.queryPrefetchStatus("req-1"), 3)
      assert.strictEqual(lookup.stats().heldLocks, 3)
    }).pipe(Effect.provide(Env)))

  it.effect("a repeated LOOKUP of one request id holds one lock per object, not one per LOOKUP", () =>
    Effect.gen(function*() {
      const lookup = yield* Lookup
      const l1 = yield* L1Store
      yield* registerLayout()
      yield* putChunks(3, 0)
      for (let i = 0; i < 50; i++) yield* lookup.lookup(key({ worker_id: 0 }))
      assert.deepStrictEqual(counts(lookup), { sessions: 1, heldLocks: 3, pendingJobs: 1 })
      yield* lookup.endSession("req-1")
      assert.strictEqual(l1.stats().lockedObjects, 0)
    }).pipe(Effect.provide(Env)))

  it.effect("a repeated LOOKUP replaces the request's locks: a shorter one leaves the rest unlocked, and old locks never ride on a new TTL (issue 25 item 2)", () =>
    Effect.gen(function*() {
      const lookup = yield* Lookup
      const l1 = yield* L1Store
      yield* registerLayout()
      yield* putChunks(3, 0)
      yield* lookup.lookup(key({ worker_id: 0 }))
      assert.deepStrictEqual([lookup.stats().heldLocks, l1.stats().lockedObjects], [3, 3])
      yield* TestClock.adjust("50 seconds")
      // Again for chunks [0, 2): chunk 2's lock goes now, not 60 s after this LOOKUP.
      yield* lookup.lookup(key({ worker_id: 0, end: 2 * CHUNK }))
      assert.deepStrictEqual([lookup.stats().heldLocks, l1.stats().lockedObjects], [2, 2])
      assert.strictEqual(yield* lookup.queryPrefetchStatus("req-1"), 2)
      // Again, finding nothing (no layout for the model): nothing is kept.
      yield* lookup.lookup(key({ worker_id: 0, model_name: "unregistered" }))
      assert.deepStrictEqual([lookup.stats().sessions, l1.stats().lockedObjects], [0, 0])
      assert.deepStrictEqual(lookup.stats().released, { ttl: 0, max_pending_lookups_per_peer: 0, max_pending_lookups: 0, max_lookup_locks: 0 })
    }).pipe(Effect.provide(Env)))

  it.effect("locked chunks survive eviction; FREE_LOOKUP_LOCKS releases exactly its range; END_SESSION the rest", () =>
    Effect.gen(function*() {
      const lookup = yield* Lookup
      const l1 = yield* L1Store
      yield* registerLayout()
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
      assert.deepStrictEqual(counts(lookup), { sessions: 0, heldLocks: 0, pendingJobs: 0 })
      assert.strictEqual(l1.stats().lockedObjects, 0)
    }).pipe(Effect.provide(Env)))

  it.effect("FREE_LOOKUP_LOCKS with worker_id nil frees every rank below the key's world size", () =>
    Effect.gen(function*() {
      const lookup = yield* Lookup
      yield* registerLayout()
      yield* putChunks(4, 0)
      yield* putChunks(4, 1)
      yield* lookup.lookup(key())
      assert.strictEqual(lookup.stats().heldLocks, 8)
      yield* lookup.freeLookupLocks(key({ start: 0, end: 8 }))
      assert.strictEqual(lookup.stats().heldLocks, 4)
      // The count is unreported, so the session stays; once reported and every lock freed, nothing is left.
      assert.strictEqual(yield* lookup.queryPrefetchStatus("req-1"), 4)
      yield* lookup.freeLookupLocks(key({ start: 8, end: 16 }))
      assert.deepStrictEqual(counts(lookup), { sessions: 0, heldLocks: 0, pendingJobs: 0 })
    }).pipe(Effect.provide(Env)))

  it.effect("a RETRIEVE takes the session's lock; without one it locks a present object", () =>
    Effect.gen(function*() {
      const lookup = yield* Lookup
      const l1 = yield* L1Store
      yield* registerLayout()
      yield* putChunks(2, 0)
      yield* lookup.lookup(key({ worker_id: 0 }))
      const [k0, k1] = objectKeysOf(key(), chunkHashes(tokens, CHUNK, 2), 0)
      // The RETRIEVE's locks are held by its scope: released when it closes.
      yield* Effect.scoped(Effect.gen(function*() {
        const h0 = yield* lookup.acquireForRetrieve("req-1", k0!)
        assert.isDefined(h0)
        assert.strictEqual(lookup.stats().heldLocks, 1)
        const other = yield* lookup.acquireForRetrieve("req-2", k1!)
        assert.isDefined(other)
        assert.strictEqual(l1.stats().lockedObjects, 2)
      }))
      assert.strictEqual(l1.stats().lockedObjects, 1)
      const absent = { hash: new Uint8Array(32), modelName: "m", kvRank: 0, cacheSalt: "" }
      assert.strictEqual(yield* lookup.acquireForRetrieve("req-1", absent), undefined)
    }).pipe(Effect.provide(Env)))

  it.effect("locks of a session idle longer than the TTL are released by the sweeper, not before, and counted", () =>
    Effect.gen(function*() {
      const lookup = yield* Lookup
      const l1 = yield* L1Store
      yield* registerLayout()
      yield* putChunks(2, 0)
      yield* lookup.lookup(key({ worker_id: 0 }))
      yield* TestClock.adjust("60 seconds")
      assert.strictEqual(l1.stats().lockedObjects, 2)
      yield* TestClock.adjust("15 seconds")
      assert.strictEqual(l1.stats().lockedObjects, 0)
      assert.deepStrictEqual(counts(lookup), { sessions: 0, heldLocks: 0, pendingJobs: 0 })
      assert.strictEqual(lookup.stats().released.ttl, 1)
    }).pipe(Effect.provide(Env)))

  it.effect("a job nobody queries is dropped with its locks after the lock TTL (issue 18: pending_jobs returns to 0)", () =>
    Effect.gen(function*() {
      const lookup = yield* Lookup
      yield* registerLayout()
      yield* putChunks(1, 0)
      yield* lookup.lookup(key({ request_id: "unqueried", worker_id: 0 }))
      assert.deepStrictEqual(counts(lookup), { sessions: 1, heldLocks: 1, pendingJobs: 1 })
      yield* TestClock.adjust("60 seconds")
      assert.deepStrictEqual(counts(lookup), { sessions: 1, heldLocks: 1, pendingJobs: 1 })
      yield* TestClock.adjust("15 seconds")
      assert.deepStrictEqual(counts(lookup), { sessions: 0, heldLocks: 0, pendingJobs: 0 })
      assert.strictEqual(yield* lookup.queryPrefetchStatus("unqueried"), 0)
    }).pipe(Effect.provide(Env)))
})

describe("Lookup bounds (issue 24 item 6)", () => {
  const Bounded = envOf({ maxPendingLookups: 5, maxPendingLookupsPerPeer: 3, maxLookupLocks: 100 })

  it.effect("over --max-pending-lookups-per-peer the peer's oldest is released (locks freed, count forgotten), others untouched", () =>
    Effect.gen(function*() {
      const lookup = yield* Lookup
      const l1 = yield* L1Store
      yield* registerLayout()
      yield* putChunks(1, 0)
      yield* lookup.lookup(key({ request_id: "b0", worker_id: 0 }), "b")
      for (let i = 0; i < 7; i++) yield* lookup.lookup(key({ request_id: `a${i}`, worker_id: 0 }), "a")
      assert.deepStrictEqual(lookup.stats(), {
        sessions: 4,
        heldLocks: 4,
        pendingJobs: 4,
        peers: 2,
        released: { ttl: 0, max_pending_lookups_per_peer: 4, max_pending_lookups: 0, max_lookup_locks: 0 }
      })
      for (const id of ["a0", "a1", "a2", "a3"]) assert.strictEqual(yield* lookup.queryPrefetchStatus(id), 0)
      for (const id of ["b0", "a4", "a5", "a6"]) assert.strictEqual(yield* lookup.queryPrefetchStatus(id), 1)
      // One object, locked once by each of the 4 pending lookups.
      yield* Effect.forEach(["b0", "a4", "a5"], (id) => lookup.endSession(id))
      assert.strictEqual(l1.stats().lockedObjects, 1)
      yield* lookup.endSession("a6")
      assert.strictEqual(l1.stats().lockedObjects, 0)
      const status = yield* statusOf(lookup)
      assert.deepInclude(status, { max_pending_lookups: 5, max_pending_lookups_per_peer: 3, max_lookup_locks: 100, sessions: 0, peers: 0 })
    }).pipe(Effect.provide(Bounded)))

  it.effect("over --max-pending-lookups the server's oldest is released, whoever's it is; a repeated LOOKUP makes an id the newest", () =>
    Effect.gen(function*() {
      const lookup = yield* Lookup
      yield* registerLayout()
      yield* putChunks(1, 0)
      yield* lookup.lookup(key({ request_id: "a0", worker_id: 0 }), "a")
      yield* lookup.lookup(key({ request_id: "a1", worker_id: 0 }), "a")
      yield* lookup.lookup(key({ request_id: "b0", worker_id: 0 }), "b")
      yield* lookup.lookup(key({ request_id: "b1", worker_id: 0 }), "b")
      yield* lookup.lookup(key({ request_id: "a0", worker_id: 0 }), "a") // a0 is now the newest
      yield* lookup.lookup(key({ request_id: "c0", worker_id: 0 }), "c")
      yield* lookup.lookup(key({ request_id: "c1", worker_id: 0 }), "c") // 6 > 5: the oldest, a1, goes
      yield* lookup.lookup(key({ request_id: "c2", worker_id: 0 }), "c") // then b0
      assert.deepStrictEqual(lookup.stats().released, { ttl: 0, max_pending_lookups_per_peer: 0, max_pending_lookups: 2, max_lookup_locks: 0 })
      const answers: Record<string, number | null> = {}
      for (const id of ["a0", "a1", "b0", "b1", "c0", "c1", "c2"]) answers[id] = yield* lookup.queryPrefetchStatus(id)
      assert.deepStrictEqual(answers, { a0: 1, a1: 0, b0: 0, b1: 1, c0: 1, c1: 1, c2: 1 })
      assert.deepStrictEqual(counts(lookup), { sessions: 5, heldLocks: 5, pendingJobs: 0 })
    }).pipe(Effect.provide(Bounded)))

  it.effect("a repeated LOOKUP from another peer moves the id to that peer", () =>
    Effect.gen(function*() {
      const lookup = yield* Lookup
      yield* registerLayout()
      yield* putChunks(1, 0)
      for (let i = 0; i < 3; i++) yield* lookup.lookup(key({ request_id: `a${i}`, worker_id: 0 }), "a")
      yield* lookup.lookup(key({ request_id: "a0", worker_id: 0 }), "b")
      // a has a1 and a2 now: one more LOOKUP from a releases nothing.
      yield* lookup.lookup(key({ request_id: "a3", worker_id: 0 }), "a")
      assert.deepStrictEqual(lookup.stats().released, { ttl: 0, max_pending_lookups_per_peer: 0, max_pending_lookups: 0, max_lookup_locks: 0 })
      assert.deepStrictEqual({ sessions: lookup.stats().sessions, peers: lookup.stats().peers }, { sessions: 4, peers: 2 })
    }).pipe(Effect.provide(Bounded)))

  it.effect("over --max-lookup-locks the oldest lookups are released to make room; one LOOKUP alone past it locks (and reports) what fits", () =>
    Effect.gen(function*() {
      const lookup = yield* Lookup
      const l1 = yield* L1Store
      yield* registerLayout()
      yield* putChunks(4, 0)
      yield* putChunks(4, 1)
      yield* lookup.lookup(key({ request_id: "r0", worker_id: 0, end: 8 }), "a") // 2 locks
      yield* lookup.lookup(key({ request_id: "r1", worker_id: 1, end: 8 }), "b") // 2 locks: 4 of 5
      yield* lookup.lookup(key({ request_id: "r2", worker_id: 1, end: 8 }), "c") // 2 more: r0 goes
      assert.deepStrictEqual(lookup.stats().released, { ttl: 0, max_pending_lookups_per_peer: 0, max_pending_lookups: 0, max_lookup_locks: 1 })
      assert.strictEqual(yield* lookup.queryPrefetchStatus("r0"), 0)
      assert.deepStrictEqual(counts(lookup), { sessions: 2, heldLocks: 4, pendingJobs: 2 })
      // 4 chunks × 2 ranks = 8 locks wanted, 5 allowed: r1 and r2 go, then 2 of the 4 chunks (4 locks) fit.
      yield* lookup.lookup(key({ request_id: "big", end: 16 }), "d")
      assert.strictEqual(lookup.stats().released.max_lookup_locks, 3)
      assert.strictEqual(yield* lookup.queryPrefetchStatus("big"), 2)
      assert.deepStrictEqual(counts(lookup), { sessions: 1, heldLocks: 4, pendingJobs: 0 })
      assert.strictEqual(l1.stats().lockedObjects, 4)
      assert.strictEqual((yield* statusOf(lookup))["capped_lookups"], 1)
    }).pipe(Effect.provide(envOf({ maxPendingLookups: 5, maxPendingLookupsPerPeer: 3, maxLookupLocks: 5 }))))
})
