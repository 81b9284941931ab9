/**
 * How every bench ends (issue 29 item 6): it prints its section, hands its
 * target rows to the suite (`--summary FILE`), rewrites its section of
 * docs/benchmarks.md only when asked (`--write-docs`, so a run leaves the
 * tracked tree as it was), and with `--check` exits 1 when a target was
 * missed (a missed target is otherwise a figure, not a failure).
 */
import { DOC, DOC_NAME, writeDocSection } from "./report.ts"
import { writeSummary, type SummaryRow } from "./summary.ts"

/** The common flags that decide what a bench's end writes and how it exits (bench/lib/args.ts). */
export interface OutcomeFlags {
  readonly summary?: string | undefined
  readonly "write-docs"?: boolean | undefined
  readonly check?: boolean | undefined
  /** The report to rewrite with `--write-docs`; docs/benchmarks.md when absent. */
  readonly doc?: string | undefined
}

/** What one bench measured: its "## " section and its target rows. */
export interface BenchOutcome {
  readonly heading: string
  readonly body: string
  readonly rows: ReadonlyArray<SummaryRow>
  /** Why the section must not be written even with `--write-docs` (a partial run), if so. */
  readonly partial?: string
}

/** The rows whose target was missed (`met: false`; rows with nothing to meet are never missed). */
export const missedTargets = (rows: ReadonlyArray<SummaryRow>): Array<SummaryRow> => rows.filter((r) => r.met === false)

/** One line per missed target, as every bench prints them: figure, measured, the reference and ratio when there is one, target. */
export const missedLines = (rows: ReadonlyArray<SummaryRow>): Array<string> =>
  missedTargets(rows).map((r) =>
    `target missed: ${r.bench}: ${r.figure}: ${r.measured}` +
    `${r.ratio === null ? "" : ` against ${r.reference} = ${r.ratio.toFixed(2)}×`} (target ${r.target})`
  )

/**
 * The verdict of a run under `flags`: prints the missed targets (always)
 * and returns the exit status — 1 with `--check` when a target was missed,
 * else 0.
 */
export const verdict = (flags: OutcomeFlags, rows: ReadonlyArray<SummaryRow>, out: (line: string) => void): 0 | 1 => {
  const missed = missedLines(rows)
  for (const line of missed) out(line)
  if (flags.check !== true) return 0
  out(missed.length === 0 ? `--check: every target met (${rows.filter((r) => r.met === true).length} rows)` : `--check: ${missed.length} target(s) missed: exit status 1`)
  return missed.length === 0 ? 0 : 1
}

/**
 * Ends a bench: prints `outcome.body`, writes the summary rows when
 * `--summary` names a file, rewrites the section in the report only with
 * `--write-docs` (and never for a partial run) and returns the exit status
 * of {@link verdict}. Writes to stdout through `out` (tests pass their own).
 */
export const finishBench = (
  flags: OutcomeFlags,
  outcome: BenchOutcome,
  out: (line: string) => void = (line) => void process.stdout.write(`${line}\n`)
): 0 | 1 => {
  out(`\n${outcome.body}`)
  writeSummary(flags.summary, outcome.rows)
  const doc = flags.doc ?? DOC
  const name = flags.doc ?? DOC_NAME
  if (flags["write-docs"] !== true) {
    out(`${name} left as it was (--write-docs rewrites its section "${outcome.heading.replace(/^## /, "")}")`)
  } else if (outcome.partial !== undefined) {
    out(`${name} left as it was: ${outcome.partial}`)
  } else {
    writeDocSection(outcome.heading, outcome.body, { doc })
    out(`wrote ${name}`)
  }
  return verdict(flags, outcome.rows, out)
}
