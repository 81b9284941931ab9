/**
 * `npm run bench [-- --full] [-- --only ping,transfer,liveness,replay] [-- --write-docs] [-- --check]`
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
 * each bench handing its target rows back (`--summary FILE`). Then prints one
 * table (figure, measured, reference in the same run, ratio, target, met).
 * With `--write-docs` (passed on to every bench, so each rewrites its own
 * section) it writes the table, with the machine it ran on, at the top of
 * docs/benchmarks.md and into the README's "Performance" section (between
 * its bench-summary markers) — unless `--only` ran a subset, which leaves
 * both tables as they were; without it no tracked file changes.
 *
 * A benchmark, never a test (`.ci/run` does not run it). Exits 1 when a
 * bench failed, and with `--check` when a target was missed (the verdict
 * of bench/lib/outcome.ts over every bench's rows); else 0.
 */
import { mkdtempSync, rmSync } from "node:fs"
import os from "node:os"
import path from "node:path"
import { runNode } from "./lib/children.ts"
import { times } from "./lib/format.ts"
import { machineLine } from "./lib/machine.ts"
import { DOC_NAME, writeDocSection, writeReadmeSummary } from "./lib/report.ts"
import { parseBenchArgs } from "./lib/args.ts"
import { verdict } from "./lib/outcome.ts"
import { readSummary, writeSummary, type SummaryRow } from "./lib/summary.ts"

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

const args = parseBenchArgs({ only: { type: "string" } })
const mode = args.full ? "--full" : "--quick"
/** What the benches are told about the report: they rewrite their sections only when the suite was asked to. */
const docFlags = args["write-docs"] ? ["--write-docs", ...(args.doc === undefined ? [] : ["--doc", args.doc])] : []
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
  const { code } = await runNode([PROGRAMS[bench], mode, "--summary", file, ...docFlags], false)
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
    "detail. Reproduce: `npm run bench -- --write-docs` (quick, a few minutes; `--full` for the long runs, `--check`",
    "to exit 1 on a missed target); each bench also runs alone (`npm run bench:ping`, `bench:transfer`,",
    "`bench:liveness`, `replay`) with the same flags. Without `--write-docs` a run changes no tracked file.",
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
  const docName = args.doc ?? DOC_NAME
  if (!args["write-docs"]) {
    process.stdout.write(`${docName} and the README's Performance table left as they were (--write-docs rewrites them)\n`)
  } else if (args.only === undefined) {
    writeDocSection(SUMMARY_HEADING, summarySection(body, head), { first: true, ...(args.doc === undefined ? {} : { doc: args.doc }) })
    const readme = args.doc === undefined && writeReadmeSummary(head, body)
    process.stdout.write(`wrote the summary of ${docName}${readme ? " and the README's Performance table" : ""}\n`)
  } else {
    process.stdout.write(`--only: the summary of ${docName} and the README's table are left as they were\n`)
  }
  writeSummary(args.summary, rows)
  const targets = verdict(args, rows, (line) => void process.stdout.write(`${line}\n`))
  return failed.length === 0 ? targets : 1
}

process.exitCode = await main()
