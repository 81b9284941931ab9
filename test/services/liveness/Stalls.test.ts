/**
 * The server's own stalls (Stalls.ts): the event-loop ticker's threshold and
 * one WARNING per pause when both detectors see it, on a stopped process
 * modelled on the TestClock (StoppedClock.ts). No real time.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { TestClock } from "effect/testing"
import { ServerStalls, watchEventLoop } from "../../../src/services/liveness/Stalls.ts"
import { livenessEnv } from "../../support/LivenessEnv.ts"
import { stoppedBetween } from "./StoppedClock.ts"

/** The ticker alone, forked in the test's scope, for `seconds` of clock time. */
const tickerFor = (seconds: number) =>
  Effect.gen(function*() {
    yield* Effect.forkScoped(watchEventLoop)
    yield* TestClock.adjust(`${seconds} seconds`)
  }).pipe(Effect.scoped, Effect.provide(ServerStalls.layerTest))

describe("event-loop ticker", () => {
  // Ticks every 250 ms: the tick due at 1250 ms falls in the stop and wakes at its end.
  it.effect("a tick late by exactly 1 s: no WARNING, nothing counted", () =>
    Effect.gen(function*() {
      const { warnings, metrics } = yield* stoppedBetween(1_000, 2_250, tickerFor(5))
      assert.deepStrictEqual(warnings, [])
      assert.notMatch(metrics, /mpcache_server_stalls_total/)
    }))

  it.effect("a tick late by 1 s + 1 ms: one WARNING with the figures, counted once", () =>
    Effect.gen(function*() {
      const { warnings, metrics } = yield* stoppedBetween(1_000, 2_251, tickerFor(5))
      assert.deepStrictEqual(warnings, [
        "server stalled for 1.001 s (event loop 1.001 s late); liveness deadlines were extended by 1.001 s"
      ])
      assert.match(metrics, /^mpcache_server_stalls_total\{source="event_loop"\} 1$/m)
      assert.match(metrics, /^mpcache_server_stall_seconds_sum 1\.001$/m)
    }))

  it.effect("a report overlapping the last one told is the same pause and is dropped; a later pause is told", () =>
    Effect.gen(function*() {
      const stalls = yield* ServerStalls
      assert.isTrue(yield* stalls.report({ source: "event_loop", fromMs: 1_000, toMs: 3_000, what: "first" }))
      assert.isFalse(yield* stalls.report({ source: "reaper", fromMs: 2_000, toMs: 3_001, what: "the same pause" }))
      assert.isTrue(yield* stalls.report({ source: "reaper", fromMs: 3_000, toMs: 5_000, what: "second" }))
    }).pipe(Effect.provide(ServerStalls.layerTest)))
})

describe("one pause, both detectors", () => {
  it.effect("a stopped server (reaper scan due inside the stop) is told once, by the detector that woke first", () =>
    Effect.gen(function*() {
      // Defaults: the reaper scans every 5 s; its scan due at 5 s and the tick due at 4250 ms both wake at 12 s.
      const { warnings, metrics } = yield* stoppedBetween(
        4_000,
        12_000,
        Effect.gen(function*() {
          yield* TestClock.adjust("20 seconds")
        }).pipe(Effect.scoped, Effect.provide(livenessEnv()))
      )
      assert.deepStrictEqual(warnings, [
        "server stalled for 7.750 s (event loop 7.750 s late); liveness deadlines were extended by 7.750 s"
      ])
      assert.match(metrics, /^mpcache_server_stalls_total\{source="event_loop"\} 1$/m)
      assert.notMatch(metrics, /mpcache_server_stalls_total\{source="reaper"\}/)
    }))
})
