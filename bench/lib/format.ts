/** Number formats of the report tables (docs/benchmarks.md). */

/** `n` rounded, with en-US thousands separators: `12,145`. */
export const int = (n: number): string => Math.round(n).toLocaleString("en-US")

/** A ratio with two decimals and a multiplication sign: `1.61×`. */
export const times = (x: number): string => `${x.toFixed(2)}×`

/** `format`, or "n/a" for a value that is not finite (a window without samples). */
export const orNa = (format: (n: number) => string) => (n: number): string => Number.isFinite(n) ? format(n) : "n/a"
