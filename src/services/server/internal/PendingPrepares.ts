/**
 * @internal
 *
 * The pending PREPAREs of one engine-driven transfer strategy (DESIGN §4,
 * issue 18): how they are keyed (the request and its range), when one is
 * past `--prepare-ttl-seconds`, and the expiry timer that releases those.
 * Used by `TransferStrategy.ts`; the behaviour is documented in the header
 * of `EngineDrivenTransfer.ts`.
 */
import { Clock, Duration, Effect, type Scope } from "effect"
import type { CacheKey } from "../../../schema/CacheKey.ts"

/** What every pending PREPARE carries for its expiry (issue 18): when it was recorded (Clock ms). */
export interface Pending {
  readonly preparedAtMs: number
}

/**
 * How long a PREPARE may wait for its COMMIT (`--prepare-ttl-seconds`, in
 * ms) and the Scope its expiry timers run in (the entry's: closing it stops
 * them).
 */
export interface PrepareExpiry {
  readonly ttlMs: number
  readonly scope: Scope.Scope
}

/**
 * The key of a pending transfer within one instance: the request and its
 * range (request_id, worker_id, start, end), NUL-separated.
 */
export const pendingKeyOf = (key: CacheKey): string => `${key.request_id}\u0000${key.worker_id}\u0000${key.start}\u0000${key.end}`

/** A pending key for logs: "request <id> (rank <r>, tokens [<start>, <end>))". */
export const describePending = (pendingKey: string): string => {
  const [requestId, rank, start, end] = pendingKey.split("\u0000")
  return `request ${requestId} (rank ${rank}, tokens [${start}, ${end}))`
}

/** Strictly past the TTL: `now − prepared > ttl` (at exactly the TTL a COMMIT is still in time). */
export const isExpired = (p: Pending, nowMs: number, ttlMs: number): boolean => nowMs - p.preparedAtMs > ttlMs

/** Pending requests of `m` and the chunks (`size` of each) they hold. */
export const pendingCount = <T>(m: ReadonlyMap<string, T>, size: (t: T) => number): { readonly requests: number; readonly chunks: number } => {
  let chunks = 0
  for (const t of m.values()) chunks += size(t)
  return { requests: m.size, chunks }
}

/**
 * The expiry timer of one map of pending PREPAREs, as the effect to run
 * after an insert: forks the timer fiber (in `expiry.scope`) unless it runs.
 * It sleeps until the oldest record is 1 ms past the TTL, then takes every
 * record past it out of the map and releases them, in one uninterruptible
 * step (a COMMIT either got a record first or finds nothing; a release is
 * never cut in half), and stops once the map is empty. Records are kept in
 * insertion order, which is the order of their `preparedAtMs` (each is
 * inserted at the clock's now, read in the same synchronous step; a PREPARE
 * again re-inserts), so only the due ones at the front are looked at.
 */
export const expiryTimer = <P extends Pending>(
  expiry: PrepareExpiry,
  map: Map<string, P>,
  release: (pendingKey: string, p: P) => Effect.Effect<void>
): Effect.Effect<void> => {
  let running = false
  const step = (nowMs: number) =>
    Effect.uninterruptible(Effect.suspend(() => {
      const due: Array<readonly [string, P]> = []
      let oldest: number | undefined
      for (const [pendingKey, p] of map) {
        if (!isExpired(p, nowMs, expiry.ttlMs)) {
          oldest = p.preparedAtMs
          break
        }
        due.push([pendingKey, p])
      }
      for (const [pendingKey] of due) map.delete(pendingKey)
      // Stopped in the same synchronous step as the look that found nothing left: a later insert restarts it.
      if (oldest === undefined) running = false
      return Effect.as(Effect.forEach(due, ([pendingKey, p]) => release(pendingKey, p), { discard: true }), oldest)
    }))
  const loop = Effect.gen(function*() {
    while (true) {
      const nowMs = yield* Clock.currentTimeMillis
      const oldest = yield* step(nowMs)
      if (oldest === undefined) return
      yield* Effect.sleep(Duration.millis(oldest + expiry.ttlMs + 1 - nowMs))
    }
  })
  return Effect.suspend(() => {
    if (running || map.size === 0) return Effect.void
    running = true
    return Effect.asVoid(Effect.forkIn(loop, expiry.scope))
  })
}
