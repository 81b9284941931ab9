/**
 * Series that exist from the start (src/services/metrics/Series.ts, issue 25
 * item 6): declared series are absent until `existFromStart`, then each is at
 * its zero state in the registry in context, and values already there are
 * kept. Each test runs on its own registry.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect, Metric } from "effect"
import { PrometheusMetrics } from "effect/observability"
import { byLabel, existFromStart, fromStart } from "../../../src/services/metrics/Series.ts"

const plain = fromStart(Metric.counter("series_test_plain_total", { description: "no label", incremental: true }))
const level = fromStart(Metric.gauge("series_test_level", { description: "a gauge" }))
const crossed = fromStart(Metric.counter("series_test_crossed_total", { incremental: true }), {
  listener: ["zmq", "http"],
  reason: ["cap", "idle"]
})
const latency = fromStart(Metric.histogram("series_test_seconds", { boundaries: [0.1, 1] }), { op: ["ping"] })
const byReason = byLabel(Metric.counter("series_test_by_reason_total", { incremental: true }), "reason", ["timeout", "grace"])
/** Not declared: appears at its first update only. */
const undeclared = Metric.counter("series_test_undeclared_total", { incremental: true })

/** The Prometheus text of the registry in context, the lines of the test's metrics only. */
const lines = Effect.map(PrometheusMetrics.format(), (text) => text.split("\n").filter((l) => l.startsWith("series_test_")))

const isolated = <A, E>(effect: Effect.Effect<A, E>) => Effect.provideService(effect, Metric.MetricRegistry, new Map())

describe("Series", () => {
  it.effect("nothing is registered before existFromStart", () =>
    isolated(Effect.gen(function*() {
      assert.deepStrictEqual(yield* lines, [])
    })))

  it.effect("existFromStart registers every declared series at 0: each combination of the listed label values", () =>
    isolated(Effect.gen(function*() {
      yield* existFromStart
      assert.deepStrictEqual(yield* lines, [
        "series_test_plain_total 0",
        "series_test_level 0",
        `series_test_crossed_total{listener="zmq",reason="cap"} 0`,
        `series_test_crossed_total{listener="zmq",reason="idle"} 0`,
        `series_test_crossed_total{listener="http",reason="cap"} 0`,
        `series_test_crossed_total{listener="http",reason="idle"} 0`,
        `series_test_seconds_bucket{op="ping",le="0.1"} 0`,
        `series_test_seconds_bucket{op="ping",le="1"} 0`,
        `series_test_seconds_bucket{op="ping",le="+Inf"} 0`,
        `series_test_seconds_sum{op="ping"} 0`,
        `series_test_seconds_count{op="ping"} 0`,
        `series_test_by_reason_total{reason="timeout"} 0`,
        `series_test_by_reason_total{reason="grace"} 0`
      ])
    })))

  it.effect("byLabel's handles are the declared series; values already counted are kept, and running it again changes nothing", () =>
    isolated(Effect.gen(function*() {
      yield* Metric.update(byReason.grace, 3)
      yield* Metric.update(level, 7)
      yield* Metric.update(undeclared, 1)
      yield* existFromStart
      yield* existFromStart
      const text = yield* lines
      assert.include(text, `series_test_by_reason_total{reason="grace"} 3`)
      assert.include(text, `series_test_by_reason_total{reason="timeout"} 0`)
      assert.include(text, "series_test_level 7")
      assert.include(text, "series_test_undeclared_total 1")
      assert.strictEqual(text.filter((l) => l.startsWith("series_test_by_reason_total")).length, 2)
    })))
})
