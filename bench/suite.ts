/**
 * `npm run bench [-- --full] [-- --only ping,transfer,liveness,replay]`
 *
 * The benchmark suite: runs each bench in its own child process, one after
 * the other (quick mode by default, `--full` for the long one) —
 *
 * - ping      PING req/s and p99 against a bare zeromq.js echo;
 * - transfer  STORE/RETRIEVE GB/s against memcpy, PING p99 under transfers;
 * - liveness  reaper scan, PING during scans, heap per context, SIGKILL → reaped;
 * - replay    `mpcache replay` of the conversation trace, small model,
 *             `--max-rate`: requests/s and where a request's time goes;
 *
 * each bench rewriting its own section of docs/benchmarks.md and handing its
 * target rows back (`--summary FILE`). Then prints one table (figure,
 * measured, reference in the same run, ratio, target, met) and writes it,
 * with the machine it ran on, at the top of docs/benchmarks.md and into the
 * README's "Performance" section (between its bench-summary markers) —
 * unless `--only` ran a subset, which leaves both tables as they were.
 *
 * A benchmark, never a test (`.ci/run` does not run it). Exits 0 when every
 * bench ran (met or not: the table says), 1 when one failed.
 */
import { mkdtempSync, rmSync } from "node:fs"
import os from "node:os"
import path from "node:path"
import { parseArgs } from "node:util"
import { runNode } from "./lib/children.ts"
import { times } from "./lib/format.ts"
import { machineLine } from "./lib/machine.ts"
import { DOC_NAME, writeDocSection, writeReadmeSummary } from "./lib/report.ts"
import { readSummary, type SummaryRow } from "./lib/summary.ts"

const SUMMARY_HEADING = "## Summary (npm run bench)"
/** The benches in the order they run; each one's program (its `npm run bench:<name>`) runs with the mode and `--summary FILE`. */
const BENCHES = ["ping", "transfer", "liveness", "replay"] as const
type Bench = (typeof BENCHES)[number]
const PROGRAMS: Readonly<Record<Bench, string>> = {
  ping: "bench/ping/ping.ts",
  transfer: "bench/transfer/transfer.ts",
  liveness: "bench/liveness/liveness.ts",
  replay: "bench/replay/replay.ts"
}

const { values: args } = parseArgs({
  options: { full: { type: "boolean", default: false }, quick: { type: "boolean", default: false }, only: { type: "string" } }
})
if (args.full && args.quick) {
  process.stderr.write("--quick and --full exclude each other\n")
  process.exit(2)
}
const mode = args.full ? "--full" : "--quick"
const selected: ReadonlyArray<Bench> = args.only === undefined
  ? BENCHES
  : args.only.split(",").map((b) => b.trim()).filter((b): b is Bench => (BENCHES as ReadonlyArray<string>).includes(b))
if (args.only !== undefined && selected.length !== args.only.split(",").length) {
  process.stderr.write(`--only takes a comma-separated subset of ${BENCHES.join(",")} (got ${args.only})\n`)
  process.exit(2)
}

const log = (line: string): void => {
  process.stderr.write(`${line}\n`)
}

/** Runs one bench in its own process; `ok`: it exited 0. Its rows are read back from `dir`. */
const runBench = async (bench: Bench, dir: string): Promise<{ ok: boolean; rows: Array<SummaryRow> }> => {
  const file = path.join(dir, `${bench}.json`)
  const { code } = await runNode([PROGRAMS[bench], mode, "--summary", file], false)
  return { ok: code === 0, rows: readSummary(file) }
}

// ------------------------------------------------------------------ report

const fmtRatio = (r: number | null): string => (r === null || !Number.isFinite(r) ? "—" : times(r))
const fmtMet = (m: boolean | null): string => (m === null ? "—" : m ? "yes" : "**no**")

const table = (rows: ReadonlyArray<SummaryRow>, failed: ReadonlyArray<string>): string =>
  [
    "| figure | measured | reference (same run) | ratio | target | met |",
    "|---|---:|---:|---:|---:|:---:|",
    ...rows.map((r) => `| ${r.figure} | ${r.measured} | ${r.reference} | ${fmtRatio(r.ratio)} | ${r.target} | ${fmtMet(r.met)} |`),
    ...failed.map((b) => `| ${b} | **failed** (see its output) | — | — | — | **no** |`)
  ].join("\n")

const summarySection = (body: string, head: string): string =>
  [
    SUMMARY_HEADING,
    "",
    head,
    "",
    body,
    "",
    "Each figure is measured beside its reference in the same run; the sections below give the method and the",
    "detail. Reproduce: `npm run bench` (quick, a few minutes) or `npm run bench -- --full`; each bench also runs",
    "alone (`npm run bench:ping`, `bench:transfer`, `bench:liveness`, `replay`).",
    ""
  ].join("\n")

// -------------------------------------------------------------------- main

const main = async (): Promise<number> => {
  const t0 = Date.now()
  const loadBefore = os.loadavg()
  const dir = mkdtempSync(path.join(os.tmpdir(), "mpcache-bench-suite-"))
  const rows: Array<SummaryRow> = []
  const failed: Array<string> = []
  try {
    for (const bench of selected) {
      log(`\n=== ${bench} (${mode}) ===`)
      const started = Date.now()
      const result = await runBench(bench, dir)
      rows.push(...result.rows)
      if (!result.ok) failed.push(bench)
      log(`=== ${bench}: ${result.ok ? "done" : "FAILED"} in ${((Date.now() - started) / 1000).toFixed(0)} s ===`)
    }
  } finally {
    rmSync(dir, { recursive: true, force: true })
  }
  const head = machineLine(`npm run bench${args.full ? " -- --full" : ""}`, loadBefore, os.loadavg(), (Date.now() - t0) / 1000)
  const body = table(rows, failed)
  process.stdout.write(`\n${head}\n\n${body}\n`)
  if (args.only === undefined) {
    writeDocSection(SUMMARY_HEADING, summarySection(body, head), { first: true })
    const readme = writeReadmeSummary(head, body)
    process.stdout.write(`wrote the summary of ${DOC_NAME}${readme ? " and the README's Performance table" : ""}\n`)
  } else {
    process.stdout.write(`--only: the summary of ${DOC_NAME} and the README's table are left as they were\n`)
  }
  return failed.length === 0 ? 0 : 1
}

process.exitCode = await main()
