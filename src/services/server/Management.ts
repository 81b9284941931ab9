/**
 * The management module (DESIGN §3.1, §5; upstream `ManagementModule`):
 * PING, PING_REGISTERED, NOOP, GET_CHUNK_SIZE, CLEAR, and the reaper.
 *
 * PING is where liveness signals enter: it touches every liveness target
 * for a named instance and nothing for nil (the scheduler and untracked
 * probers, upstream #3754); it never inserts. PING runs on the NORMAL pool
 * on purpose: if that pool cannot answer within the client's timeout the
 * worker should go degraded (back-pressure). PING_REGISTERED (upstream
 * #4732) touches the same way and answers which expected kinds the server
 * does not hold, so a worker notices a server restart or its own reap.
 *
 * The reaper is one fiber in this module's scope, scanning every
 * `timeout / 4` (and at least every `disconnect_grace / 2`); an instance is
 * therefore reaped between `timeout` and `timeout + timeout / 4` after its
 * last signal. A scan first lets the requests already received finish,
 * then judges at its scheduled time (lateness from the server's own stalls
 * never counts as a worker's silence), pops stale entries atomically in
 * each target (which releases each through the UNREGISTER finalizer), logs
 * one WARNING per reaped instance, and calls `dropInstanceState` on every
 * target. This module is built after the modules it drives, so at shutdown
 * its reaper stops before any of them releases state.
 */
import { Clock, Context, Effect, Layer, Metric, Queue } from "effect"
import { ServerConfig } from "./ServerConfig.ts"
import { formatInstanceId, type InstanceId } from "../../schema/InstanceId.ts"
import { Clear, GetChunkSize, Noop, Ping, PingRegistered } from "../../schema/Op.ts"
import type { RegistrationKind } from "../../schema/Registration.ts"
import { CacheControl } from "./CacheControl.ts"
import { Connections } from "../liveness/Connections.ts"
import { row, type ServerModule } from "./Handler.ts"
import type { ReapReason } from "../liveness/InstanceRegistry.ts"
import { LivenessTargets, type InstanceSummary, type ReapedInstance } from "../liveness/LivenessTarget.ts"
import { RequestBarrier } from "../liveness/RequestBarrier.ts"

const pingsTotal = Metric.counter("mpcache_pings_total", {
  description: "PING / PING_REGISTERED received, by form",
  incremental: true
})
const pingsNamed = Metric.withAttributes(pingsTotal, { form: "instance" })
const pingsNil = Metric.withAttributes(pingsTotal, { form: "nil" })
const pingsRegistered = Metric.withAttributes(pingsTotal, { form: "ping_registered" })
const reapsTotal = Metric.counter("mpcache_reaps_total", { description: "Instances reaped, by reason", incremental: true })
const reapsBy: Record<ReapReason, Metric.Metric<number, unknown>> = {
  timeout: Metric.withAttributes(reapsTotal, { reason: "timeout" }),
  grace: Metric.withAttributes(reapsTotal, { reason: "grace" }),
  disconnect: Metric.withAttributes(reapsTotal, { reason: "disconnect" })
}
const trackedGauge = Metric.gauge("mpcache_tracked_instances", { description: "Registered contexts tracked for liveness" })
const scanSeconds = Metric.histogram("mpcache_reaper_scan_seconds", {
  description: "Duration of one reaper scan",
  boundaries: Metric.exponentialBoundaries({ start: 0.0001, factor: 2, count: 16 })
})

/** How long a scan waits for the requests received before it (DESIGN §5). */
const BARRIER_TIMEOUT = "1 second"

/** An instance in `/api/status` (DESIGN §5). */
export interface InstanceStatus extends Omit<InstanceSummary, "details"> {
  readonly state: "startup" | "active" | "suspect"
  readonly [detail: string]: unknown
}

/** The management module's operations, its reaper and its handler rows. */
export class Management extends Context.Service<Management, {
  /** PING `[instance_id | nil] → true`: touches every target for a named id (never inserts). */
  readonly ping: (id: InstanceId | null) => Effect.Effect<true>
  /** PING_REGISTERED: touches like PING; answers the `expected` kinds the server does not hold for `id`. */
  readonly pingRegistered: (id: InstanceId, expected: ReadonlyArray<RegistrationKind>) => Effect.Effect<ReadonlyArray<RegistrationKind>>
  /** NOOP → "OK". */
  readonly noop: () => Effect.Effect<"OK">
  /** GET_CHUNK_SIZE → tokens per chunk (`--chunk-size`). */
  readonly getChunkSize: () => Effect.Effect<number>
  /** CLEAR: drops cached objects (see CacheControl for `force`). */
  readonly clear: (force: boolean) => Effect.Effect<void>
  /**
   * One reaper scan judging at `judgeAtMs` (Clock millis): pops and releases
   * every stale instance of every target, logs, drops mirrored state.
   * Returns the reaped instances.
   */
  readonly scan: (judgeAtMs: number) => Effect.Effect<ReadonlyArray<ReapedInstance>>
  /** Whether the reaper runs (timeout or disconnect grace above 0). */
  readonly reaperEnabled: boolean
  /** `worker_liveness` and `instances` blocks of `/api/status`. */
  readonly status: () => Effect.Effect<Record<string, unknown>>
  /** Rows: PING NORMAL, PING_REGISTERED NORMAL, NOOP SYNC, GET_CHUNK_SIZE SYNC, CLEAR NORMAL (DESIGN §3.1). */
  readonly module: ServerModule
}>()("mpcache/services/Management") {
  static readonly layer = Layer.effect(this, Effect.suspend(() => make))
}

const make = Effect.gen(function*() {
  const config = yield* ServerConfig
  const targets = yield* LivenessTargets
  const cache = yield* CacheControl
  const connections = yield* Connections
  const barrier = yield* RequestBarrier
  const timeoutMs = config.workerReapTimeoutSeconds * 1000
  const graceMs = config.workerRegistrationGraceSeconds * 1000
  const disconnectGraceMs = config.workerDisconnectGraceSeconds * 1000

  const touchAll = (id: InstanceId) => Effect.forEach(targets, (t) => t.touchInstance(id), { discard: true })

  const ping = (id: InstanceId | null) =>
    id === null
      ? Metric.update(pingsNil, 1).pipe(Effect.as(true as const))
      : touchAll(id).pipe(Effect.andThen(Metric.update(pingsNamed, 1)), Effect.as(true as const))

  const pingRegistered = (id: InstanceId, expected: ReadonlyArray<RegistrationKind>) =>
    Effect.gen(function*() {
      yield* touchAll(id)
      yield* Metric.update(pingsRegistered, 1)
      const missing: Array<RegistrationKind> = []
      for (const kind of new Set(expected)) {
        const owners = targets.filter((t) => t.kind === kind)
        const holds = yield* Effect.forEach(owners, (t) => t.holdsInstance(id))
        if (!holds.some(Boolean)) missing.push(kind)
      }
      return missing
    })

  const trackedCount = Effect.map(
    Effect.forEach(targets, (t) => t.trackedInstanceCount()),
    (counts) => counts.reduce((a, b) => a + b, 0)
  )

  const scan = (judgeAtMs: number) =>
    Effect.gen(function*() {
      const started = yield* Clock.currentTimeMillis
      const rule = {
        nowMs: judgeAtMs,
        reapTimeoutMs: timeoutMs,
        registrationGraceMs: graceMs,
        suspects: connections.suspects(),
        disconnectGraceMs
      }
      const reaped: Array<ReapedInstance> = []
      for (const target of targets) {
        for (const r of yield* target.reapStaleInstances(rule)) {
          reaped.push(r)
          yield* Effect.logWarning(
            `reaped instance ${formatInstanceId(r.id)}: silent for ${(r.silentMs / 1000).toFixed(1)} s, ` +
              `longer than its ${r.reason === "timeout" ? "reap timeout" : r.reason === "grace" ? "registration grace" : "disconnect grace"} of ${r.windowMs / 1000} s (reason ${r.reason})`,
            { instance_id: formatInstanceId(r.id), silent_seconds: r.silentMs / 1000, window_seconds: r.windowMs / 1000, reason: r.reason, module: target.name }
          )
          yield* Metric.update(reapsBy[r.reason], 1)
        }
      }
      for (const r of reaped) {
        yield* Effect.forEach(targets, (t) => t.dropInstanceState(r.id), { discard: true })
        connections.forget(r.id)
      }
      yield* connections.prune()
      yield* Metric.update(trackedGauge, yield* trackedCount)
      const finished = yield* Clock.currentTimeMillis
      yield* Metric.update(scanSeconds, (finished - started) / 1000)
      return reaped
    })

  const periods = [timeoutMs > 0 ? timeoutMs / 4 : Infinity, disconnectGraceMs > 0 ? disconnectGraceMs / 2 : Infinity]
  const everyMs = Math.min(...periods)
  const reaperEnabled = Number.isFinite(everyMs)

  /**
   * The reaper loop: scans on a fixed grid, and at once when a suspect's
   * disconnect grace runs out. A late scheduled scan judges at the time it
   * was due.
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
      yield* barrier.awaitReceived(BARRIER_TIMEOUT)
      // A scheduled scan is judged at the time it was due: neither the server's own lateness (a blocked
      // event loop, a stopped process) nor the wait for already received requests counts as silence.
      yield* Effect.uninterruptible(scan(woken ? start : due))
      if (!woken) {
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
    yield* Effect.logInfo(
      `reaper: scanning every ${everyMs / 1000} s (reap timeout ${config.workerReapTimeoutSeconds} s, registration grace ${config.workerRegistrationGraceSeconds} s, disconnect grace ${config.workerDisconnectGraceSeconds} s)`
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
        state: suspects.has(BigInt(s.instance_id))
          ? "suspect"
          : s.has_liveness_signal && s.has_transfer_activity
          ? "active"
          : "startup",
        ...details
      }))
      const tracked = yield* trackedCount
      yield* Metric.update(trackedGauge, tracked)
      return {
        worker_liveness: {
          enabled: reaperEnabled,
          reap_timeout_seconds: config.workerReapTimeoutSeconds,
          registration_grace_seconds: config.workerRegistrationGraceSeconds,
          disconnect_grace_seconds: config.workerDisconnectGraceSeconds,
          tracked_instances: tracked
        },
        instances
      }
    })

  const clear = (force: boolean) =>
    cache.clear(force).pipe(
      Effect.flatMap((dropped) => Effect.logInfo(`cache cleared: ${dropped} object(s) dropped`, { force }))
    )

  const module: ServerModule = {
    name: "management",
    status,
    rows: [
      row(Ping, "NORMAL", ([id]) => ping(id)),
      row(PingRegistered, "NORMAL", ([id, expected]) => pingRegistered(id, expected)),
      row(Noop, "SYNC", () => Effect.succeed("OK" as const)),
      row(GetChunkSize, "SYNC", () => Effect.succeed(config.chunkSizeTokens)),
      row(Clear, "NORMAL", ([force]) => clear(force))
    ]
  }
  return {
    ping,
    pingRegistered,
    noop: () => Effect.succeed("OK" as const),
    getChunkSize: () => Effect.succeed(config.chunkSizeTokens),
    clear,
    scan,
    reaperEnabled,
    status,
    module
  }
})
