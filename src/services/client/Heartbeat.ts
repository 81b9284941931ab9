/**
 * The client heartbeat (DESIGN §6; upstream `HeartbeatThread`, reference
 * §6.3): one supervised fiber per server connection that pings every
 * `intervalMs`, tracks whether the server is healthy, and runs a recover
 * callback when the server comes back. The worker adapter and the scheduler
 * adapter both use it; what a ping sends is theirs to say (PING_REGISTERED or
 * PING [id] for a worker, PING [nil] for a scheduler).
 *
 * Mental model:
 * - The heartbeat starts **healthy** and is **not running** until `start`
 *   (the worker starts it after a successful registration; upstream's lazy
 *   start left idle workers unpinged, #4715/#4795). `start` is idempotent;
 *   after `stop` it is a no-op.
 * - Cadence: the first ping goes out at `start`, then one every `intervalMs`
 *   on a fixed grid measured with the Effect Clock (TestClock in tests). A
 *   cycle that overruns its grid point (a ping that waits its whole timeout,
 *   a slow re-registration) is followed at once by the next; missed points
 *   are not replayed. Upstream waits a full interval after a failed ping
 *   (10 to 20 s cadence); the grid keeps the server's view at `intervalMs`.
 * - One cycle: ping (bounded by `timeoutMs`, upstream #4593) → if `stop` ran
 *   meanwhile, stop here → apply the result:
 *   - `Failed`: unhealthy (degraded mode). One failed ping is enough; there
 *     is no cold-start grace (upstream E3).
 *   - `Alive` while unhealthy: the unhealthy→healthy edge. The recover
 *     callback runs **before** health is set; `false` keeps the heartbeat
 *     unhealthy and the next successful ping retries (upstream #3208).
 *   - `Lost` (the server answered but no longer holds this client's state:
 *     it restarted, or reaped the worker while it was paused): the recover
 *     callback runs at once, healthy or not — no unhealthy edge is needed
 *     (DESIGN §6; upstream #4732). A failed recovery makes it unhealthy.
 * - After each await the cycle re-checks the stopped flag, and `stop` also
 *   interrupts the fiber, so a straggling cycle never re-registers after the
 *   owner has unregistered (upstream #3631).
 * - `start` and `stop` are one transaction with respect to each other
 *   (issue 18 item 5): `start` changes the state, emits and forks the loop
 *   under one lock; `stop` sets the stopped flag at once, then takes that
 *   lock, so it interrupts whatever a `start` in progress forks, and the loop
 *   checks the flag before every ping. No PING goes out once `stop` began.
 * - Supervision: a ping that dies counts as a failed ping; a recover callback
 *   that dies counts as a failed recovery; a defect anywhere else in a cycle
 *   is logged at ERROR and the next cycle runs on schedule. The fiber only
 *   ends by `stop` or by its Scope closing.
 * - Every edge logs one WARNING ("… is unhealthy — entering degraded mode:
 *   <reason>", "… is healthy again — resuming normal operation"); a failure
 *   with the same reason while already unhealthy logs at DEBUG, a new reason
 *   at WARNING.
 */
import { Cause, Clock, Context, Duration, Effect, Fiber, Layer, Ref, type Scope, Semaphore } from "effect"
import { InvalidArgument } from "../../schema/WireError.ts"
import type { RequestError } from "./MqClient.ts"

/** Default heartbeat interval, ms (upstream `lmcache.mp.heartbeat_interval`, 10 s; DESIGN §6). */
export const DEFAULT_HEARTBEAT_INTERVAL_MS = 10_000

/** Most events an adapter's event log keeps (oldest dropped first). */
export const MAX_EVENTS = 1_000

/** `log` with `event` appended, keeping at most {@link MAX_EVENTS} (oldest dropped first). */
export const appendEvent = <E>(log: ReadonlyArray<E>, event: E): ReadonlyArray<E> =>
  log.length >= MAX_EVENTS ? [...log.slice(log.length - MAX_EVENTS + 1), event] : [...log, event]

/**
 * What one ping found out.
 * - `Alive`: the server answered and holds what this client expects.
 * - `Lost`: the server answered but has lost this client's registration
 *   (`detail` says what is missing); recover at once.
 * - `Failed`: no usable answer (timeout, error reply, closed socket);
 *   `reason` is logged and recorded.
 */
export type PingResult =
  | { readonly _tag: "Alive" }
  | { readonly _tag: "Lost"; readonly detail: string }
  | { readonly _tag: "Failed"; readonly reason: string }

/** Constructors for {@link PingResult}. */
export const PingResult = {
  alive: { _tag: "Alive" } as PingResult,
  lost: (detail: string): PingResult => ({ _tag: "Lost", detail }),
  failed: (reason: string): PingResult => ({ _tag: "Failed", reason })
} as const

/** Why the recover callback runs: the unhealthy→healthy edge, or a `Lost` answer. */
export type RecoverTrigger = "edge" | "lost"

/**
 * What the heartbeat did, for tests and replay. `atMs` is Effect Clock time
 * in milliseconds (TestClock time in tests).
 */
export type HeartbeatEvent =
  | { readonly _tag: "HeartbeatStarted"; readonly atMs: number }
  | { readonly _tag: "HeartbeatStopped"; readonly atMs: number }
  | { readonly _tag: "Unhealthy"; readonly atMs: number; readonly reason: string }
  | { readonly _tag: "Healthy"; readonly atMs: number }

/**
 * Resolves an adapter's heartbeat settings (DESIGN §6): interval default
 * 10,000 ms, timeout default = the interval (upstream #4593). Fails with
 * InvalidArgument when either is not a positive finite number of ms.
 * Returns `[intervalMs, timeoutMs]`.
 */
export const heartbeatTimes = (
  settings: { readonly heartbeatIntervalMs?: number; readonly heartbeatTimeoutMs?: number }
): Effect.Effect<readonly [number, number], InvalidArgument> => {
  const intervalMs = settings.heartbeatIntervalMs ?? DEFAULT_HEARTBEAT_INTERVAL_MS
  const timeoutMs = settings.heartbeatTimeoutMs ?? intervalMs
  if (!(Number.isFinite(intervalMs) && intervalMs > 0)) {
    return Effect.fail(new InvalidArgument({ message: `heartbeatIntervalMs must be a positive number of ms, got ${intervalMs}` }))
  }
  if (!(Number.isFinite(timeoutMs) && timeoutMs > 0)) {
    return Effect.fail(new InvalidArgument({ message: `heartbeatTimeoutMs must be a positive number of ms, got ${timeoutMs}` }))
  }
  return Effect.succeed([intervalMs, timeoutMs] as const)
}

/**
 * Why a ping (`opName`: "ping" or "ping_registered") got no usable answer,
 * in words for the log. A `bad_request` names the server's answer and says
 * what it means for mixed versions (DESIGN §6): for PING, a server that
 * still expects upstream's old empty payload (#2692); either way the
 * adapter stays in degraded mode until the server is upgraded.
 */
export const pingFailureReason = (opName: string, e: RequestError): string => {
  switch (e._tag) {
    case "BadRequest":
      return opName === "ping"
        ? `the server answered ping with bad_request (${e.message}); it predates this client's protocol ` +
          `(an old server expects the old empty PING payload) — upgrade the server; staying in degraded mode`
        : `the server answered ${opName} with bad_request (${e.message}); the client and server protocol versions ` +
          `differ — upgrade the server; staying in degraded mode`
    case "RequestTimeout":
      return `no reply to ${opName} within ${e.timeoutMs} ms${e.handshake === undefined ? "" : `: ${e.handshake}`}`
    default:
      return `${opName} failed: ${e._tag}: ${e.message}`
  }
}

/** The message of a failed request's cause (its error, or the defect). */
export const causeText = (cause: Cause.Cause<unknown>): string => {
  const e = Cause.squash(cause)
  return e instanceof Error ? e.message : String(e)
}

/** Heartbeat settings. Times in milliseconds. */
export interface HeartbeatOptions {
  /** Names the server (and the client) in every log line, e.g. `mpcache server tcp://127.0.0.1:5555`. */
  readonly label: string
  /** Time between pings, ms (upstream `lmcache.mp.heartbeat_interval`, 10 s). Must be > 0. */
  readonly intervalMs: number
  /** How long one ping may take before it counts as failed, ms (upstream #4593; default there = interval). Must be > 0. */
  readonly timeoutMs: number
  /** One ping. Its own errors are the caller's to map into `Failed`; a defect counts as `Failed` too. */
  readonly ping: Effect.Effect<PingResult>
  /**
   * Re-establishes the client's server-side state; `true` when done. Runs
   * before health is set on the unhealthy→healthy edge, and at once on a
   * `Lost` answer. Default: succeed with `true` (nothing to recover).
   */
  readonly recover?: (trigger: RecoverTrigger) => Effect.Effect<boolean>
  /**
   * Called with every {@link HeartbeatEvent}; a defect here is logged like
   * any other cycle defect. HeartbeatStarted is emitted under the start/stop
   * lock: this callback must not call `stop` (it would wait for itself).
   */
  readonly onEvent?: (event: HeartbeatEvent) => Effect.Effect<void>
}

/** A running (or startable) heartbeat; built by {@link makeHeartbeat}. */
export interface HeartbeatShape {
  /**
   * Forks the heartbeat fiber into the Scope it was made in. Idempotent; a
   * no-op after `stop`. Uninterruptible, and serialized with `stop`
   * (issue 18 item 5).
   */
  readonly start: Effect.Effect<void>
  /**
   * Stops for good: sets the stopped flag (so a cycle in flight changes
   * nothing once its await returns, and no further ping is sent), waits for
   * a `start` in progress to record its fiber, then interrupts the fiber and
   * waits for it. Idempotent. Also runs when the Scope closes.
   */
  readonly stop: Effect.Effect<void>
  /** False while in degraded mode. Starts true. */
  readonly isHealthy: Effect.Effect<boolean>
  /** True between `start` and `stop`. */
  readonly isRunning: Effect.Effect<boolean>
  /** True once `stop` ran (or the Scope closed). */
  readonly isStopped: Effect.Effect<boolean>
  /**
   * Enters degraded mode now (logs the edge); only a later successful ping
   * leaves it. The scheduler calls this when a lookup times out (upstream
   * clears its health event there, reference §6.3).
   */
  readonly markUnhealthy: (reason: string) => Effect.Effect<void>
  /** Cycles run so far (each ping attempt counts once, including cut-short and failed ones). */
  readonly cycles: Effect.Effect<number>
}

/** A heartbeat as a service, for programs that want one per layer. */
export class Heartbeat extends Context.Service<Heartbeat, HeartbeatShape>()("mpcache/services/Heartbeat") {
  /** Makes a heartbeat for the life of the layer; it is not started (call `start`). */
  static readonly layer = (options: HeartbeatOptions) => Layer.effect(this, makeHeartbeat(options))
  /**
   * For tests: the real heartbeat with a test's times (default 10 s interval
   * and timeout, Clock time: TestClock drives it) and `overrides`; its ping
   * answers `Alive` unless the test gives its own (a scripted one that
   * records its calls).
   */
  static readonly layerTest = (overrides: Partial<HeartbeatOptions> = {}) =>
    this.layer({ label: "mpcache server test://", intervalMs: 10_000, timeoutMs: 10_000, ping: Effect.succeed(PingResult.alive), ...overrides })
}

type RunState = "idle" | "running" | "stopped"

/**
 * Builds a heartbeat in the current Scope, healthy and not yet started.
 * Closing the Scope stops it. Dies when `intervalMs` or `timeoutMs` is not a
 * positive finite number (the adapters validate their options first).
 */
export const makeHeartbeat = (options: HeartbeatOptions): Effect.Effect<HeartbeatShape, never, Scope.Scope> =>
  Effect.gen(function*() {
    const { intervalMs, label, timeoutMs } = options
    if (!(Number.isFinite(intervalMs) && intervalMs > 0)) {
      return yield* Effect.die(new RangeError(`heartbeat interval must be a positive number of ms, got ${intervalMs}`))
    }
    if (!(Number.isFinite(timeoutMs) && timeoutMs > 0)) {
      return yield* Effect.die(new RangeError(`heartbeat timeout must be a positive number of ms, got ${timeoutMs}`))
    }
    const scope = yield* Effect.scope
    const healthy = yield* Ref.make(true)
    const state = yield* Ref.make<RunState>("idle")
    const cycles = yield* Ref.make(0)
    const lastReason = yield* Ref.make<string | undefined>(undefined)
    /** Held by `start` from its state change until the fiber is recorded; `stop` waits for it before interrupting. */
    const runLock = yield* Semaphore.make(1)
    let fiber: Fiber.Fiber<void> | undefined
    const recover = options.recover ?? (() => Effect.succeed(true))
    const onEvent = options.onEvent
    const emit = (make: (atMs: number) => HeartbeatEvent) =>
      onEvent === undefined ? Effect.void : Effect.flatMap(Clock.currentTimeMillis, (atMs) => onEvent(make(atMs)))
    const isStopped = Effect.map(Ref.get(state), (s) => s === "stopped")

    const setUnhealthy = (reason: string) =>
      Effect.gen(function*() {
        const was = yield* Ref.getAndSet(healthy, false)
        const previous = yield* Ref.getAndSet(lastReason, reason)
        if (was) {
          yield* Effect.logWarning(`${label} is unhealthy — entering degraded mode: ${reason}`)
          yield* emit((atMs) => ({ _tag: "Unhealthy", atMs, reason }))
        } else if (previous !== reason) {
          yield* Effect.logWarning(`${label} is still unhealthy: ${reason}`)
        } else {
          yield* Effect.logDebug(`${label} is still unhealthy: ${reason}`)
        }
      })

    const setHealthy = Effect.gen(function*() {
      const was = yield* Ref.getAndSet(healthy, true)
      yield* Ref.set(lastReason, undefined)
      if (!was) {
        yield* Effect.logWarning(`${label} is healthy again — resuming normal operation`)
        yield* emit((atMs) => ({ _tag: "Healthy", atMs }))
      }
    })

    /** Interruption passes through; anything else is a defect to log. */
    const unlessInterrupted = <A>(onDefect: (cause: Cause.Cause<unknown>) => Effect.Effect<A>) => (cause: Cause.Cause<unknown>) =>
      Cause.hasInterruptsOnly(cause) ? Effect.failCause(cause as Cause.Cause<never>) : onDefect(cause)

    const pingOnce: Effect.Effect<PingResult> = options.ping.pipe(
      Effect.timeoutOrElse({
        duration: Duration.millis(timeoutMs),
        orElse: () => Effect.succeed(PingResult.failed(`no reply to the heartbeat ping within ${timeoutMs} ms`))
      }),
      Effect.catchCause(unlessInterrupted((cause) =>
        Effect.as(
          Effect.logError(`${label}: the heartbeat ping died; counted as a failed ping`, cause),
          PingResult.failed(`the heartbeat ping died: ${Cause.pretty(cause).split("\n")[0] ?? "defect"}`)
        )
      ))
    )

    const recoverSafely = (trigger: RecoverTrigger): Effect.Effect<boolean> =>
      recover(trigger).pipe(
        Effect.catchCause(unlessInterrupted((cause) =>
          Effect.as(Effect.logError(`${label}: the recover callback died; counted as a failed recovery`, cause), false)
        ))
      )

    const cycle = Effect.gen(function*() {
      const result = yield* pingOnce
      yield* Ref.update(cycles, (n) => n + 1)
      if (yield* isStopped) return
      switch (result._tag) {
        case "Failed":
          return yield* setUnhealthy(result.reason)
        case "Lost": {
          yield* Effect.logWarning(`${label}: ${result.detail} — re-registering with the same instance id`)
          const ok = yield* recoverSafely("lost")
          if (yield* isStopped) return
          return yield* (ok ? setHealthy : setUnhealthy(`re-registration after "${result.detail}" failed`))
        }
        case "Alive": {
          if (yield* Ref.get(healthy)) return
          yield* Effect.logWarning(`${label} is healthy again, triggering recovery callback`)
          const ok = yield* recoverSafely("edge")
          if (yield* isStopped) return
          if (ok) return yield* setHealthy
          return yield* Effect.logWarning(
            `${label}: recovery failed; staying in degraded mode, retrying on the next successful ping`
          )
        }
      }
    })

    const supervisedCycle = cycle.pipe(
      Effect.catchCause(unlessInterrupted((cause) =>
        Effect.logError(`${label}: a heartbeat cycle failed; the heartbeat goes on`, cause)
      ))
    )

    const loop = Effect.gen(function*() {
      let nextMs = yield* Clock.currentTimeMillis
      // The flag is checked before each ping: a loop that starts (or wakes) after stop sends nothing.
      while (!(yield* isStopped)) {
        yield* supervisedCycle
        nextMs += intervalMs
        const nowMs = yield* Clock.currentTimeMillis
        if (nowMs >= nextMs) nextMs = nowMs
        else yield* Effect.sleep(Duration.millis(nextMs - nowMs))
      }
    })

    // Uninterruptible under the lock: a start cut short between its state change and its fork would leave
    // "running" with no fiber for stop to interrupt.
    const start = runLock.withPermits(1)(Effect.uninterruptible(Effect.gen(function*() {
      const started = yield* Ref.modify(state, (s): [boolean, RunState] => s === "idle" ? [true, "running"] : [false, s])
      if (!started) return
      yield* emit((atMs) => ({ _tag: "HeartbeatStarted", atMs }))
      fiber = yield* Effect.forkIn(loop, scope)
    })))

    const stop = Effect.gen(function*() {
      // The flag first, outside the lock: a loop forked by a start in progress then sends nothing.
      const previous = yield* Ref.getAndSet(state, "stopped")
      if (previous === "stopped") return
      // The lock next: a start between its state change and its fork has recorded its fiber once this is taken.
      yield* runLock.withPermits(1)(Effect.suspend(() => fiber === undefined ? Effect.void : Fiber.interrupt(fiber)))
      if (previous === "running") yield* emit((atMs) => ({ _tag: "HeartbeatStopped", atMs }))
    })

    yield* Effect.addFinalizer(() => stop)

    return {
      start,
      stop,
      isHealthy: Ref.get(healthy),
      isRunning: Effect.map(Ref.get(state), (s) => s === "running"),
      isStopped,
      markUnhealthy: setUnhealthy,
      cycles: Ref.get(cycles)
    } satisfies HeartbeatShape
  })
