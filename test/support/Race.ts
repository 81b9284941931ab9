/**
 * Shared machinery of the randomized race tests
 * (test/services/server/*.race.test.ts): a tally of what each operation
 * ended with (no defect allowed), and a seeded run of many fibers on
 * TestClock with a driver fiber moving the clock, so that a failing seed
 * replays its interleaving.
 */
import { assert } from "@effect/vitest"
import { Effect, Exit, Fiber, Random, Scheduler } from "effect"
import { TestClock } from "effect/testing"

/** Counts of each outcome: a success's label, or `fail:<error tag>`. */
export const makeOutcomes = (context: string) => {
  const outcomes = new Map<string, number>()
  const count = (k: string) => outcomes.set(k, (outcomes.get(k) ?? 0) + 1)
  return {
    outcomes,
    /** Records `exit`; a defect (anything but a typed failure) fails the test, naming `context`. */
    record: (exit: Exit.Exit<string, unknown>) => {
      if (Exit.isSuccess(exit)) return count(exit.value)
      const reason = exit.cause.reasons[0]
      assert.strictEqual(reason?._tag, "Fail", `${context}no defect: ${String(exit.cause)}`)
      count(`fail:${reason?._tag === "Fail" ? (reason.error as { _tag: string })._tag : "?"}`)
    },
    /** The tally, for assertion messages. */
    seen: () => `${context}${JSON.stringify([...outcomes])}`
  }
}

/**
 * Runs `op` `opsPerFiber` times in each of `fibers` concurrent fibers under
 * `Random.withSeed(seed)`, on TestClock: a driver fiber moves the clock 1 ms
 * per scheduler turn until every fiber is done. `maxOpsBeforeYield` makes
 * the fibers yield more often than the default (more interleavings).
 */
export const runClockedRace = <E, R>(
  op: Effect.Effect<void, E, R>,
  options: { readonly fibers: number; readonly opsPerFiber: number; readonly seed: string; readonly maxOpsBeforeYield?: number }
): Effect.Effect<void, E, R> =>
  Effect.gen(function*() {
    let running = true
    const driver = yield* Effect.forkChild(Effect.whileLoop({
      while: () => running,
      body: () => Effect.andThen(TestClock.adjust("1 millis"), Effect.yieldNow),
      step: () => {}
    }))
    const all = Effect.forEach(
      Array.from({ length: options.fibers }, (_, i) => i),
      () => Effect.repeat(op, { times: options.opsPerFiber - 1 }),
      { concurrency: "unbounded", discard: true }
    ).pipe(Random.withSeed(options.seed))
    yield* (options.maxOpsBeforeYield === undefined ? all : Effect.provideService(all, Scheduler.MaxOpsBeforeYield, options.maxOpsBeforeYield)).pipe(
      Effect.ensuring(Effect.sync(() => {
        running = false
      }))
    )
    yield* Fiber.join(driver)
  })
