/**
 * When the KV event publisher's drain runs (KvEventPublisher.ts; docs/kv-events.md, "The PUB"): on the event-loop
 * turn after an append (the request that appended answers first, and what the turn's other requests append goes
 * out in the same batch), and at most once per `minIntervalMs`, so a burst of STOREs is a few batches, not one
 * message per STORE for every subscriber to wake for (vLLM publishes one batch per engine step). One pending run
 * at most: wakes before it runs add nothing.
 */

/** The timers the schedule uses: Node's by default ({@link nodeTimers}), a fake one in tests. */
export interface DrainTimers {
  /** Milliseconds, monotonic. */
  readonly now: () => number
  /** Runs `f` on the next turn, after its I/O (setImmediate); returns its cancel. */
  readonly nextTurn: (f: () => void) => () => void
  /** Runs `f` after `ms` milliseconds (setTimeout); returns its cancel. */
  readonly after: (ms: number, f: () => void) => () => void
}

/** Node's: performance.now, setImmediate, setTimeout. */
export const nodeTimers: DrainTimers = {
  now: () => performance.now(),
  nextTurn: (f) => {
    const t = setImmediate(f)
    return () => clearImmediate(t)
  },
  after: (ms, f) => {
    const t = setTimeout(f, ms)
    return () => clearTimeout(t)
  }
}

/** A schedule of `drain`: `wake` on every append, `cancel` when the publisher stops. */
export interface DrainSchedule {
  readonly wake: () => void
  readonly cancel: () => void
}

/** Runs `drain` as the module doc says, at most once per `minIntervalMs` (ms) of `timers`' clock. */
export const makeDrainSchedule = (drain: () => void, minIntervalMs: number, timers: DrainTimers = nodeTimers): DrainSchedule => {
  let pending: (() => void) | undefined
  let last = -Infinity
  const run = () => {
    pending = undefined
    last = timers.now()
    drain()
  }
  return {
    wake: () => {
      if (pending !== undefined) return
      const wait = last + minIntervalMs - timers.now()
      // Whole milliseconds: Node keeps a timer list per distinct duration, and a fractional wait made a new one each time.
      pending = wait <= 0 ? timers.nextTurn(run) : timers.after(Math.ceil(wait), run)
    },
    cancel: () => {
      pending?.()
      pending = undefined
    }
  }
}
