/**
 * The server's own stalls, told to operators (DESIGN §5 "the server's own
 * stalls never count as a worker's silence"; issue 18 "operators must see
 * what the server decided").
 *
 * Two detectors see a stall, both on the Clock (so TestClock drives them):
 * the reaper, whose scheduled scan starts later than one scan period after
 * it was due (Reaper.ts), and `watchEventLoop`, a ticker that measures its
 * own lateness and calls more than a second late a stall (a blocked event
 * loop, a stopped process). Each reports the interval it saw, in Clock
 * millis, to `ServerStalls`, which logs one WARNING ("server stalled for
 * X s (…); liveness deadlines were extended by X s") and counts it in
 * `mpcache_server_stalls_total{source}` and `mpcache_server_stall_seconds`.
 *
 * One pause is told once: both detectors see a stopped process, and their
 * intervals both end when it runs again, so a report whose interval starts
 * before the end of the last one told is the same pause and is dropped,
 * whichever detector came first (after a SIGCONT, the ticker usually: its
 * tick was due first, its period being shorter).
 *
 * The ticker also leaves its facts with ServerStalls (`eventLoop()`: when it
 * last ticked, its last late tick), which `/livez` judges (issue 27 item 3,
 * src/services/server/Readiness.ts). The Reaper forks the reporting ticker;
 * with the reaper off, Readiness forks a quiet one that only records, never
 * WARNs (the WARNING speaks of liveness deadlines).
 */
import { Clock, Context, Effect, Layer, Metric } from "effect"
import { byLabel, fromStart } from "../metrics/Series.ts"

/** Which detector saw a stall: the metric's `source` label. */
export const STALL_SOURCES = ["reaper", "event_loop"] as const
export type StallSource = typeof STALL_SOURCES[number]

/** One stall as a detector saw it. */
export interface Stall {
  readonly source: StallSource
  /** When the detector should have run (Clock millis). */
  readonly fromMs: number
  /** When it ran (Clock millis): `toMs − fromMs` is how long the server was stopped, at least. */
  readonly toMs: number
  /** What was late, for the WARNING's parenthesis ("reaper scan started 5.001 s late, period 5 s"). */
  readonly what: string
}

const stallsTotal = Metric.counter("mpcache_server_stalls_total", {
  description: "Stalls of the server itself (reaper scan late by more than a period, event loop late by more than 1 s), by detector",
  incremental: true
})
const stallsBy: Readonly<Record<StallSource, Metric.Metric<number, unknown>>> = byLabel(stallsTotal, "source", STALL_SOURCES)
const stallSeconds = fromStart(Metric.histogram("mpcache_server_stall_seconds", {
  description: "How long each reported stall of the server lasted",
  boundaries: Metric.exponentialBoundaries({ start: 1, factor: 2, count: 10 })
}))

/** Seconds with millisecond precision, as the WARNINGs print them. */
export const formatStallSeconds = (ms: number): string => (ms / 1000).toFixed(3)

/** What the event-loop ticker saw last (Clock millis), for `/livez`. */
export interface EventLoopFacts {
  /** When the ticker started (Clock millis). */
  readonly startedAtMs: number
  /** When it last woke (Clock millis); `startedAtMs` before its first tick. */
  readonly lastTickMs: number
  /** Its last tick later than `EVENT_LOOP_STALL_MS` (due `fromMs`, woke `toMs`); undefined when none was. */
  readonly lastStall: { readonly fromMs: number; readonly toMs: number } | undefined
}

/** Where the detectors report the server's stalls: one WARNING and one count per pause. */
export class ServerStalls extends Context.Service<ServerStalls, {
  /** Records one tick of the event-loop ticker: due at `dueMs`, woke at `nowMs` (Clock millis). */
  readonly ticked: (dueMs: number, nowMs: number) => void
  /** The ticker's facts so far; undefined until a ticker started (`ticking`). */
  readonly eventLoop: () => EventLoopFacts | undefined
  /** A ticker starts at `nowMs` (Clock millis). */
  readonly ticking: (nowMs: number) => void
  /**
   * Tells `stall` (one WARNING, the metrics) unless its interval overlaps
   * the last one told (the same pause, seen by the other detector).
   * Returns whether it was told.
   */
  readonly report: (stall: Stall) => Effect.Effect<boolean>
}>()("mpcache/services/ServerStalls") {
  /** The reporter; the detectors are the reaper's loop and `watchEventLoop`, forked by the Reaper. */
  static readonly layer = Layer.sync(this, () => {
    let toldUntilMs = -Infinity
    let loop: EventLoopFacts | undefined
    return {
      ticking: (nowMs) => {
        loop = { startedAtMs: nowMs, lastTickMs: nowMs, lastStall: loop?.lastStall }
      },
      ticked: (dueMs, nowMs) => {
        const startedAtMs = loop?.startedAtMs ?? dueMs
        const late = nowMs - dueMs > EVENT_LOOP_STALL_MS
        loop = { startedAtMs, lastTickMs: nowMs, lastStall: late ? { fromMs: dueMs, toMs: nowMs } : loop?.lastStall }
      },
      eventLoop: () => loop,
      report: (stall) =>
        Effect.gen(function*() {
          if (stall.fromMs < toldUntilMs) return false
          toldUntilMs = stall.toMs
          const ms = stall.toMs - stall.fromMs
          const s = formatStallSeconds(ms)
          yield* Effect.logWarning(`server stalled for ${s} s (${stall.what}); liveness deadlines were extended by ${s} s`).pipe(
            Effect.annotateLogs({ source: stall.source, stalled_seconds: ms / 1000 })
          )
          yield* Metric.update(stallsBy[stall.source], 1)
          yield* Metric.update(stallSeconds, ms / 1000)
          return true
        })
    }
  })
  /** For tests: the real reporter (it needs nothing; its WARNINGs and metrics go where the test's logger and registry are). */
  static readonly layerTest = this.layer
}

/** The event-loop ticker's period, ms: short, so its lateness is close to the whole pause. */
export const EVENT_LOOP_TICK_MS = 250
/** A tick later than this, ms, is a stall (issue 18: "an event-loop delay over a second"). */
export const EVENT_LOOP_STALL_MS = 1000

/**
 * The event-loop ticker: sleeps `EVENT_LOOP_TICK_MS`, records each tick with
 * ServerStalls (`ticked`), and, when `report`, reports a stall when it wakes
 * more than `EVENT_LOOP_STALL_MS` after it was due. Runs until interrupted
 * (fork it in a scope).
 */
export const makeWatchEventLoop = (options: { readonly report: boolean }): Effect.Effect<never, never, ServerStalls> =>
  Effect.gen(function*() {
    const stalls = yield* ServerStalls
    stalls.ticking(yield* Clock.currentTimeMillis)
    while (true) {
      const dueMs = (yield* Clock.currentTimeMillis) + EVENT_LOOP_TICK_MS
      yield* Effect.sleep(EVENT_LOOP_TICK_MS)
      const nowMs = yield* Clock.currentTimeMillis
      stalls.ticked(dueMs, nowMs)
      if (options.report && nowMs - dueMs > EVENT_LOOP_STALL_MS) {
        yield* stalls.report({
          source: "event_loop",
          fromMs: dueMs,
          toMs: nowMs,
          what: `event loop ${formatStallSeconds(nowMs - dueMs)} s late`
        })
      }
    }
  })

/** The ticker that reports its stalls (the reaper runs): `makeWatchEventLoop({ report: true })`. */
export const watchEventLoop: Effect.Effect<never, never, ServerStalls> = makeWatchEventLoop({ report: true })
