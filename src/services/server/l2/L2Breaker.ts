/**
 * The L2 circuit breaker (issue 15 item 6, DESIGN §9: failure is a miss,
 * never a hang). `failures` failures or timeouts within `windowMs` open it:
 * LOOKUP then answers from L1 only and writes are skipped. While open, one
 * fiber probes with PING after a jittered delay (`probeMs` doubled per
 * failed probe up to `probeMaxMs`, each delay drawn from [½, 1] of that —
 * "equal jitter", so servers sharing one Redis do not probe in step), and
 * the first probe that answers closes it.
 *
 * It starts `probing`: nothing is known of the store until it answers, so
 * the first PING is sent at once and L2 is used only once it answers (an
 * unreachable store at start reads `open`, never `ok`). That first close is
 * not counted as a transition (the breaker never opened).
 *
 * States: `probing` (start) → `ok` or `open`; `ok` (closed) → `open` →
 * `probing` → `ok`, or back to `open`.
 * Time is Effect's Clock (TestClock in tests); jitter is Effect's Random.
 */
import { Clock, Duration, Effect, Metric, Random, Scope } from "effect"
import type { L2Error } from "./L2Store.ts"
import { l2BreakerTransitionsTotal } from "./L2Metrics.ts"

/** Breaker state as `/api/status.l2.state` reports it. */
export type BreakerState = "ok" | "open" | "probing"

/** Breaker settings (the `--l2-breaker-*` flags). */
export interface BreakerSettings {
  readonly breakerFailures: number
  readonly breakerWindowMs: number
  readonly breakerProbeMs: number
  readonly breakerProbeMaxMs: number
}

/** A breaker; every method is synchronous state plus, on open, one forked prober. */
export interface L2Breaker {
  /** Whether L2 may be used now (state `ok`). */
  readonly isClosed: () => boolean
  /** Records a failure or timeout; opens the breaker at the `failures`-th in the window. */
  readonly onFailure: (error: L2Error) => Effect.Effect<void>
  readonly state: () => BreakerState
  /** The last failure's message (null before any). */
  readonly lastError: () => string | null
  /** How many times it opened and closed since start. */
  readonly transitions: () => { readonly opened: number; readonly closed: number }
}

/**
 * A breaker in state `probing`, whose prober (forked at once into the
 * current scope, interrupted when it closes) runs `ping` now and closes it
 * on the first answer, or opens it and goes on probing on the jittered delay.
 */
export const makeBreaker = (settings: BreakerSettings, ping: Effect.Effect<void, L2Error>): Effect.Effect<L2Breaker, never, Scope.Scope> =>
  Effect.gen(function*() {
    const scope = yield* Effect.scope
    let state: BreakerState = "probing"
    let lastError: string | null = null
    let failuresAtMs: Array<number> = []
    const counts = { opened: 0, closed: 0 }

    const enter = (to: BreakerState) =>
      Effect.suspend(() => {
        state = to
        if (to === "open") counts.opened++
        if (to === "ok") counts.closed++
        return Metric.update(Metric.withAttributes(l2BreakerTransitionsTotal, { to }), 1)
      })

    /** Probes until PING answers; `atStart`: the first PING at once, and its close not counted. */
    const probe = (atStart: boolean) => Effect.gen(function*() {
      let delayMs = settings.breakerProbeMs
      for (let first = atStart;; first = false) {
        if (!first) {
          const jitter = yield* Random.nextBetween(0.5, 1)
          yield* Effect.sleep(Duration.millis(Math.round(delayMs * jitter)))
          yield* enter("probing")
        }
        const failed = yield* ping.pipe(Effect.match({ onSuccess: () => undefined, onFailure: (e) => e }))
        if (failed === undefined) {
          failuresAtMs = []
          if (first) {
            state = "ok"
            return yield* Effect.logInfo("L2 answers PING: breaker closed, L2 in use")
          }
          yield* enter("ok")
          return yield* Effect.logInfo("L2 answers PING again: breaker closed, L2 in use")
        }
        lastError = failed.message
        yield* enter("open")
        if (!first) delayMs = Math.min(delayMs * 2, settings.breakerProbeMaxMs)
      }
    })

    const onFailure = (error: L2Error) =>
      Effect.gen(function*() {
        lastError = error.message
        if (state !== "ok") return
        const now = yield* Clock.currentTimeMillis
        failuresAtMs = failuresAtMs.filter((t) => now - t < settings.breakerWindowMs)
        failuresAtMs.push(now)
        if (failuresAtMs.length < settings.breakerFailures) return
        yield* enter("open")
        yield* Effect.logWarning(
          `L2 breaker open after ${failuresAtMs.length} failures within ${settings.breakerWindowMs} ms (last: ${error.message}); LOOKUP answers from L1 only and writes are skipped until PING answers`
        )
        yield* Effect.forkIn(probe(false), scope)
      })

    yield* Effect.forkIn(probe(true), scope)

    return {
      isClosed: () => state === "ok",
      onFailure,
      state: () => state,
      lastError: () => lastError,
      transitions: () => ({ ...counts })
    }
  })
