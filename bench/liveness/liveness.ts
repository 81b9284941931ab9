/**
 * `npm run bench:liveness [-- --quick | --full] [-- --parts 1,2,3,4] [-- --summary FILE]`
 * (`--quick` is the default; `--summary FILE` also writes the target rows as
 * JSON for bench/suite.ts)
 *
 * Worker liveness (DESIGN §5) under load, each figure beside a reference
 * measured in the same run where one exists. This file runs the parts and
 * writes the report; each part is a module beside it in bench/liveness/,
 * with the child programs it runs (*-child.ts) and their fixture (fixture.ts):
 *
 * 1. Reaper scan time with 1k, 10k and 100k tracked contexts
 *    (scanTime.ts; the work in scan-child.ts, its own
 *    process): `InstanceRegistry.popStale` popping nothing and popping 1 %,
 *    the whole `Reaper.scan` over a LivenessTarget around that
 *    registry, and the reference — one pass of the same `judge` over the
 *    same records in a plain Map. Median of several timed runs,
 *    interleaved. Target: popStale under 50 ms at 100k.
 * 2. PING p99 while the management module scans 100k contexts back to back
 *    against PING p99 idle, same server, same run (pingUnderScans.ts):
 *    an in-process MQ server (server-child.ts, its own process)
 *    and, here, a raw zeromq DEALER with one PING [id] in flight. Target:
 *    p99 during scans ≤ 3 × idle.
 * 3. Heap per tracked context (heapPerContext.ts; heap-child.ts
 *    under --expose-gc, one process per case): heapUsed growth / N for
 *    N = 100k registry entries, beside the same records in a plain Map, and
 *    for entries carrying a ContextEntry-shaped resource without mappings.
 *    Target: ≤ 2 KB per registry entry.
 * 4. SIGKILL → reaped with `--worker-disconnect-grace-seconds 1`
 *    (killToReap.ts): `mpcache serve` in a child process; worker
 *    processes (test/support/worker-daemon.ts, heartbeat 1 s) started in
 *    batches, each SIGKILLed at its own moment once its first store
 *    succeeded; the latency is the server's timestamp of its "reaped
 *    instance <id>" WARNING minus the kill time (same wall clock). Target:
 *    p99 ≤ grace + 0.25 s.
 *
 * Prints the tables; with `--write-docs` rewrites the section "## Liveness
 * (bench:liveness)" of docs/benchmarks.md. A benchmark, never a test: exits 0
 * when it measured (whether or not a target was met, unless `--check`: then 1
 * when one was missed), 1 when it could not, and always stops
 * its child processes, removes its ipc socket files and unlinks the shared
 * memory of the workers it killed.
 */
import os from "node:os"
import type { ScanRow } from "./scan-child.ts"
import { parseBenchArgs, usageError } from "../lib/args.ts"
import { loadText, measuredDate, nodeAndCpu } from "../lib/machine.ts"
import { finishBench } from "../lib/outcome.ts"
import { makeResources, runBench } from "../lib/resources.ts"
import { heapSection, heapTargets, measureHeap, type HeapRow } from "./heapPerContext.ts"
import { killSection, killTargets, measureKills, type KillResult } from "./killToReap.ts"
import { measurePing, pingSection, pingTargets, type PingResult } from "./pingUnderScans.ts"
import { summaryRow, targetTable, type TargetRow } from "./report.ts"
import { measureScans, scanSection, scanTargets } from "./scanTime.ts"

const HEADING = "## Liveness (bench:liveness)"
const STOP_TIMEOUT_MS = 5_000

// ---------------------------------------------------------------- arguments

const args = parseBenchArgs({ parts: { type: "string", default: "1,2,3,4" } })
const full = args.full
/** Which parts to run; `--write-docs` writes docs/benchmarks.md only when all four ran. */
const parts = new Set(args.parts.split(",").map((p) => p.trim()))
if ([...parts].some((p) => !["1", "2", "3", "4"].includes(p))) {
  usageError(`--parts takes a comma-separated subset of 1,2,3,4 (got ${args.parts})`)
}

const PLAN = full
  ? { scanRepeats: 31, ping: { rounds: 3, phaseS: 5 }, kill: { kills: 50, batch: 5 } }
  : { scanRepeats: 11, ping: { rounds: 1, phaseS: 2 }, kill: { kills: 10, batch: 5 } }

const resources = makeResources(`mpcache-bench-live-${process.pid}-${Date.now()}`, { stopTimeoutMs: STOP_TIMEOUT_MS, onSignal: "stop" })

// ------------------------------------------------------------------ report

interface Report {
  readonly scans: ReadonlyArray<ScanRow> | undefined
  readonly ping: PingResult | undefined
  readonly heap: ReadonlyArray<HeapRow> | undefined
  readonly kills: KillResult | undefined
  readonly loadBefore: ReadonlyArray<number>
  readonly loadAfter: ReadonlyArray<number>
  readonly elapsedS: number
}

/** Every target of the parts that ran, in part order. */
const targets = (r: Report): ReadonlyArray<TargetRow> => [
  ...(r.scans === undefined ? [] : scanTargets(r.scans)),
  ...(r.ping === undefined ? [] : pingTargets(r.ping)),
  ...(r.heap === undefined ? [] : heapTargets(r.heap)),
  ...(r.kills === undefined ? [] : killTargets(r.kills))
]

const section = (r: Report): string =>
  [
    HEADING,
    "",
    `Measured ${measuredDate()} · ${nodeAndCpu()} · ${full ? "--full" : "--quick"} · ` +
    `${r.elapsedS.toFixed(0)} s · load average (1/5/15 min) ${loadText(r.loadBefore)} before, ${loadText(r.loadAfter)} after.`,
    "",
    targetTable(targets(r)),
    "",
    ...(r.scans === undefined ? [] : scanSection(r.scans, PLAN.scanRepeats)),
    ...(r.ping === undefined ? [] : pingSection(r.ping, PLAN.ping)),
    ...(r.heap === undefined ? [] : heapSection(r.heap)),
    ...(r.kills === undefined ? [] : killSection(r.kills, PLAN.kill)),
    "Reproduce: `npm run bench:liveness` (`-- --full` for 31 scan rounds, 3 × 5 s PING rounds and 50 kills;",
    "`-- --parts 1,4` runs only some parts and then leaves this file alone).",
    ""
  ].join("\n")

// -------------------------------------------------------------------- main

const main = async (): Promise<void> => {
  const t0 = Date.now()
  const loadBefore = os.loadavg()
  const scans = parts.has("1") ? await measureScans(resources, PLAN.scanRepeats) : undefined
  const ping = parts.has("2") ? await measurePing(resources, PLAN.ping) : undefined
  const heap = parts.has("3") ? await measureHeap(resources) : undefined
  const kills = parts.has("4") ? await measureKills(resources, PLAN.kill) : undefined
  const report: Report = { scans, ping, heap, kills, loadBefore, loadAfter: os.loadavg(), elapsedS: (Date.now() - t0) / 1000 }
  process.exitCode = finishBench(args, {
    heading: HEADING,
    body: section(report),
    rows: targets(report).map(summaryRow),
    ...(parts.size === 4 ? {} : { partial: `only part(s) ${[...parts].sort().join(", ")} ran` })
  })
}

await runBench("bench:liveness", main, resources)
