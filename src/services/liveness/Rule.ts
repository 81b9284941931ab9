/**
 * Every liveness rule of the server, in one place (DESIGN §5; upstream
 * `ContextEntry.last_seen` / `has_liveness_signal`, #4732's
 * `has_transfer_activity`): pure functions, no Clock, no state. The
 * registry's judge and stale index, the reaper and `/api/status` read their
 * windows and states here. Times are Clock millis, windows ms.
 */

/** The three windows of one server, ms. `reapTimeoutMs` 0 turns both heartbeat windows off; `disconnectGraceMs` 0 turns disconnect reaping off. */
export interface Windows {
  /** `--worker-reap-timeout-seconds`: the window of an `active` instance. */
  readonly reapTimeoutMs: number
  /** `--worker-registration-grace-seconds`: the window of a `startup` instance. */
  readonly registrationGraceMs: number
  /** `--worker-disconnect-grace-seconds`: how long a `suspect` instance may stay one. */
  readonly disconnectGraceMs: number
}

/** The windows of a configuration (seconds → ms). */
export const windowsOf = (config: {
  readonly workerReapTimeoutSeconds: number
  readonly workerRegistrationGraceSeconds: number
  readonly workerDisconnectGraceSeconds: number
}): Windows => ({
  reapTimeoutMs: config.workerReapTimeoutSeconds * 1000,
  registrationGraceMs: config.workerRegistrationGraceSeconds * 1000,
  disconnectGraceMs: config.workerDisconnectGraceSeconds * 1000
})

/** What one scan judges by: the windows, its judging time, and the instances with no connected routing id left (since when). */
export interface StaleRule extends Windows {
  /** The time the scan judges at (already net of the server's own stalls). */
  readonly nowMs: number
  readonly suspects: ReadonlyMap<bigint, number>
}

/** The liveness fields of one entry. */
export interface Liveness {
  /** Clock millis of the last REGISTER, PING or transfer naming the id. */
  readonly lastSeenMs: number
  /** Latched by PING / PING_REGISTERED naming the id. */
  readonly hasLivenessSignal: boolean
  /** Latched by a real transfer through the entry. */
  readonly hasTransferActivity: boolean
}

/** Why an instance was reaped: the edge it took into the release. */
export const REAP_REASONS = ["timeout", "grace", "disconnect"] as const
export type ReapReason = typeof REAP_REASONS[number]
/** Every way into the single release (the entry's one finalizer, run once). */
export type ReleaseEdge = ReapReason | "unregister" | "shutdown"
/** An instance's state, as `/api/status` shows it. */
export type InstanceState = "startup" | "active" | "suspect"
/** The two states the flags alone decide: which heartbeat window applies. */
export type HeartbeatState = Exclude<InstanceState, "suspect">

/** One row of {@link lifecycle}. */
export interface StateRow {
  /** What the state means. */
  readonly means: string
  /** The window its silence is measured against. */
  readonly window: keyof Windows
  /** The reason logged when it outlives that window. */
  readonly reap: ReapReason
  /** Edges to other states and the event that takes each. */
  readonly to: Partial<Record<InstanceState, string>>
  /** Every edge out of it into the single release. */
  readonly release: ReadonlyArray<ReleaseEdge>
}

/**
 * The per-instance lifecycle, one table (REGISTER of a new id enters
 * `startup`). A `suspect` instance keeps its heartbeat window too (that of
 * `startup` or `active` by its flags): both run, the first out reaps it.
 */
export const lifecycle: { readonly [S in InstanceState]: StateRow } = {
  startup: {
    means: "registered, not both flags latched yet (warm-up, idle after start, a legacy client that never pings)",
    window: "registrationGraceMs",
    reap: "grace",
    to: { active: "PING and a transfer have both named it", suspect: "its last bound connection closed" },
    release: ["grace", "unregister", "shutdown"]
  },
  active: {
    means: "both flags latched (they never unlatch)",
    window: "reapTimeoutMs",
    reap: "timeout",
    to: { suspect: "its last bound connection closed" },
    release: ["timeout", "unregister", "shutdown"]
  },
  suspect: {
    means: "none of its bound routing ids is connected",
    window: "disconnectGraceMs",
    reap: "disconnect",
    to: {
      startup: "a message naming it from a connected routing id (flags not both latched)",
      active: "a message naming it from a connected routing id (both flags latched)"
    },
    release: ["disconnect", "grace", "timeout", "unregister", "shutdown"]
  }
}

/** `startup` or `active`, by the two flags. */
export const heartbeatStateOf = (t: Pick<Liveness, "hasLivenessSignal" | "hasTransferActivity">): HeartbeatState =>
  t.hasLivenessSignal && t.hasTransferActivity ? "active" : "startup"

/** The state of an entry; `suspect` when it has no connected routing id left. */
export const stateOf = (t: Pick<Liveness, "hasLivenessSignal" | "hasTransferActivity">, suspect: boolean): InstanceState => (suspect ? "suspect" : heartbeatStateOf(t))

/** The window of `state` under `w`, ms. */
export const windowMsOf = (state: InstanceState, w: Windows): number => w[lifecycle[state].window]

/** Whether the heartbeat windows apply at all (reap timeout above 0). */
export const timeReapingOn = (w: Windows): boolean => w.reapTimeoutMs > 0

/** Whether disconnect reaping applies at all (disconnect grace above 0). */
export const disconnectReapingOn = (w: Windows): boolean => w.disconnectGraceMs > 0

/** Stale: silent strictly longer than the window (`now − since > window`); at the window itself it is kept. */
export const outlived = (nowMs: number, sinceMs: number, windowMs: number): boolean => nowMs - sinceMs > windowMs

/** A stale verdict: the reason, how long it was silent (for disconnect: since it became suspect) and the window it outlived, ms. */
export interface Verdict {
  readonly reason: ReapReason
  readonly silentMs: number
  readonly windowMs: number
}

/** The heartbeat verdict: stale by its state's window at `nowMs`; undefined when not (or time reaping is off). */
export const timeVerdict = (t: Liveness, nowMs: number, w: Windows): Verdict | undefined => {
  if (!timeReapingOn(w)) return undefined
  const state = heartbeatStateOf(t)
  const windowMs = windowMsOf(state, w)
  return outlived(nowMs, t.lastSeenMs, windowMs) ? { reason: lifecycle[state].reap, silentMs: nowMs - t.lastSeenMs, windowMs } : undefined
}

/**
 * The disconnect verdict: suspect since `suspectSinceMs` (undefined: not
 * suspect) and silent since then longer than the disconnect grace. A message
 * after the disconnect (a later last_seen) restarts the grace.
 */
export const disconnectVerdict = (t: Liveness, suspectSinceMs: number | undefined, nowMs: number, w: Windows): Verdict | undefined => {
  if (!disconnectReapingOn(w) || suspectSinceMs === undefined) return undefined
  const since = Math.max(suspectSinceMs, t.lastSeenMs)
  return outlived(nowMs, since, w.disconnectGraceMs) ? { reason: "disconnect", silentMs: nowMs - since, windowMs: w.disconnectGraceMs } : undefined
}

/** The whole rule for one entry: disconnect first, then its heartbeat window; undefined when it is not stale. */
export const verdictOf = (t: Liveness, suspectSinceMs: number | undefined, nowMs: number, w: Windows): Verdict | undefined =>
  disconnectVerdict(t, suspectSinceMs, nowMs, w) ?? timeVerdict(t, nowMs, w)
