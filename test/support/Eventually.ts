/**
 * Waiting for an event under TestClock: yields to the other fibers until
 * `poll` answers something other than undefined, and returns it. Work on
 * the libuv pool (a MAC, a copy) is not driven by TestClock, so after the
 * first hundred turns each wait is a real millisecond, up to 10 s of real
 * time (a bound on a hang, not a timing).
 */
import { assert } from "@effect/vitest"
import { Effect } from "effect"
import { TestClock } from "effect/testing"

export const eventually = <A, E, R>(what: string, poll: Effect.Effect<A | undefined, E, R>) =>
  Effect.gen(function*() {
    const deadline = Date.now() + 10_000
    for (let turn = 0; ; turn++) {
      const a = yield* poll
      if (a !== undefined) return a
      if (Date.now() > deadline) return assert.fail(`${what} did not happen within 10 s`)
      yield* turn < 100 ? Effect.yieldNow : TestClock.withLive(Effect.sleep("1 millis"))
    }
  })
