/**
 * Rate-limited WARNING lines (issue 24 item 11: "a refusal … is counted and
 * logged (rate-limited)"): at most one line per key and window, on the
 * Effect Clock (TestClock in tests). Events that fall inside a window are
 * counted and the next line of that key says how many there were, so a
 * flood costs one line per window and loses no count.
 *
 * @internal
 */
import { Clock, Effect } from "effect"

export interface WarnWindow {
  /**
   * Logs `message` at WARNING for `n` events (default 1) of `key`, unless a
   * line of `key` was logged less than the window ago: then the events are
   * only counted, for the next line ("; N more like it since the last
   * warning"). `annotations` go on the line.
   */
  readonly warn: (key: string, message: string, n?: number, annotations?: Readonly<Record<string, unknown>>) => Effect.Effect<void>
}

/** A window of `windowMs` per key; at most `maxKeys` keys are remembered (then all are forgotten at once). */
export const makeWarnWindow = (windowMs: number, maxKeys = 10_000): WarnWindow => {
  const last = new Map<string, { atMs: number; suppressed: number }>()
  return {
    warn: (key, message, n = 1, annotations = {}) =>
      Effect.gen(function*() {
        const now = yield* Clock.currentTimeMillis
        const held = last.get(key)
        if (held !== undefined && now - held.atMs < windowMs) {
          held.suppressed += n
          return
        }
        if (last.size >= maxKeys) last.clear()
        last.set(key, { atMs: now, suppressed: 0 })
        const more = held !== undefined && held.suppressed > 0 ? `; ${held.suppressed} more like it since the last warning` : ""
        yield* Effect.logWarning(`${message}${more}`).pipe(Effect.annotateLogs(annotations))
      })
  }
}
