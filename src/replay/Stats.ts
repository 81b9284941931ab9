/** Latency samples and their percentiles (replay summary). */

export class Samples {
  private readonly values: Array<number> = []
  add(ms: number): void {
    this.values.push(ms)
  }
  get count(): number {
    return this.values.length
  }
  /** The arithmetic mean; 0 when empty. */
  mean(): number {
    return this.values.length === 0 ? 0 : this.values.reduce((a, b) => a + b, 0) / this.values.length
  }
  /** The q-quantile (0…1) by nearest rank; 0 when empty. */
  quantile(q: number): number {
    if (this.values.length === 0) return 0
    const sorted = [...this.values].sort((a, b) => a - b)
    return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1))]!
  }
}

/** Reads `name{label="value"} N` counters from Prometheus text. */
export const promCounters = (text: string, name: string, label: string): Record<string, number> => {
  const out: Record<string, number> = {}
  const re = new RegExp(`^${name}\\{${label}="([^"]*)"\\} ([0-9.e+]+)$`, "gm")
  for (const m of text.matchAll(re)) out[m[1]!] = Number(m[2])
  return out
}

/** The sum of every sample of `name` (any labels, or none) in Prometheus text; undefined when there is none. */
export const promSum = (text: string, name: string): number | undefined => {
  let total: number | undefined
  const re = new RegExp(`^${name}(?:\\{[^}]*\\})? ([0-9.e+]+)$`, "gm")
  for (const m of text.matchAll(re)) total = (total ?? 0) + Number(m[1])
  return total
}
