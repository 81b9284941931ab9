/**
 * "Messages already received are handled before anyone is judged" (DESIGN
 * §5): the MQ server numbers each request it queues and marks it finished;
 * the reaper waits, before a scan judges, until every request received
 * before the scan began has finished, so a PING that arrived just before a
 * scan is never lost to it.
 */
import { Context, Deferred, Duration, Effect, Layer } from "effect"

export class RequestBarrier extends Context.Service<RequestBarrier, {
  /** A request was received and queued: its sequence number. */
  readonly enter: () => number
  /** The request finished (replied or failed). */
  readonly exit: (seq: number) => void
  /**
   * Lets the receive loop take what the socket already holds, then waits
   * until every request received so far has finished, at most `timeout`.
   */
  readonly awaitReceived: (timeout: Duration.Input) => Effect.Effect<void>
  /** Scans waiting and requests not yet finished (tests, status): both return to 0 when idle. */
  readonly stats: () => { readonly waiters: number; readonly unfinished: number }
}>()("mpcache/services/RequestBarrier") {
  static readonly layer = Layer.sync(this, () => {
    let next = 0
    const unfinished = new Set<number>()
    // A Set: a waiter leaves it when released, and also when its wait ends otherwise (timeout,
    // interrupt), so a request that never finishes cannot pile waiters up for the server's life.
    const waiters = new Set<{ readonly upTo: number; readonly done: Deferred.Deferred<void> }>()
    const settle = () => {
      let min = Infinity
      for (const s of unfinished) if (s < min) min = s
      for (const w of waiters) {
        if (w.upTo < min) {
          Deferred.doneUnsafe(w.done, Effect.void)
          waiters.delete(w)
        }
      }
    }
    return {
      enter: () => {
        const seq = next++
        unfinished.add(seq)
        return seq
      },
      exit: (seq) => {
        unfinished.delete(seq)
        // Per request: the scan over the unfinished set is only worth it when a scan waits.
        if (waiters.size > 0) settle()
      },
      awaitReceived: (timeout) =>
        Effect.gen(function*() {
          // One turn of the event loop: the receive loop reads what libzmq has buffered.
          yield* Effect.promise(() => new Promise<void>((resolve) => setImmediate(resolve)))
          const waiter = { upTo: next - 1, done: yield* Deferred.make<void>() }
          waiters.add(waiter)
          settle()
          yield* Deferred.await(waiter.done).pipe(
            Effect.timeoutOrElse({ duration: timeout, orElse: () => Effect.void }),
            Effect.ensuring(Effect.sync(() => waiters.delete(waiter)))
          )
        }),
      stats: () => ({ waiters: waiters.size, unfinished: unfinished.size })
    }
  })
  /** For tests: the real barrier (it needs nothing; requests enter and exit as a test drives them). */
  static readonly layerTest = this.layer

  /** No MQ server in front (unit tests): nothing to wait for. */
  static readonly layerNoop = Layer.succeed(this, {
    enter: () => 0,
    exit: () => {},
    awaitReceived: () => Effect.void,
    stats: () => ({ waiters: 0, unfinished: 0 })
  })
}
