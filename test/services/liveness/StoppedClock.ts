/**
 * Helpers of the stall tests: `observeStalls` collects the stall WARNINGs
 * and the metrics of a run; `stoppedBetween` runs it as a stopped server
 * process on the TestClock (SIGSTOP, then SIGCONT): every sleep that would
 * end strictly inside the stop ends when it ends, as Node's timers do once
 * the process runs again.
 */
import { Clock, Duration, Effect, Metric } from "effect"
import { PrometheusMetrics } from "effect/observability"
import { TestClock } from "effect/testing"
import { captureLogs, type CapturedLog } from "../../support/FakeMqClient.ts"

/** The server-stall WARNINGs among `logs`, their text. */
const stallWarnings = (logs: ReadonlyArray<CapturedLog>) =>
  logs.filter((l) => l.level === "Warn" && l.text.startsWith("server stalled")).map((l) => l.text)

/**
 * Runs `body` with its own logs and metrics: returns what it returned, the
 * stall WARNINGs and the Prometheus text.
 */
export const observeStalls = <A, E, R>(body: Effect.Effect<A, E, R>) => {
  const logs: Array<CapturedLog> = []
  return Effect.gen(function*() {
    const result = yield* body
    return { result, warnings: stallWarnings(logs), metrics: yield* PrometheusMetrics.format() }
  }).pipe(Effect.provide(captureLogs(logs)), Effect.provideService(Metric.MetricRegistry, new Map()))
}

/**
 * `observeStalls` of `body` on the test clock as a process stopped from
 * `fromMs` to `toMs` (Clock millis).
 */
export const stoppedBetween = <A, E>(fromMs: number, toMs: number, body: Effect.Effect<A, E>) =>
  observeStalls(Effect.gen(function*() {
    const testClock = yield* TestClock.testClockWith(Effect.succeed)
    const stopped: TestClock.TestClock = {
      ...testClock,
      sleep: (duration) =>
        Effect.gen(function*() {
          yield* testClock.sleep(duration)
          const now = testClock.currentTimeMillisUnsafe()
          if (now > fromMs && now < toMs) yield* testClock.sleep(Duration.millis(toMs - now))
        })
    }
    return yield* body.pipe(Effect.provideService(Clock.Clock, stopped))
  }))
