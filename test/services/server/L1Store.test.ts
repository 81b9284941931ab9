import { assert, describe, it } from "@effect/vitest"
import { Effect, Exit } from "effect"
import { L1Store, type Reservation } from "../../../src/services/server/L1Store.ts"
import type { ObjectKey } from "../../../src/services/server/ObjectKey.ts"

const key = (n: number, rank = 0): ObjectKey => ({
  hash: new Uint8Array(32).fill(n),
  modelName: "m",
  kvRank: rank,
  cacheSalt: ""
})

const reserve = (l1: L1Store["Service"], k: ObjectKey, size: number) =>
  Effect.gen(function*() {
    const r = yield* l1.reserveWrite(k, size)
    assert.strictEqual(r._tag, "Reserved")
    return (r as { readonly reservation: Reservation }).reservation
  })

const put = (l1: L1Store["Service"], k: ObjectKey, size: number) =>
  Effect.gen(function*() {
    const r = yield* reserve(l1, k, size)
    assert.isTrue(yield* l1.commit(r))
  })

describe("L1Store", () => {
  it.effect("a write reservation is invisible until committed", () =>
    Effect.gen(function*() {
      const l1 = yield* L1Store
      const r = yield* reserve(l1, key(1), 100)
      assert.isFalse(l1.contains(key(1)))
      assert.strictEqual(l1.lockRead(key(1)), undefined)
      assert.deepStrictEqual(yield* l1.reserveWrite(key(1), 100), { _tag: "Exists" })
      assert.isTrue(yield* l1.commit(r))
      assert.isTrue(l1.contains(key(1)))
      assert.strictEqual(l1.stats().usedBytes, 100)
    }).pipe(Effect.provide(L1Store.layerTest(1000))))

  it.effect("an aborted reservation frees its bytes and publishes nothing", () =>
    Effect.gen(function*() {
      const l1 = yield* L1Store.make(1000)
      const r = yield* reserve(l1, key(1), 300)
      yield* l1.abort(r)
      assert.isFalse(l1.contains(key(1)))
      assert.isFalse(yield* l1.commit(r))
      assert.deepStrictEqual(l1.stats(), {
        capacityBytes: 1000,
        usedBytes: 0,
        objects: 0,
        reservedObjects: 0,
        lockedObjects: 0,
        evictions: 0
      })
    }))

  it.effect("evicts least recently used first; a read marks an object used", () =>
    Effect.gen(function*() {
      const l1 = yield* L1Store.make(300)
      yield* put(l1, key(1), 100)
      yield* put(l1, key(2), 100)
      yield* put(l1, key(3), 100)
      const h = l1.lockRead(key(1))!
      l1.unlockRead(h)
      yield* put(l1, key(4), 100)
      assert.deepStrictEqual([1, 2, 3, 4].map((n) => l1.contains(key(n))), [true, false, true, true])
      assert.strictEqual(l1.stats().evictions, 1)
    }))

  it.effect("eviction never touches locked or reserved objects; with nothing evictable the store is refused", () =>
    Effect.gen(function*() {
      const l1 = yield* L1Store.make(300)
      yield* put(l1, key(1), 100)
      yield* put(l1, key(2), 100)
      const locked = l1.lockRead(key(1))!
      assert.isDefined(l1.lockRead(key(2)))
      const pending = yield* reserve(l1, key(3), 100)
      assert.deepStrictEqual(yield* l1.reserveWrite(key(4), 100), { _tag: "Full" })
      assert.strictEqual(l1.stats().usedBytes, 300)
      assert.deepStrictEqual([1, 2, 3].map((n) => l1.contains(key(n))), [true, true, false])
      l1.unlockRead(locked)
      yield* put(l1, key(4), 100)
      assert.deepStrictEqual([1, 2, 4].map((n) => l1.contains(key(n))), [false, true, true])
      assert.isTrue(yield* l1.commit(pending))
      assert.strictEqual(l1.stats().usedBytes, 300)
    }))

  it.effect("an object larger than the capacity is refused", () =>
    Effect.gen(function*() {
      const l1 = yield* L1Store.make(100)
      assert.deepStrictEqual(yield* l1.reserveWrite(key(1), 101), { _tag: "Full" })
      assert.strictEqual(l1.stats().usedBytes, 0)
    }))

  it.effect("keys differ by rank, model and salt", () =>
    Effect.gen(function*() {
      const l1 = yield* L1Store.make(1000)
      yield* put(l1, key(1, 0), 10)
      assert.isFalse(l1.contains(key(1, 1)))
      assert.isFalse(l1.contains({ ...key(1), modelName: "other" }))
      assert.isFalse(l1.contains({ ...key(1), cacheSalt: "tenant" }))
    }))

  it.effect("CLEAR drops unlocked objects; force also drops locked and reserved ones", () =>
    Effect.gen(function*() {
      const l1 = yield* L1Store.make(1000)
      yield* put(l1, key(1), 10)
      yield* put(l1, key(2), 10)
      const h = l1.lockRead(key(2))!
      const r = yield* reserve(l1, key(3), 10)
      assert.strictEqual(yield* l1.clear(false), 1)
      assert.deepStrictEqual([1, 2].map((n) => l1.contains(key(n))), [false, true])
      assert.strictEqual(yield* l1.clear(true), 2)
      assert.strictEqual(l1.stats().objects, 0)
      assert.isFalse(yield* l1.commit(r))
      l1.unlockRead(h)
      assert.strictEqual(l1.stats().usedBytes, 0)
    }))

  it.effect("CLEAR force keeps a locked object's extent from other objects until its last unlock", () =>
    Effect.gen(function*() {
      const l1 = yield* L1Store.make(20)
      yield* put(l1, key(1), 10)
      yield* put(l1, key(2), 10)
      const first = l1.lockRead(key(2))!
      const second = l1.lockRead(key(2))!
      assert.strictEqual(yield* l1.clear(true), 2)
      assert.deepStrictEqual([l1.stats().objects, l1.stats().usedBytes], [0, 10])
      const r3 = yield* reserve(l1, key(3), 10)
      assert.strictEqual(r3.offset, 0)
      assert.deepStrictEqual(yield* l1.reserveWrite(key(4), 10), { _tag: "Full" })
      l1.unlockRead(first)
      assert.deepStrictEqual(yield* l1.reserveWrite(key(4), 10), { _tag: "Full" })
      l1.unlockRead(second)
      l1.unlockRead(second) // one unlock too many: no effect
      assert.strictEqual(l1.stats().usedBytes, 10)
      const r4 = yield* reserve(l1, key(4), 10)
      assert.strictEqual(r4.offset, 10)
    }))

  it.effect("CLEAR force keeps a reservation's extent until it is committed (refused) or aborted", () =>
    Effect.gen(function*() {
      const l1 = yield* L1Store.make(20)
      const a = yield* reserve(l1, key(1), 10)
      const b = yield* reserve(l1, key(2), 10)
      assert.strictEqual(yield* l1.clear(true), 2)
      assert.isFalse(l1.isPending(a))
      assert.deepStrictEqual(yield* l1.reserveWrite(key(3), 10), { _tag: "Full" })
      assert.isFalse(yield* l1.commit(a))
      assert.isFalse(yield* l1.commit(a))
      assert.strictEqual(l1.stats().usedBytes, 10)
      assert.strictEqual((yield* reserve(l1, key(3), 10)).offset, 0)
      yield* l1.abort(b)
      assert.strictEqual(l1.stats().usedBytes, 10)
      assert.strictEqual((yield* reserve(l1, key(4), 10)).offset, 10)
    }))

  it.effect("headroom: each object's extent starts that many bytes before its bytes, and counts as used", () =>
    Effect.gen(function*() {
      const l1 = yield* L1Store.make(1000, 64)
      yield* put(l1, key(1), 100)
      yield* put(l1, key(2), 128)
      const h1 = l1.lockRead(key(1))!
      const h2 = l1.lockRead(key(2))!
      assert.deepStrictEqual([h1.offset, h1.bytes.length, h1.extent.length], [64, 100, 164])
      assert.deepStrictEqual([h2.offset % 64, h2.bytes.length, h2.extent.length], [0, 128, 192])
      assert.strictEqual(h1.extent.byteOffset + 64, h1.bytes.byteOffset)
      assert.strictEqual(l1.stats().usedBytes, 356)
      assert.deepStrictEqual(yield* l1.reserveWrite(key(3), 1000 - 64 - 356 + 1), { _tag: "Full" })
      l1.unlockRead(h1)
      l1.unlockRead(h2)
      assert.strictEqual(yield* l1.clear(false), 2)
      assert.strictEqual(l1.stats().usedBytes, 0)
      assert.strictEqual((yield* reserve(l1, key(3), 1000 - 64)).offset, 64)
    }))

  it.effect("fill copies exactly a reservation's size into it; another size is a defect", () =>
    Effect.gen(function*() {
      const l1 = yield* L1Store.make(200, 64)
      const r = yield* reserve(l1, key(1), 8)
      yield* l1.fill(r, Uint8Array.of(1, 2, 3, 4, 5, 6, 7, 8))
      assert.isTrue(yield* l1.commit(r))
      assert.deepStrictEqual([...l1.lockRead(key(1))!.bytes], [1, 2, 3, 4, 5, 6, 7, 8])
      const r2 = yield* reserve(l1, key(2), 8)
      const exit = yield* Effect.exit(l1.fill(r2, new Uint8Array(7)))
      assert.isTrue(Exit.hasDies(exit))
    }))

  it.effect("a placement that cannot fit after eviction evicts nothing (free bytes enough, but fragmented around a locked object)", () =>
    Effect.gen(function*() {
      const l1 = yield* L1Store.make(300)
      yield* put(l1, key(1), 100)
      yield* put(l1, key(2), 100)
      yield* put(l1, key(3), 100)
      const middle = l1.lockRead(key(2))!
      // 200 bytes are evictable (objects 1 and 3), but never contiguous while object 2 is locked between them.
      assert.deepStrictEqual(yield* l1.reserveWrite(key(4), 200), { _tag: "Full" })
      assert.deepStrictEqual([1, 2, 3].map((n) => l1.contains(key(n))), [true, true, true])
      assert.strictEqual(l1.stats().evictions, 0)
      // Room for 100: only the least recently used goes.
      yield* put(l1, key(5), 100)
      assert.deepStrictEqual([1, 2, 3, 5].map((n) => l1.contains(key(n))), [false, true, true, true])
      assert.strictEqual(l1.stats().evictions, 1)
      l1.unlockRead(middle)
    }))

  it.effect("eviction takes the shortest LRU run that leaves a contiguous extent, not just enough bytes", () =>
    Effect.gen(function*() {
      const l1 = yield* L1Store.make(600)
      for (let n = 1; n <= 6; n++) yield* put(l1, key(n), 100) // offsets 0, 100, …, 500; LRU order 1..6
      const locked = l1.lockRead(key(3))!
      // LRU: 1, 2, 4, 5, 6 evictable (3 locked at 200). 200 contiguous: [0, 200) after evicting 1 and 2.
      const r = yield* reserve(l1, key(7), 200)
      assert.strictEqual(r.offset, 0)
      assert.deepStrictEqual([1, 2, 3, 4, 5, 6].map((n) => l1.contains(key(n))), [false, false, true, true, true, true])
      assert.strictEqual(l1.stats().evictions, 2)
      // Touch 4 (now most recent): 300 contiguous needs 4, 5 and 6 ([300, 600)); the LRU order is 5, 6, 4.
      l1.unlockRead(l1.lockRead(key(4))!)
      const r2 = yield* reserve(l1, key(8), 300)
      assert.strictEqual(r2.offset, 300)
      assert.deepStrictEqual([3, 4, 5, 6].map((n) => l1.contains(key(n))), [true, false, false, false])
      assert.strictEqual(l1.stats().evictions, 5)
      l1.unlockRead(locked)
    }))
})

