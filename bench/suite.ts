/**
 * `npm run bench [-- --full] [-- --only ping,transfer,liveness,replay]`
 *
 * The benchmark suite: runs each bench in its own child process, one after
 * the other (quick mode by default, `--full` for the long one) —
 *
 * - bench/ping.ts      PING req/s and p99 against a bare zeromq.js echo;
 * - bench/transfer.ts  STORE/RETRIEVE GB/s against memcpy, PING p99 under transfers;
 * - bench/liveness.ts  reaper scan, PING during scans, heap per context, SIGKILL → reaped;
 * - replay             `mpcache replay` of the conversation trace, small model,
 *                      `--max-rate`: requests/s and where a request's time goes;
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
import { spawn } from "node:child_process"
import { mkdtempSync, readFileSync, rmSync, writeFileSync, existsSync } from "node:fs"
import os from "node:os"
import path from "node:path"
import { parseArgs } from "node:util"
import { DOC, writeDocSection } from "./docs.ts"
import type { SummaryRow } from "./summary.ts"

const ROOT = path.resolve(import.meta.dirname, "..")
const README = path.join(ROOT, "README.md")
const SUMMARY_HEADING = "## Summary (npm run bench)"
const REPLAY_HEADING = "## Replay (mpcache replay)"
const README_BEGIN = "<!-- bench-summary:begin (written by npm run bench) -->"
const README_END = "<!-- bench-summary:end -->"
const BENCHES = ["ping", "transfer", "liveness", "replay"] as const
type Bench = (typeof BENCHES)[number]

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
/** Trace requests replayed: quick / full. */
const REPLAY_REQUESTS = args.full ? 1_000 : 300

const log = (line: string): void => {
  process.stderr.write(`${line}\n`)
}

/** Runs `node argv` with its output passed through (stdout captured too when `capture`); resolves its exit code and stdout. */
const runNode = (argv: ReadonlyArray<string>, capture: boolean): Promise<{ code: number; stdout: string }> =>
  new Promise((resolve) => {
    const child = spawn(process.execPath, argv, { cwd: ROOT, stdio: ["ignore", capture ? "pipe" : "inherit", "inherit"] })
    let stdout = ""
    child.stdout?.on("data", (chunk: Buffer) => {
      stdout += chunk.toString()
    })
    child.once("error", (error) => {
      log(`cannot start node ${argv.join(" ")}: ${error.message}`)
      resolve({ code: 1, stdout })
    })
    child.once("exit", (code, signal) => resolve({ code: code ?? (signal === null ? 1 : 128), stdout }))
  })

// ------------------------------------------------------------------ replay

interface Stage {
  readonly p50: number
  readonly p99: number
  readonly mean: number
}
/** The fields of `mpcache replay --json` this suite reads. */
interface ReplayJson {
  readonly requests: number
  readonly failed_requests: number
  readonly duration_seconds: number
  readonly requests_per_second: number
  readonly workers: number
  readonly model: string
  readonly chunk_size: number
  readonly hit_ratio: number
  readonly perfect_lru_hit_ratio: number
  readonly gb_stored: number
  readonly gb_retrieved: number
  readonly leaked_contexts: number
  readonly open_mappings_after_shutdown: number
  readonly data_mismatches: number
  readonly latency_ms: Record<"lookup" | "retrieve" | "compute" | "store" | "request", Stage>
}

const replaySection = (r: ReplayJson, argv: ReadonlyArray<string>): string => {
  const l = r.latency_ms
  const share = (ms: number) => `${((100 * ms) / Math.max(l.request.mean, 1e-9)).toFixed(0)} %`
  const row = (name: string, s: Stage) => `| ${name} | ${s.mean.toFixed(1)} | ${share(s.mean)} | ${s.p50.toFixed(1)} | ${s.p99.toFixed(1)} |`
  return [
    REPLAY_HEADING,
    "",
    `Measured ${new Date().toISOString().slice(0, 10)} · \`mpcache ${argv.slice(1).join(" ")}\``,
    "",
    `${r.requests} requests of the Mooncake conversation trace (${r.failed_requests} failed) replayed as fast as they complete by ` +
    `${r.workers} worker processes against a real server, ${r.model} model, ${r.chunk_size}-token chunks: ` +
    `**${r.requests_per_second.toFixed(1)} requests/s** (${r.duration_seconds.toFixed(1)} s). Hit ratio ${(100 * r.hit_ratio).toFixed(2)} % ` +
    `(a perfect LRU of the same capacity: ${(100 * r.perfect_lru_hit_ratio).toFixed(2)} %); ${r.gb_stored} GB stored, ${r.gb_retrieved} GB retrieved; ` +
    `leaked contexts ${r.leaked_contexts}, open mappings after shutdown ${r.open_mappings_after_shutdown}, data mismatches ${r.data_mismatches}.`,
    "",
    "Where a request's time goes (ms; share = stage mean ÷ request mean; *compute* is the replay worker's stand-in",
    "for the engine's forward pass over the tokens it had to compute, so the rest is mpcache's):",
    "",
    "| stage | mean | share | p50 | p99 |",
    "|---|---:|---:|---:|---:|",
    row("LOOKUP (scheduler adapter)", l.lookup),
    row("RETRIEVE", l.retrieve),
    row("compute", l.compute),
    row("STORE", l.store),
    row("request", l.request),
    "",
    "Reproduce: `npm run replay` (300 requests) or the command above.",
    ""
  ].join("\n")
}

const runReplay = async (): Promise<{ ok: boolean; rows: Array<SummaryRow> }> => {
  const argv = ["src/cli/main.ts", "replay", "--requests", String(REPLAY_REQUESTS), "--max-rate", "--model", "small", "--json"]
  const { code, stdout } = await runNode(argv, true)
  let r: ReplayJson
  try {
    r = JSON.parse(stdout) as ReplayJson
  } catch {
    log(`replay exited ${code} without a JSON summary; stdout:\n${stdout.slice(-2000)}`)
    return { ok: false, rows: [] }
  }
  writeDocSection(REPLAY_HEADING, replaySection(r, argv))
  const clean = r.leaked_contexts === 0 && r.open_mappings_after_shutdown === 0 && r.data_mismatches === 0 && r.failed_requests === 0
  const l = r.latency_ms
  return {
    ok: code === 0,
    rows: [{
      bench: "replay",
      figure: `replay, conversation trace, small model, --max-rate (${r.requests} requests)`,
      measured: `${r.requests_per_second.toFixed(1)} req/s`,
      reference: `mean ms: lookup ${l.lookup.mean.toFixed(1)}, retrieve ${l.retrieve.mean.toFixed(1)}, compute ${l.compute.mean.toFixed(1)}, ` +
        `store ${l.store.mean.toFixed(1)} of ${l.request.mean.toFixed(1)}`,
      ratio: null,
      target: "report; 0 failed, leaked, open, mismatched",
      met: clean
    }]
  }
}

// ------------------------------------------------------------------ benches

const runBench = async (bench: Exclude<Bench, "replay">, dir: string): Promise<{ ok: boolean; rows: Array<SummaryRow> }> => {
  const file = path.join(dir, `${bench}.json`)
  const { code } = await runNode([`bench/${bench}.ts`, mode, "--summary", file], false)
  const rows = existsSync(file) ? JSON.parse(readFileSync(file, "utf8")) as Array<SummaryRow> : []
  return { ok: code === 0, rows }
}

// ------------------------------------------------------------------ report

const machine = (loadBefore: ReadonlyArray<number>, loadAfter: ReadonlyArray<number>, seconds: number): string => {
  const cpus = os.cpus()
  const cpuinfo = existsSync("/proc/cpuinfo") ? readFileSync("/proc/cpuinfo", "utf8") : ""
  const virtual = /^flags\s*:.*\bhypervisor\b/m.test(cpuinfo) ? ", virtual machine" : ""
  const load = (l: ReadonlyArray<number>) => l.map((x) => x.toFixed(2)).join(" / ")
  return `Measured ${new Date().toISOString().slice(0, 16).replace("T", " ")} UTC · \`npm run bench${args.full ? " -- --full" : ""}\` · ` +
    `${Math.round(seconds)} s · ${cpus[0]?.model.trim() ?? "unknown CPU"} × ${cpus.length} cores${virtual} · ` +
    `${(os.totalmem() / 2 ** 30).toFixed(0)} GiB · Linux ${os.release()} · Node ${process.version} · ` +
    `load average (1/5/15 min) ${load(loadBefore)} before, ${load(loadAfter)} after.`
}

const fmtRatio = (r: number | null): string => (r === null || !Number.isFinite(r) ? "—" : `${r.toFixed(2)}×`)
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

/** Replaces the README's summary table between its markers (left alone when the markers are missing). */
const writeReadme = (head: string, body: string): boolean => {
  const text = readFileSync(README, "utf8")
  const begin = text.indexOf(README_BEGIN)
  const end = text.indexOf(README_END)
  if (begin === -1 || end < begin) return false
  writeFileSync(README, `${text.slice(0, begin + README_BEGIN.length)}\n${head}\n\n${body}\n${text.slice(end)}`)
  return true
}

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
      const result = bench === "replay" ? await runReplay() : await runBench(bench, dir)
      rows.push(...result.rows)
      if (!result.ok) failed.push(bench)
      log(`=== ${bench}: ${result.ok ? "done" : "FAILED"} in ${((Date.now() - started) / 1000).toFixed(0)} s ===`)
    }
  } finally {
    rmSync(dir, { recursive: true, force: true })
  }
  const head = machine(loadBefore, os.loadavg(), (Date.now() - t0) / 1000)
  const body = table(rows, failed)
  process.stdout.write(`\n${head}\n\n${body}\n`)
  if (args.only === undefined) {
    writeDocSection(SUMMARY_HEADING, summarySection(body, head), { first: true })
    const readme = writeReadme(head, body)
    process.stdout.write(`wrote the summary of ${path.relative(ROOT, DOC)}${readme ? " and the README's Performance table" : ""}\n`)
  } else {
    process.stdout.write(`--only: the summary of ${path.relative(ROOT, DOC)} and the README's table are left as they were\n`)
  }
  return failed.length === 0 ? 0 : 1
}

process.exitCode = await main()
