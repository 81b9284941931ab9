/**
 * The request barrier (DESIGN §5 "messages already received are handled
 * before anyone is judged"), on the TestClock: its timeout is Clock time.
 * Its one real wait is a turn of the event loop (setImmediate), never a timer.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect, Fiber } from "effect"
import { TestClock } from "effect/testing"
import { RequestBarrier } from "../../../src/services/liveness/RequestBarrier.ts"

/** Turns of the event loop until `holds`: the waiter is registered after the barrier's own setImmediate. */
const until = (holds: () => boolean) =>
  Effect.gen(function*() {
    while (!holds()) yield* Effect.promise(() => new Promise<void>((resolve) => setImmediate(resolve)))
  })

describe("RequestBarrier", () => {
  it.effect("waits until every request received before it has finished, and only those", () =>
    Effect.gen(function*() {
      const barrier = yield* RequestBarrier
      const a = barrier.enter()
      const b = barrier.enter()
      const waiting = yield* Effect.forkChild(barrier.awaitReceived("5 seconds"))
      yield* until(() => barrier.stats().waiters === 1)
      const later = barrier.enter()
      barrier.exit(a)
      yield* Effect.yieldNow
      assert.isUndefined(waiting.pollUnsafe(), "still waiting for b")
      barrier.exit(b)
      yield* Fiber.join(waiting)
      assert.deepStrictEqual(barrier.stats(), { waiters: 0, unfinished: 1 })
      barrier.exit(later)
      assert.deepStrictEqual(barrier.stats(), { waiters: 0, unfinished: 0 })
    }).pipe(Effect.provide(RequestBarrier.layerTest)))

  it.effect("gives up after its timeout, and not before", () =>
    Effect.gen(function*() {
      const barrier = yield* RequestBarrier
      barrier.enter()
      const waiting = yield* Effect.forkChild(barrier.awaitReceived("50 millis"))
      yield* until(() => barrier.stats().waiters === 1)
      yield* TestClock.adjust("49 millis")
      assert.isUndefined(waiting.pollUnsafe(), "waiting until its timeout")
      yield* TestClock.adjust("1 millis")
      yield* Fiber.join(waiting)
    }).pipe(Effect.provide(RequestBarrier.layerTest)))

  it.effect("a waiter that timed out is removed: waiters do not pile up behind a request that never finishes", () =>
    Effect.gen(function*() {
      const barrier = yield* RequestBarrier
      barrier.enter() // never finishes
      for (let i = 0; i < 3; i++) {
        const waiting = yield* Effect.forkChild(barrier.awaitReceived("1 second"))
        yield* until(() => barrier.stats().waiters === 1)
        yield* TestClock.adjust("1 second")
        yield* Fiber.join(waiting)
        assert.deepStrictEqual(barrier.stats(), { waiters: 0, unfinished: 1 }, `after timeout ${i + 1}`)
      }
    }).pipe(Effect.provide(RequestBarrier.layerTest)))

  it.effect("an interrupted waiter is removed too", () =>
    Effect.gen(function*() {
      const barrier = yield* RequestBarrier
      barrier.enter()
      const waiting = yield* Effect.forkChild(barrier.awaitReceived("1 minute"))
      yield* until(() => barrier.stats().waiters === 1)
      yield* Fiber.interrupt(waiting)
      assert.deepStrictEqual(barrier.stats(), { waiters: 0, unfinished: 1 })
    }).pipe(Effect.provide(RequestBarrier.layerTest)))
})
