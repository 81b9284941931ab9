/**
 * The last reaps, for operators (issue 17: the status page's reaps list and
 * `recent_reaps` of `/api/status`): a bounded ring the reaper appends one
 * row to per reaped instance, newest last; once full, each append drops the
 * oldest row. Memory is bounded by `capacity` rows whatever the churn.
 */
import type { ReapReason } from "./Rule.ts"

/** How many reaps the server remembers (issue 17: "the last 50 reaps"). */
export const RECENT_REAPS_CAPACITY = 50

/**
 * One reap as `/api/status` lists it (`recent_reaps[]`, schema
 * `StatusReap` in src/schema/Status.ts). Keys are snake_case like the rest
 * of the document.
 */
export interface RecentReap {
  /** The instance id, decimal. */
  readonly instance_id: string
  /** Which window ran out (DESIGN §5): timeout, grace (registration) or disconnect. */
  readonly reason: ReapReason
  /** When the reaper judged it, Clock millis (Unix epoch ms on a live server). */
  readonly reaped_at_ms: number
  /** How long it had been silent (or disconnected) at that time, seconds. */
  readonly silent_seconds: number
  /** The window it outlived, seconds. */
  readonly window_seconds: number
  /** The module (liveness target) that held it, e.g. `lmcache_driven_transfer`. */
  readonly module: string
}

/** A ring of the last `capacity` reaps (not an Effect service: the reaper owns one). */
export interface RecentReaps {
  /** Appends one row, dropping the oldest when full. */
  readonly add: (reap: RecentReap) => void
  /** The rows, oldest first (at most `capacity`). */
  readonly list: () => ReadonlyArray<RecentReap>
}

/** A fresh, empty ring of `capacity` rows (at least 1). */
export const makeRecentReaps = (capacity: number = RECENT_REAPS_CAPACITY): RecentReaps => {
  const size = Math.max(1, Math.floor(capacity))
  const rows: Array<RecentReap | undefined> = new Array(size)
  let next = 0
  let count = 0
  return {
    add: (reap) => {
      rows[next] = reap
      next = (next + 1) % size
      count = Math.min(size, count + 1)
    },
    list: () => {
      const out: Array<RecentReap> = []
      for (let i = 0; i < count; i++) out.push(rows[(next - count + i + size) % size]!)
      return out
    }
  }
}
