import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
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
      const l1 = yield* L1Store.make(1000)
      const r = yield* reserve(l1, key(1), 100)
      assert.isFalse(l1.contains(key(1)))
      assert.strictEqual(l1.lockRead(key(1)), undefined)
      assert.deepStrictEqual(yield* l1.reserveWrite(key(1), 100), { _tag: "Exists" })
      assert.isTrue(yield* l1.commit(r))
      assert.isTrue(l1.contains(key(1)))
      assert.strictEqual(l1.stats().usedBytes, 100)
    }))

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
})
