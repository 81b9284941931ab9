/**
 * Warnings rate-limited per key (issue 24 item 11: "a refusal for this reason is counted and logged,
 * rate-limited"): the first event of a key is logged at once; the ones after it within `windowMs` are counted and
 * told in one line when the window ends, which opens the next window; a window without events closes the key, so
 * its next event is again logged at once. So a flood costs at most one line per key per window, and a lone event is
 * never delayed. `record` is synchronous (Node event callbacks call it); the lines are written by fibers in the
 * caller's scope, on the Clock (TestClock in tests).
 */
import { Effect, Queue, type Scope } from "effect"

export interface WindowedWarnings<K extends string> {
  /** Counts one event of `key`; logs it now when `key` has no open window. Never blocks, never fails. */
  readonly record: (key: K) => void
}

/**
 * Warnings whose first line for a key is `first(key)` and whose window lines are `more(key, count, windowMs)`.
 * Lives as long as the caller's scope.
 */
export const makeWindowedWarnings = <K extends string>(options: {
  readonly windowMs: number
  readonly first: (key: K) => string
  readonly more: (key: K, count: number, windowMs: number) => string
}): Effect.Effect<WindowedWarnings<K>, never, Scope.Scope> =>
  Effect.gen(function*() {
    // Keys with an open window, and the events counted in it after the first.
    const open = new Map<K, { count: number }>()
    const opened = yield* Queue.unbounded<K>()
    const windowOf = (key: K): Effect.Effect<void> =>
      Effect.gen(function*() {
        yield* Effect.logWarning(options.first(key))
        for (;;) {
          yield* Effect.sleep(options.windowMs)
          const w = open.get(key)!
          if (w.count === 0) {
            open.delete(key)
            return
          }
          const count = w.count
          w.count = 0
          yield* Effect.logWarning(options.more(key, count, options.windowMs))
        }
      })
    yield* Queue.take(opened).pipe(
      Effect.flatMap((key) => Effect.forkScoped(windowOf(key))),
      Effect.forever,
      Effect.forkScoped
    )
    return {
      record: (key) => {
        const w = open.get(key)
        if (w !== undefined) {
          w.count++
          return
        }
        open.set(key, { count: 0 })
        Queue.offerUnsafe(opened, key)
      }
    }
  })
