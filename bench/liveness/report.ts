/**
 * What the parts of bench:liveness (this folder) report through
 * bench/liveness/liveness.ts: one `TargetRow` per target they check, the table of
 * them at the top of the section, and the number formats of their tables.
 */
import type { SummaryRow } from "../lib/summary.ts"

/** One target of the liveness issue: a figure, its reference from the same run, and whether it was met. */
export interface TargetRow {
  readonly check: string
  readonly measured: string
  readonly reference: string
  /** measured ÷ reference, formatted (`1.53×`). */
  readonly ratio: string
  readonly target: string
  readonly ok: boolean
}

/** Milliseconds with 1 to 3 decimals, more for smaller values: `21.8`, `5.92`, `0.045`. */
export const ms = (x: number): string => (x >= 10 ? x.toFixed(1) : x >= 1 ? x.toFixed(2) : x.toFixed(3))

/** Milliseconds shown as seconds with 3 decimals: `1068` → `1.068`. */
export const sec = (xMs: number): string => (xMs / 1000).toFixed(3)

const met = (ok: boolean): string => (ok ? "yes" : "**no**")

/** The section's first table: one line per target. */
export const targetTable = (rows: ReadonlyArray<TargetRow>): string =>
  [
    "| check | measured | reference (same run) | ratio | target | met |",
    "|---|---:|---:|---:|---:|:---:|",
    ...rows.map((t) => `| ${t.check} | ${t.measured} | ${t.reference} | ${t.ratio} | ${t.target} | ${met(t.ok)} |`)
  ].join("\n")

/** A target as the suite's summary row (bench/lib/summary.ts); the ratio is parsed back from its text. */
export const summaryRow = (t: TargetRow): SummaryRow => ({
  bench: "liveness",
  figure: t.check,
  measured: t.measured,
  reference: t.reference,
  ratio: Number.parseFloat(t.ratio),
  target: t.target,
  met: t.ok
})
