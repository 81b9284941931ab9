/**
 * The receive loop's brake (issue 27 item 1: a peer whose replies cannot be delivered is slowed down first, never
 * the others). A token bucket over the messages the MQ server's receive loop takes from peers whose replies back up
 * (ReplyOutbox.isBackedUp: they are not reading them), all such peers together: at most
 * {@link BACKED_UP_MESSAGES_PER_SECOND} a second after a burst of {@link BACKED_UP_BURST}. Past it the loop waits
 * before its next receive.
 *
 * Threat: a peer that sends as fast as it can and reads nothing. Shedding its requests was not enough: the server
 * still read, decoded and dropped every one at the flooder's pace, so a flood kept the server's JS thread and its
 * I/O thread busy, its young generation churning, and the flooder itself running, and a well-behaved peer's request
 * waited for a CPU the flood held (bench:ping --flood: a fresh client's p99 3–6× and a heartbeat's 5–45× under 8
 * flooders). While the loop waits, libzmq stops reading the flooder's connection once its pipe holds the ROUTER's
 * receive high-water mark, so the flooder's own sends block and it sleeps: a flood then costs the server, and the
 * machine, what the brake lets in. Everyone else's requests wait at most one pause (about a millisecond: the loop
 * takes messages from the peers in turn, libzmq's fair queue) and are never charged.
 *
 * Plain data with an injected clock (ms, monotonic): the receive loop is a promise loop (the PING hot path, issue
 * 16), and the rule is tested exactly on a manual clock.
 */

/** Messages a second the receive loop takes from peers whose replies back up, all of them together. */
export const BACKED_UP_MESSAGES_PER_SECOND = 5_000

/** Messages of such peers taken at once before the rate applies (a legitimate peer's short stall costs it nothing). */
export const BACKED_UP_BURST = 100

/** What the brake did since start (`/api/status` `inbound.brake`). */
export interface ReceiveBrakeStats {
  /** Messages of peers whose replies back up that the loop took. */
  readonly charged: number
  /** Times the loop waited, and for how long in all (ms, as told; the timer may add a little). */
  readonly pauses: number
  readonly pausedMs: number
}

export interface ReceiveBrake {
  /**
   * The loop took one message of a peer whose replies back up: how many ms it must wait before its next receive
   * (0: none; otherwise at least 1, the timers' resolution).
   */
  readonly charge: () => number
  readonly stats: () => ReceiveBrakeStats
}

/** A brake of `perSecond` messages a second after a burst of `burst`, on the clock `nowMs`. */
export const makeReceiveBrake = (options: {
  readonly perSecond: number
  readonly burst: number
  readonly nowMs: () => number
}): ReceiveBrake => {
  const perMs = options.perSecond / 1000
  let tokens = options.burst
  let last = options.nowMs()
  let charged = 0
  let pauses = 0
  let pausedMs = 0
  return {
    charge: () => {
      const now = options.nowMs()
      tokens = Math.min(options.burst, tokens + (now - last) * perMs)
      last = now
      tokens -= 1
      charged++
      if (tokens >= 0) return 0
      // Until the bucket is back at zero: the next charge after the wait finds a token.
      const wait = Math.max(1, Math.ceil(-tokens / perMs))
      pauses++
      pausedMs += wait
      return wait
    },
    stats: () => ({ charged, pauses, pausedMs })
  }
}
