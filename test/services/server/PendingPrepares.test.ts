/**
 * The pending PREPAREs of an engine-driven strategy
 * (src/services/server/internal/PendingPrepares.ts; issue 18): their keys,
 * the TTL boundary (strictly past it), and the expiry timer on the
 * TestClock — a record is released 1 ms past the TTL and not at it, in
 * insertion order, and the timer stops when the map is empty and starts
 * again on the next insert.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect, Exit, Scope } from "effect"
import { TestClock } from "effect/testing"
import type { CacheKey } from "../../../src/schema/CacheKey.ts"
import {
  describePending,
  expiryTimer,
  isExpired,
  type Pending,
  pendingCount,
  pendingKeyOf
} from "../../../src/services/server/internal/PendingPrepares.ts"

const key = (over: Partial<CacheKey> = {}): CacheKey => ({
  model_name: "m",
  world_size: 1,
  worker_id: 0,
  token_ids: [1, 2, 3],
  start: 0,
  end: 64,
  request_id: "r1",
  cache_salt: "",
  ...over
})

describe("pending keys", () => {
  it("a key is the request and its range; two requests of the same tokens are apart", () => {
    assert.strictEqual(describePending(pendingKeyOf(key({ worker_id: 2, start: 32, end: 96 }))), "request r1 (rank 2, tokens [32, 96))")
    assert.notStrictEqual(pendingKeyOf(key()), pendingKeyOf(key({ request_id: "r2" })))
    assert.strictEqual(pendingKeyOf(key()), pendingKeyOf(key({ token_ids: [9] })))
  })

  it("expired strictly past the TTL", () => {
    assert.isFalse(isExpired({ preparedAtMs: 1000 }, 6000, 5000))
    assert.isTrue(isExpired({ preparedAtMs: 1000 }, 6001, 5000))
  })

  it("pendingCount: requests and the chunks they hold", () => {
    const m = new Map([["a", [1, 2]], ["b", [3]]])
    assert.deepStrictEqual(pendingCount(m, (v) => v.length), { requests: 2, chunks: 3 })
    assert.deepStrictEqual(pendingCount(new Map<string, Array<number>>(), (v) => v.length), { requests: 0, chunks: 0 })
  })
})

describe("expiryTimer", () => {
  it.effect("releases each record 1 ms past the TTL, not at it, oldest first; stops when empty and restarts on insert", () =>
    Effect.gen(function*() {
      const scope = yield* Scope.make()
      const map = new Map<string, Pending>()
      const released: Array<string> = []
      const timer = expiryTimer({ ttlMs: 5000, scope }, map, (k) => Effect.sync(() => released.push(k)))
      map.set("a", { preparedAtMs: 0 })
      yield* timer
      yield* TestClock.adjust("2000 millis")
      map.set("b", { preparedAtMs: 2000 })
      yield* timer // already running: no second fiber
      yield* TestClock.adjust("3000 millis") // t = 5000: exactly the TTL of "a"
      assert.deepStrictEqual(released, [])
      yield* TestClock.adjust("1 millis") // t = 5001
      assert.deepStrictEqual(released, ["a"])
      assert.deepStrictEqual([...map.keys()], ["b"])
      yield* TestClock.adjust("1999 millis") // t = 7000: exactly the TTL of "b"
      assert.deepStrictEqual(released, ["a"])
      yield* TestClock.adjust("1 millis")
      assert.deepStrictEqual(released, ["a", "b"])
      assert.strictEqual(map.size, 0)
      // Stopped: a record inserted now is released only once the timer is started again.
      map.set("c", { preparedAtMs: 7001 })
      yield* TestClock.adjust("10000 millis")
      assert.deepStrictEqual(released, ["a", "b"])
      yield* timer
      yield* TestClock.adjust("0 millis") // lets the forked timer run its first step
      assert.deepStrictEqual(released, ["a", "b", "c"])
      yield* Scope.close(scope, Exit.void)
    }))

  it.effect("closing the expiry scope stops the timer: nothing is released after", () =>
    Effect.gen(function*() {
      const scope = yield* Scope.make()
      const map = new Map<string, Pending>([["a", { preparedAtMs: 0 }]])
      const released: Array<string> = []
      yield* expiryTimer({ ttlMs: 1000, scope }, map, (k) => Effect.sync(() => released.push(k)))
      yield* Scope.close(scope, Exit.void)
      yield* TestClock.adjust("5000 millis")
      assert.deepStrictEqual(released, [])
      assert.deepStrictEqual([...map.keys()], ["a"])
    }))
})
