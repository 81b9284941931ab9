import { assert, describe, it } from "@effect/vitest"
import { Effect, Fiber } from "effect"
import { RequestBarrier } from "../../../src/services/liveness/RequestBarrier.ts"

describe("RequestBarrier", () => {
  it.live("waits until every request received before it has finished, and only those", () =>
    Effect.gen(function*() {
      const barrier = yield* RequestBarrier
      const a = barrier.enter()
      const b = barrier.enter()
      const waiting = yield* Effect.forkChild(barrier.awaitReceived("5 seconds"))
      yield* Effect.yieldNow
      const later = barrier.enter()
      barrier.exit(a)
      yield* Effect.sleep("20 millis")
      assert.isUndefined(waiting.pollUnsafe(), "still waiting for b")
      barrier.exit(b)
      yield* Fiber.join(waiting)
      barrier.exit(later)
    }).pipe(Effect.provide(RequestBarrier.layer)))

  it.live("gives up after its timeout", () =>
    Effect.gen(function*() {
      const barrier = yield* RequestBarrier
      barrier.enter()
      yield* barrier.awaitReceived("50 millis")
    }).pipe(Effect.provide(RequestBarrier.layer)))
})
