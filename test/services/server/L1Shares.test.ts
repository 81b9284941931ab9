/**
 * Tenants share L1 by weight (issue 27 item 2; src/services/server/internal/L1Shares.ts): eviction takes first
 * from the group furthest over its share, LRU within it; a group over its share never takes from one under
 * its share; an idle group's share is lent. Then the L1 store with shares, in process: tenant A storing many
 * times its share while tenant B re-reads a working set of half its share — B's hit ratio against B alone, and
 * the same without shares, which shows the problem.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { makeL1Shares } from "../../../src/services/server/internal/L1Shares.ts"
import { L1Store } from "../../../src/services/server/L1Store.ts"
import type { ObjectKey } from "../../../src/services/server/ObjectKey.ts"

const obj = (owner: string, id: number, length = 100) => ({ owner, id: `${owner}${id}`, extent: { length } })

describe("L1Shares", () => {
  it("shares are weights over the groups holding bytes; an idle group's share is lent to the others", () => {
    const s = makL1(1_000, { a: 1, b: 3 })
    s.added("a", 400)
    assert.deepStrictEqual(s.groups().map((g) => [g.group, g.bytes, g.shareBytes]), [["a", 400, 1_000]])
    s.added("b", 100)
    assert.deepStrictEqual(s.groups().map((g) => [g.group, g.bytes, g.weight, g.shareBytes]), [["a", 400, 1, 250], ["b", 100, 3, 750]])
    s.removed("a", 400, true)
    assert.deepStrictEqual(s.groups().map((g) => [g.group, g.bytes, g.shareBytes, g.evictions]), [["a", 0, 0, 1], ["b", 100, 1_000, 0]])
  })

  it("evicts from the group furthest over its share first, least recently used within it, recomputing after each", () => {
    const s = makL1(1_000, { a: 1, b: 1, c: 1 })
    // a holds 600 (share 333), b 300, c 100: a first until it is no further over than b.
    const lru = [obj("b", 0), obj("a", 0), obj("c", 0), obj("a", 1), obj("b", 1), obj("a", 2), obj("b", 2), obj("a", 3), obj("a", 4), obj("a", 5)]
    s.added("a", 600)
    s.added("b", 300)
    s.added("c", 100)
    const order = s.evictionOrder(lru, "c", 100, Number.POSITIVE_INFINITY).map((o) => o.id)
    // a: 600 → 300 (a0..a2, the ratio then ties with b), then a and b alternate from equal ratios, c last.
    assert.deepStrictEqual(order.slice(0, 3), ["a0", "a1", "a2"])
    assert.deepStrictEqual(new Set(order.slice(3, 5)), new Set(["a3", "b0"]))
    assert.strictEqual(order.at(-1), "c0")
    // Asked for only what it needs: the first candidate.
    assert.deepStrictEqual(s.evictionOrder(lru, "c", 100, 100).map((o) => o.id), ["a0"])
  })

  it("a group over its share takes only from groups over theirs: one under its share never loses a chunk to it", () => {
    const s = makL1(1_000, { a: 1, b: 1 })
    // a holds 500 = its share, b 300 (under): a asks for 100 more, so it would be over; only a's own go.
    s.added("a", 500)
    s.added("b", 300)
    const lru = [obj("b", 0), obj("b", 1), obj("a", 0), obj("a", 1), obj("b", 2)]
    assert.deepStrictEqual(s.evictionOrder(lru, "a", 100, Number.POSITIVE_INFINITY).map((o) => o.id), ["a0", "a1"])
    // b asking (under its share) may take from a (over its share after... at its share) first, then from itself.
    assert.deepStrictEqual(s.evictionOrder(lru, "b", 100, 100).map((o) => o.id), ["a0"])
  })
})

/** `makeL1Shares` with fixed weights by group (1 for an unlisted one). */
function makL1(capacity: number, weights: Record<string, number>) {
  return makeL1Shares(capacity, (g) => weights[g] ?? 1)
}

// ------------------------------------------------------------------ the store with shares, in process

const OBJECT_BYTES = 1_024
const CAPACITY_OBJECTS = 64
const key = (group: string, n: number): ObjectKey => {
  const hash = new Uint8Array(32)
  new DataView(hash.buffer).setUint32(0, n)
  return { hash, modelName: "m", kvRank: 0, cacheSalt: `${group}|` }
}

/**
 * B re-reads a working set of `setSize` chunks (storing a chunk it misses) while A stores `aPerRead` fresh chunks
 * per B read, for `rounds` passes over B's set after one warm-up pass; B's hit ratio over the measured passes.
 */
const hitRatio = (store: L1Store["Service"], setSize: number, aPerRead: number, rounds: number) =>
  Effect.gen(function*() {
    let hits = 0
    let reads = 0
    let aNext = 0
    const write = (k: ObjectKey) =>
      Effect.gen(function*() {
        const r = yield* store.reserveWrite(k, OBJECT_BYTES)
        if (r._tag !== "Reserved") return
        yield* store.fill(r.reservation, new Uint8Array(OBJECT_BYTES))
        yield* store.commit(r.reservation)
      })
    for (let pass = 0; pass <= rounds; pass++) {
      for (let i = 0; i < setSize; i++) {
        for (let j = 0; j < aPerRead; j++) yield* write(key("a", aNext++))
        const h = store.lockRead(key("b", i))
        if (pass > 0) reads++
        if (h !== undefined) {
          if (pass > 0) hits++
          store.unlockRead(h)
        } else yield* write(key("b", i))
      }
    }
    return hits / reads
  })

describe("L1 with shares (in process)", () => {
  // B's set is half its share (64 objects, 2 tenants: 32 each); A stores 4 chunks per B read, 10× its share a pass
  // and more: under one LRU each B chunk is 16 B reads + 64 A writes old when re-read, past the capacity.
  const SET = CAPACITY_OBJECTS / 4
  const A_PER_READ = 4
  const ROUNDS = 20

  it.effect(`B re-reading ${SET} chunks while A stores ${A_PER_READ} per read: B's hit ratio with shares is ≥ 95 % of B alone; without shares B misses`, () =>
    Effect.gen(function*() {
      const weights = () => 1
      const alone = yield* hitRatio(yield* L1Store.make(CAPACITY_OBJECTS * OBJECT_BYTES, 0, weights), SET, 0, ROUNDS)
      const shared = yield* hitRatio(yield* L1Store.make(CAPACITY_OBJECTS * OBJECT_BYTES, 0, weights), SET, A_PER_READ, ROUNDS)
      const lruOnly = yield* hitRatio(yield* L1Store.make(CAPACITY_OBJECTS * OBJECT_BYTES, 0), SET, A_PER_READ, ROUNDS)
      assert.strictEqual(alone, 1)
      assert.isAtLeast(shared, 0.95 * alone, `with shares B hit ${shared}, alone ${alone}`)
      assert.strictEqual(shared, 1)
      // The problem shares answer: with one LRU for both, A's writes push every chunk of B out before B reads it again.
      assert.strictEqual(lruOnly, 0, `without shares B hit ${lruOnly}`)
    }))

  it.effect("status rows: each group's bytes, weight, share and evictions", () =>
    Effect.gen(function*() {
      const store = yield* L1Store.make(CAPACITY_OBJECTS * OBJECT_BYTES, 0, (g) => (g === "b" ? 3 : 1))
      yield* hitRatio(store, SET, A_PER_READ, 2)
      const groups = store.stats().groups!
      assert.deepStrictEqual(groups.map((g) => g.group), ["a", "b"])
      const [a, b] = groups
      assert.deepStrictEqual([a!.weight, b!.weight], [1, 3])
      assert.deepStrictEqual([a!.shareBytes, b!.shareBytes], [16 * OBJECT_BYTES, 48 * OBJECT_BYTES])
      assert.strictEqual(b!.bytes, SET * OBJECT_BYTES)
      assert.strictEqual(b!.evictions, 0)
      assert.strictEqual(a!.bytes, (CAPACITY_OBJECTS - SET) * OBJECT_BYTES)
      // A stored 4 × 16 × 3 passes = 192 chunks and holds 48: the rest were evicted, all of them its own.
      assert.strictEqual(a!.evictions, A_PER_READ * SET * 3 - (CAPACITY_OBJECTS - SET))
      assert.strictEqual(store.stats().evictions, a!.evictions)
    }))
})
