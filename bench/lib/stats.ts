/**
 * Statistics of the benches: percentiles and medians of samples, and the
 * round-trip summary every PING table prints. Apart from `summarizeUs`
 * (µs), units are the caller's: nothing converts.
 */

/** A copy of `xs` sorted ascending (the input is left as it is). */
export const ascending = (xs: ReadonlyArray<number>): Array<number> => [...xs].sort((a, b) => a - b)

/**
 * The nearest-rank `p`-th percentile (0 < p ≤ 100) of an ascending array:
 * the smallest sample with at least p % of the samples at or below it.
 * NaN for no samples.
 */
export const percentile = (sorted: ReadonlyArray<number>, p: number): number =>
  sorted[Math.max(0, Math.ceil((p / 100) * sorted.length) - 1)] ?? Number.NaN

/** The median of `xs` in any order (the mean of the middle two for an even count); NaN for none. */
export const median = (xs: ReadonlyArray<number>): number => {
  const s = ascending(xs)
  if (s.length === 0) return Number.NaN
  const mid = s.length >> 1
  return s.length % 2 === 1 ? s[mid]! : (s[mid - 1]! + s[mid]!) / 2
}

/** Count, p50, p99 and max of a set of round trips, µs; NaN where there are none. */
export interface LatencySummary {
  readonly samples: number
  readonly p50Us: number
  readonly p99Us: number
  readonly maxUs: number
}

/**
 * Summarizes round trips in µs. Sorts the array in place: the benches hand
 * over arrays of up to millions of samples they no longer need, and a copy
 * would double the memory of the largest.
 */
export const summarizeUs = (latenciesUs: Array<number>): LatencySummary => {
  const sorted = latenciesUs.sort((a, b) => a - b)
  return { samples: sorted.length, p50Us: percentile(sorted, 50), p99Us: percentile(sorted, 99), maxUs: sorted.at(-1) ?? Number.NaN }
}
