/**
 * Probes that mean something (issue 27 item 3): the checks behind `GET /livez`,
 * `GET /readyz` and the `readiness` block of `/api/status`, each fact read from
 * its owner, each judged on the Clock (TestClock drives them).
 *
 *   /livez   process     the process answers (always ok when it can say so)
 *            event_loop  the event-loop ticker (liveness/Stalls.ts) last woke at most
 *                        EVENT_LOOP_LIVE_BOUND_MS ago; its last stall (a tick more than
 *                        1 s late) is told in the detail
 *   /readyz  mq_bound    the MQ ROUTER is bound and receiving (MqServer)
 *            l1_pool     the L1 store is allocated (L1Store: the shared pool's size)
 *            reaper      the reaper's last scan ended within two scan periods
 *                        (Reaper.scans); reaping off → ok, "reaping is off"
 *            fd_socket   with `--fd-socket PATH` the descriptor socket listens (FdExchange,
 *                        and the socket file is still there); not configured or off → ok
 *            l2          the L2 breaker state (L2Tier: ok, open, probing), never fatal;
 *                        no `--l2-url` → ok, "not configured"
 *
 * A report is `{ status, checks: [{ name, ok, detail }] }`: `status` is
 * "live"/"not_live" or "ready"/"not_ready", the HTTP status 200 or 503
 * (src/layers/Http.ts). Details carry figures (ages in seconds, bytes,
 * periods) and never an endpoint, path, key, tenant or instance id: the
 * probes answer without the bearer token (docs/security.md "Probes").
 */
import { statSync } from "node:fs"
import { Clock, Context, Effect, Layer, Option } from "effect"
import { type ReaperScans, Reaper } from "../liveness/Reaper.ts"
import { type EventLoopFacts, formatStallSeconds, makeWatchEventLoop, ServerStalls } from "../liveness/Stalls.ts"
import { FdExchange } from "./FdExchange.ts"
import { type L1Pool, type L1Stats, L1Store } from "./L1Store.ts"
import { L2Tier, type L2Status } from "./l2/L2Tier.ts"
import { MqServer } from "./MqServer.ts"
import { ServerConfig } from "./ServerConfig.ts"

/** One check of a probe: its name, whether it passes, and why (with figures). */
export interface ProbeCheck {
  readonly name: string
  readonly ok: boolean
  readonly detail: string
}

/** A probe's answer: every check, and the verdict (every check ok). */
export interface ProbeReport<S extends string = string> {
  readonly status: S
  readonly checks: ReadonlyArray<ProbeCheck>
}

export type LivenessReport = ProbeReport<"live" | "not_live">
export type ReadinessReport = ProbeReport<"ready" | "not_ready">

/** The event loop is live while its ticker last woke at most this long ago, ms (20 of its 250 ms ticks). */
export const EVENT_LOOP_LIVE_BOUND_MS = 5_000
/** The reaper is ready while its last scan ended at most this many scan periods ago (issue 27 item 3). */
export const REAPER_BOUND_PERIODS = 2

const seconds = formatStallSeconds

/**
 * `event_loop` of `/livez`: ok while `nowMs − lastTickMs ≤ EVENT_LOOP_LIVE_BOUND_MS`;
 * the last stall the ticker saw (a tick more than 1 s late) is told either way.
 * No ticker (a program without the Reaper) → not ok.
 */
export const eventLoopCheck = (facts: EventLoopFacts | undefined, nowMs: number): ProbeCheck => {
  if (facts === undefined) return { name: "event_loop", ok: false, detail: "no event-loop ticker runs in this process" }
  const age = nowMs - facts.lastTickMs
  const bound = `bound ${EVENT_LOOP_LIVE_BOUND_MS / 1000} s`
  const stall = facts.lastStall === undefined
    ? "no stall seen"
    : `last stall: a tick ${seconds(facts.lastStall.toMs - facts.lastStall.fromMs)} s late, ended ${seconds(nowMs - facts.lastStall.toMs)} s ago`
  return age <= EVENT_LOOP_LIVE_BOUND_MS
    ? { name: "event_loop", ok: true, detail: `last tick ${seconds(age)} s ago (${bound}); ${stall}` }
    : {
      name: "event_loop",
      ok: false,
      detail: `last tick ${seconds(age)} s ago, more than the ${bound}: the event loop is blocked or the process was stopped; ${stall}`
    }
}

/** `mq_bound`: the ROUTER is bound and receiving. */
export const mqCheck = (listening: boolean | undefined): ProbeCheck =>
  listening === undefined
    ? { name: "mq_bound", ok: false, detail: "no MQ server in this process" }
    : listening
    ? { name: "mq_bound", ok: true, detail: "the ROUTER is bound and receiving" }
    : { name: "mq_bound", ok: false, detail: "the ROUTER is not receiving: shutting down, or its socket closed" }

/** `l1_pool`: the L1 store is allocated (`pool`: the shared segment; undefined for an in-process store). */
export const l1Check = (l1: { readonly stats: L1Stats; readonly pool: L1Pool | undefined } | undefined): ProbeCheck => {
  if (l1 === undefined) return { name: "l1_pool", ok: false, detail: "no L1 store in this process" }
  const { capacityBytes, usedBytes } = l1.stats
  if (capacityBytes <= 0) return { name: "l1_pool", ok: false, detail: `the L1 store has no capacity (${capacityBytes} bytes)` }
  return l1.pool === undefined
    ? { name: "l1_pool", ok: true, detail: `in-process L1 of ${capacityBytes} bytes (no shared pool), ${usedBytes} bytes used` }
    : {
      name: "l1_pool",
      ok: true,
      detail: `shared pool of ${l1.pool.sizeBytes} bytes allocated (${l1.pool.prefaultedBytes()} prefaulted), ${usedBytes} bytes used`
    }
}

/**
 * `reaper`: with reaping on, ok while the last scan ended (before the first:
 * the reaper started) at most `REAPER_BOUND_PERIODS` scan periods before `nowMs`.
 */
export const reaperCheck = (enabled: boolean, scans: ReaperScans, nowMs: number): ProbeCheck => {
  if (!enabled) {
    return { name: "reaper", ok: true, detail: "reaping is off (--worker-reap-timeout-seconds and --worker-disconnect-grace-seconds are 0)" }
  }
  const boundMs = REAPER_BOUND_PERIODS * scans.periodMs
  const figures = `period ${scans.periodMs / 1000} s, bound ${REAPER_BOUND_PERIODS} × ${scans.periodMs / 1000} s = ${boundMs / 1000} s`
  const last = scans.lastScanEndedAtMs
  const age = nowMs - (last ?? scans.startedAtMs)
  const what = last === undefined ? `no scan has ended in the ${seconds(age)} s since the reaper started` : `last scan ended ${seconds(age)} s ago`
  return age <= boundMs
    ? { name: "reaper", ok: true, detail: `${what} (${figures})` }
    : { name: "reaper", ok: false, detail: `${what}, more than two scan periods (${figures}): the reaper is stuck or was stopped` }
}

/** What the descriptor socket's owner says: the flag as given and the path it listens on (undefined: not listening). */
export interface FdSocketFacts {
  /** `--fd-socket` as given: a path, "@name", "off", or undefined (not configured: the default place). */
  readonly configured: string | undefined
  /** Where it listens; undefined when it does not. */
  readonly socketPath: string | undefined
  /** Whether the socket file is still there and a socket (true for an abstract "@name"). */
  readonly present: boolean
}

/** `fd_socket`: with `--fd-socket PATH` it must listen and its file be a socket; otherwise ok, saying why. */
export const fdSocketCheck = (facts: FdSocketFacts | undefined): ProbeCheck => {
  if (facts === undefined || facts.configured === undefined) {
    const dflt = facts?.socketPath === undefined ? "cpu_memfd off" : "listening at its default place"
    return { name: "fd_socket", ok: true, detail: `not configured (--fd-socket); ${dflt}` }
  }
  if (facts.configured === "off") return { name: "fd_socket", ok: true, detail: "off (--fd-socket off): cpu_memfd off" }
  if (facts.socketPath === undefined) return { name: "fd_socket", ok: false, detail: "configured (--fd-socket) but not listening" }
  return facts.present
    ? { name: "fd_socket", ok: true, detail: "configured (--fd-socket) and listening" }
    : { name: "fd_socket", ok: false, detail: "configured (--fd-socket) but the socket file is gone or is no socket: clients cannot connect" }
}

/** `l2`: the breaker state reported, never fatal (a failing L2 is a miss, DESIGN §9). */
export const l2Check = (status: L2Status | null): ProbeCheck =>
  status === null
    ? { name: "l2", ok: true, detail: "not configured (--l2-url)" }
    : status.state === "ok"
    ? { name: "l2", ok: true, detail: `breaker ok${status.connected ? ", connected" : ", not connected"}` }
    : {
      name: "l2",
      ok: true,
      detail: `breaker ${status.state}${status.connected ? ", connected" : ", not connected"} (not fatal: L2 is skipped, every L2 read a miss, until it recovers)`
    }

/** The verdict over `checks`. */
export const verdict = <S extends string>(checks: ReadonlyArray<ProbeCheck>, ok: S, notOk: S): ProbeReport<S> => ({
  status: checks.every((c) => c.ok) ? ok : notOk,
  checks
})

/**
 * The probes of this server: every check's fact read from its owner at the
 * moment of the request, judged at the Clock's now. Needs the Reaper (and
 * its ServerStalls) and the configuration; MqServer, L1Store and FdExchange
 * where present (a missing one fails its check), L2Tier (a Reference: "no
 * L2" by default). Errors: none.
 */
export class Readiness extends Context.Service<Readiness, {
  /** `/livez`: process, event_loop. */
  readonly liveness: () => Effect.Effect<LivenessReport>
  /** `/readyz` and `/api/status.readiness`: mq_bound, l1_pool, reaper, fd_socket, l2. */
  readonly readiness: () => Effect.Effect<ReadinessReport>
}>()("mpcache/services/server/Readiness") {
  static readonly layer = Layer.effect(this, Effect.suspend(() => make))
}

const socketPresent = (path: string): boolean => {
  if (path.startsWith("@")) return true
  try {
    return statSync(path).isSocket()
  } catch {
    return false
  }
}

const make = Effect.gen(function*() {
  const config = yield* ServerConfig
  const reaper = yield* Reaper
  const stalls = yield* ServerStalls
  const l2 = yield* L2Tier
  const mq = Option.getOrUndefined(yield* Effect.serviceOption(MqServer))
  const l1 = Option.getOrUndefined(yield* Effect.serviceOption(L1Store))
  const fd = Option.getOrUndefined(yield* Effect.serviceOption(FdExchange))
  // The Reaper's ticker runs only with the reaper; without it, a quiet one (no WARNING) for /livez, in this layer's scope.
  if (!reaper.reaperEnabled) yield* Effect.forkScoped(makeWatchEventLoop({ report: false }).pipe(Effect.annotateLogs({ fiber: "event-loop-watch" })))

  const liveness = () =>
    Effect.gen(function*() {
      const now = yield* Clock.currentTimeMillis
      return verdict(
        [{ name: "process", ok: true, detail: "answering" }, eventLoopCheck(stalls.eventLoop(), now)],
        "live" as const,
        "not_live" as const
      )
    })

  const readiness = () =>
    Effect.gen(function*() {
      const now = yield* Clock.currentTimeMillis
      const socketPath = fd?.socketPath
      return verdict(
        [
          mqCheck(mq?.listening()),
          l1Check(l1 === undefined ? undefined : { stats: l1.stats(), pool: l1.pool }),
          reaperCheck(reaper.reaperEnabled, reaper.scans(), now),
          fdSocketCheck(
            fd === undefined
              ? undefined
              : { configured: config.fdSocket, socketPath, present: socketPath !== undefined && socketPresent(socketPath) }
          ),
          l2Check(l2.status())
        ],
        "ready" as const,
        "not_ready" as const
      )
    })

  return { liveness, readiness }
})
