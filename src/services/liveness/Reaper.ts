/**
 * The reaper (DESIGN §5 "Reaper", "Shutdown", "Status"; upstream
 * `ManagementModule`'s reaper thread): one fiber forked into this layer's
 * scope, scanning every `timeout / 4` (and at least every
 * `disconnect_grace / 2`), and at once when a suspect's disconnect grace
 * runs out; an instance is therefore reaped between `timeout` and
 * `timeout + timeout / 4` after its last signal.
 *
 * A scan first lets the requests already received finish (the request
 * barrier), then judges at its scheduled time (lateness from the server's
 * own stalls never counts as a worker's silence), pops stale entries
 * atomically in each liveness target (which releases each through the
 * UNREGISTER finalizer), logs one WARNING per reaped instance, and calls
 * `dropInstanceState` on every target. Its layer needs the targets, so the
 * assembly builds it after the modules behind them: at shutdown the reaper
 * stops before any of them releases state.
 *
 * A scheduled scan that starts more than one period late is a stall of the
 * server itself: told once (WARNING, `mpcache_server_stalls_total`) through
 * ServerStalls, shared with the event-loop ticker forked beside the loop
 * (Stalls.ts).
 *
 * It also answers the `worker_liveness`, `instances` and `recent_reaps`
 * blocks of `/api/status`: the windows, whether it runs, what it tracks,
 * each instance's state by Rule.ts, and the last 50 reaps (RecentReaps.ts,
 * issue 17).
 */
import { Clock, Context, Effect, Layer, Metric, Queue } from "effect"
import { formatInstanceId } from "../../schema/InstanceId.ts"
import { Connections } from "./Connections.ts"
import { LivenessSettings } from "./LivenessSettings.ts"
import { type HeldTargetOptions, LivenessTargets, type InstanceSummary, type ReapedInstance } from "./LivenessTarget.ts"
import { makeRecentReaps } from "./RecentReaps.ts"
import { RequestBarrier } from "./RequestBarrier.ts"
import { formatStallSeconds, ServerStalls, watchEventLoop } from "./Stalls.ts"
import { REAP_REASONS, stateOf, type InstanceState, type ReapReason, type Windows } from "./Rule.ts"
import { byLabel, fromStart } from "../metrics/Series.ts"

const reapsTotal = Metric.counter("mpcache_reaps_total", { description: "Instances reaped, by reason", incremental: true })
const reapsBy: Readonly<Record<ReapReason, Metric.Metric<number, unknown>>> = byLabel(reapsTotal, "reason", REAP_REASONS)
const trackedGauge = fromStart(Metric.gauge("mpcache_tracked_instances", { description: "Registered contexts tracked for liveness" }))
const scanSeconds = fromStart(Metric.histogram("mpcache_reaper_scan_seconds", {
  description: "Duration of one reaper scan",
  boundaries: Metric.exponentialBoundaries({ start: 0.0001, factor: 2, count: 16 })
}))

/** How long a scan waits for the requests received before it (DESIGN §5). */
const BARRIER_TIMEOUT = "1 second"

/** The window names of the WARNING, by reason. */
const windowName: Record<ReapReason, string> = {
  timeout: "reap timeout",
  grace: "registration grace",
  disconnect: "disconnect grace"
}

/** An instance in `/api/status` (DESIGN §5). */
export interface InstanceStatus extends Omit<InstanceSummary, "details"> {
  readonly state: InstanceState
  readonly [detail: string]: unknown
}

/** When the reaper last scanned, for `/readyz` (issue 27 item 3): Clock millis. */
export interface ReaperScans {
  /** When the reaper started (Clock millis): the reference before its first scan. */
  readonly startedAtMs: number
  /** When its last scan ended (Clock millis); undefined before the first. */
  readonly lastScanEndedAtMs: number | undefined
  /** Its scan period, ms (LivenessSettings `scanPeriodMs`); Infinity when it does not run. */
  readonly periodMs: number
}

/** The reaper of every liveness target, and the liveness blocks of `/api/status`. */
export class Reaper extends Context.Service<Reaper, {
  /**
   * One reaper scan judging at `judgeAtMs` (Clock millis): pops and releases
   * every stale instance of every target, logs, drops mirrored state.
   * Returns the reaped instances.
   */
  readonly scan: (judgeAtMs: number) => Effect.Effect<ReadonlyArray<ReapedInstance>>
  /** Whether the reaper runs (timeout or disconnect grace above 0). */
  readonly reaperEnabled: boolean
  /** When it started and last finished a scan, on the Clock (each `scan` records its end). */
  readonly scans: () => ReaperScans
  /** `worker_liveness`, `instances` and `recent_reaps` (oldest first, at most 50) blocks of `/api/status`. */
  readonly status: () => Effect.Effect<Record<string, unknown>>
}>()("mpcache/services/Reaper") {
  /**
   * The reaper over the targets in context; its loop and the event-loop
   * ticker (Stalls.ts) live exactly as long as this layer. Also provides
   * the ServerStalls they report to (its `eventLoop()` facts feed `/livez`).
   */
  static readonly layer = Layer.effect(this, Effect.suspend(() => make)).pipe(Layer.provideMerge(ServerStalls.layer))
  /**
   * For tests: the real reaper and connection tracker (both provided) over
   * one in-memory target holding the ids in `held` (LivenessTargets.layerTest,
   * its touches and scans recorded in `target`), `windows` over an all-off
   * baseline (LivenessSettings.layerTest) and the real request barrier.
   */
  static readonly layerTest = (held: Set<bigint>, windows: Partial<Windows> = {}, target: HeldTargetOptions = {}) =>
    this.layer.pipe(
      Layer.provideMerge(Connections.layer),
      Layer.provideMerge(Layer.mergeAll(
        LivenessTargets.layerTest(held, target),
        LivenessSettings.layerTest(windows),
        RequestBarrier.layerTest
      ))
    )
}

const make = Effect.gen(function*() {
  const targets = yield* LivenessTargets
  const connections = yield* Connections
  const barrier = yield* RequestBarrier
  const stalls = yield* ServerStalls
  const { windows, scanPeriodMs: everyMs } = yield* LivenessSettings
  const recentReaps = makeRecentReaps()
  const startedAtMs = yield* Clock.currentTimeMillis
  let lastScanEndedAtMs: number | undefined

  const trackedCount = Effect.map(
    Effect.forEach(targets, (t) => t.trackedInstanceCount()),
    (counts) => counts.reduce((a, b) => a + b, 0)
  )

  const scan = (judgeAtMs: number) =>
    Effect.gen(function*() {
      const started = yield* Clock.currentTimeMillis
      const rule = { ...windows, nowMs: judgeAtMs, suspects: connections.suspects() }
      const reaped: Array<ReapedInstance> = []
      for (const target of targets) {
        for (const r of yield* target.reapStaleInstances(rule)) {
          reaped.push(r)
          yield* Effect.logWarning(
            `reaped instance ${formatInstanceId(r.id)}: silent for ${(r.silentMs / 1000).toFixed(1)} s, ` +
              `longer than its ${windowName[r.reason]} of ${r.windowMs / 1000} s (reason ${r.reason})`,
            { instance_id: formatInstanceId(r.id), silent_seconds: r.silentMs / 1000, window_seconds: r.windowMs / 1000, reason: r.reason, module: target.name }
          )
          yield* Metric.update(reapsBy[r.reason], 1)
          recentReaps.add({
            instance_id: formatInstanceId(r.id),
            reason: r.reason,
            reaped_at_ms: judgeAtMs,
            silent_seconds: r.silentMs / 1000,
            window_seconds: r.windowMs / 1000,
            module: target.name
          })
        }
      }
      for (const r of reaped) {
        yield* Effect.forEach(targets, (t) => t.dropInstanceState(r.id), { discard: true })
        connections.forget(r.id)
      }
      yield* connections.prune()
      yield* Metric.update(trackedGauge, yield* trackedCount)
      const finished = yield* Clock.currentTimeMillis
      lastScanEndedAtMs = finished
      yield* Metric.update(scanSeconds, (finished - started) / 1000)
      return reaped
    })

  const reaperEnabled = Number.isFinite(everyMs)

  /**
   * The reaper loop: scans on a fixed grid, and at once when a suspect's
   * disconnect grace runs out. A late scheduled scan judges at the time it
   * was due, and one late by more than a period is a stall of the server
   * (one WARNING, ServerStalls).
   */
  const reaper = Effect.gen(function*() {
    let due = (yield* Clock.currentTimeMillis) + everyMs
    while (true) {
      const now = yield* Clock.currentTimeMillis
      const woken = yield* Effect.raceFirst(
        Effect.as(due > now ? Effect.sleep(due - now) : Effect.void, false),
        Effect.as(Queue.take(connections.graceExpired), true)
      )
      const start = yield* Clock.currentTimeMillis
      // A grace signal that wins the race once the scheduled time has passed (both woke after a pause)
      // is that scheduled scan too: judged at its time, or the pause would count as silence.
      const scheduled = !woken || start >= due
      if (scheduled && start - due > everyMs) {
        yield* stalls.report({
          source: "reaper",
          fromMs: due,
          toMs: start,
          what: `reaper scan started ${formatStallSeconds(start - due)} s late, period ${everyMs / 1000} s`
        })
      }
      yield* barrier.awaitReceived(BARRIER_TIMEOUT)
      // A scheduled scan is judged at the time it was due: neither the server's own lateness (a blocked
      // event loop, a stopped process) nor the wait for already received requests counts as silence.
      yield* Effect.uninterruptible(scan(scheduled ? due : start))
      if (scheduled) {
        due += everyMs
        if (due <= start) due = start + everyMs
      }
    }
  }).pipe(
    Effect.catchCause((cause) => Effect.logError("reaper stopped by a defect", cause)),
    Effect.annotateLogs({ fiber: "reaper" })
  )

  if (reaperEnabled) {
    yield* Effect.forkScoped(reaper)
    // Only with the reaper: the WARNING speaks of liveness deadlines (without it, Readiness forks a quiet ticker).
    yield* Effect.forkScoped(watchEventLoop.pipe(Effect.annotateLogs({ fiber: "event-loop-watch" })))
    yield* Effect.logInfo(
      `reaper: scanning every ${everyMs / 1000} s (reap timeout ${windows.reapTimeoutMs / 1000} s, registration grace ${windows.registrationGraceMs / 1000} s, disconnect grace ${windows.disconnectGraceMs / 1000} s)`
    )
  } else {
    yield* Effect.logWarning("reaper disabled: --worker-reap-timeout-seconds and --worker-disconnect-grace-seconds are both 0")
  }

  const status = () =>
    Effect.gen(function*() {
      const suspects = connections.suspects()
      const summaries = (yield* Effect.forEach(targets, (t) => t.instances())).flat()
      const instances: Array<InstanceStatus> = summaries.map(({ details, ...s }) => ({
        ...s,
        state: stateOf(
          { hasLivenessSignal: s.has_liveness_signal, hasTransferActivity: s.has_transfer_activity },
          suspects.has(BigInt(s.instance_id))
        ),
        ...details
      }))
      const tracked = yield* trackedCount
      yield* Metric.update(trackedGauge, tracked)
      return {
        worker_liveness: {
          enabled: reaperEnabled,
          reap_timeout_seconds: windows.reapTimeoutMs / 1000,
          registration_grace_seconds: windows.registrationGraceMs / 1000,
          disconnect_grace_seconds: windows.disconnectGraceMs / 1000,
          tracked_instances: tracked
        },
        instances,
        recent_reaps: recentReaps.list()
      }
    })

  const scans = (): ReaperScans => ({ startedAtMs, lastScanEndedAtMs, periodMs: everyMs })

  return { scan, reaperEnabled, scans, status }
})
