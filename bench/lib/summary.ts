/**
 * The one-line-per-target results every bench can hand to the suite
 * (bench/suite.ts): with `--summary FILE` a bench writes its rows there as
 * JSON; the suite gathers them into the table at the top of
 * docs/benchmarks.md. Each row is a figure beside its reference measured in
 * the same run, and the target for the ratio.
 */
import { existsSync, readFileSync, writeFileSync } from "node:fs"

/** One figure of one bench. */
export interface SummaryRow {
  readonly bench: string
  readonly figure: string
  /** The figure, formatted with its unit. */
  readonly measured: string
  /** The reference measured in the same run, formatted; "—" when the target is absolute. */
  readonly reference: string
  /** measured ÷ reference, when there is a reference. */
  readonly ratio: number | null
  readonly target: string
  /** null: nothing to meet (reported only). */
  readonly met: boolean | null
}

/** Writes `rows` to `file` (the bench's `--summary` argument); nothing when it is undefined. */
export const writeSummary = (file: string | undefined, rows: ReadonlyArray<SummaryRow>): void => {
  if (file !== undefined) writeFileSync(file, `${JSON.stringify(rows, null, 1)}\n`)
}

/** Reads the rows a bench wrote to `file`; none when it wrote no file (it failed before). */
export const readSummary = (file: string): Array<SummaryRow> =>
  existsSync(file) ? JSON.parse(readFileSync(file, "utf8")) as Array<SummaryRow> : []
