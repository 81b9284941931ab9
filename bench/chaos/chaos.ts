/**
 * `npm run bench:chaos [-- --quick | --full | --cycles N] [-- --summary FILE]`
 *
 * The main job under chaos (issue 18, "Long-run checks"): `mpcache replay
 * --kill-every 1 --pause-every 3` of the Mooncake conversation trace, small
 * model, `--max-rate`, until N kill cycles have run (`--cycles`, default
 * 1,000; `--quick`: 20). Each cycle SIGKILLs a random worker and starts a
 * replacement; every third second a random worker is SIGSTOPped for 3 s.
 *
 * - Server: one `mpcache serve` for the whole run, in a child process
 *   (`--chunk-size 256 --l1-size-gb 1 --worker-disconnect-grace-seconds 2`,
 *   as replay starts its own; bench/lib/heap-probe.ts preloaded for its heap),
 *   so that its log names every instance it reaps.
 * - Replays: `mpcache replay --server …` in rounds against that server
 *   (one trace slice takes only so many cycles), each round sized from the
 *   kills per request of the rounds before, until the cycles are done.
 *   bench/chaos/preload.ts is preloaded into each replay: it logs every
 *   signal the replay sends to a worker and each worker's instance id.
 * - Checks, totalled over the rounds: 0 failed requests, 0 leaked contexts,
 *   0 open mappings after shutdown, 0 data mismatches (every retrieved byte
 *   is checked by the workers); and no live worker reaped: every "reaped
 *   instance" of the server's log names a worker that had been SIGKILLed (or
 *   SIGSTOPped) before the reap. Then the server's status once the last
 *   round ended: no tracked instance, no open mapping, no connected peer.
 *
 * With `--write-docs` rewrites the section "## Chaos replay (bench:chaos)" of
 * docs/benchmarks.md; with `--summary FILE` writes its row. A benchmark, never
 * a test: exits 0 when it ran (met or not, unless `--check`: then 1 when
 * missed), 1 on a failure; always stops the
 * server and the replays and unlinks what they left.
 */
import { readdirSync, readFileSync, rmSync } from "node:fs"
import os from "node:os"
import path from "node:path"
import { parseBenchArgs, usageError } from "../lib/args.ts"
import { startLineChild } from "../lib/children.ts"
import { withDeadline } from "../lib/deadline.ts"
import { int } from "../lib/format.ts"
import { loadText, measuredDate, nodeAndCpu } from "../lib/machine.ts"
import { startProbedServer } from "../lib/probedServer.ts"
import { finishBench } from "../lib/outcome.ts"
import { makeResources, runBench } from "../lib/resources.ts"
import { secondsSince, sleep } from "../lib/time.ts"
import type { ReplaySummary } from "../../src/replay/Driver.ts"

const HEADING = "## Chaos replay (bench:chaos)"

const args = parseBenchArgs({ cycles: { type: "string" } })
const CYCLES = args.cycles !== undefined
  ? (Number.isInteger(Number(args.cycles)) && Number(args.cycles) >= 1 ? Number(args.cycles) : usageError(`--cycles must be a positive integer, got ${args.cycles}`))
  : args.quick ? 20 : 1_000

const KILL_EVERY_S = 1
const PAUSE_EVERY_S = 3
const PAUSE_S = 3
const WORKERS = 2
const CHUNK_TOKENS = 256
const L1_SIZE_GB = 1
const DISCONNECT_GRACE_S = 2
/** Requests in the trace (data/mooncake-traces/conversation_trace.jsonl): a round replays at most these. */
const TRACE_REQUESTS = 12_031
const FIRST_ROUND_REQUESTS = args.quick ? 60 : 400
const MIN_ROUND_REQUESTS = 20
/** Rounds are bounded in count, and each in time (a replay past it is a failure). */
const MAX_ROUNDS = 200
const ROUND_TIMEOUT_MS = 3_600_000
const STOP_TIMEOUT_MS = 15_000
/** Once the last replay ended, how long the server may take to show nothing tracked, mapped or connected. */
const SETTLE_TIMEOUT_MS = (DISCONNECT_GRACE_S + 10) * 1000

const log = (line: string): void => {
  process.stderr.write(`${line}\n`)
}

const resources = makeResources(`mpcache-chaos-${process.pid}-${Date.now().toString(36)}`, { stopTimeoutMs: STOP_TIMEOUT_MS, onSignal: "kill" })
const endpoint = resources.ipcEndpoint()
const chaosLog = path.join(os.tmpdir(), `${resources.tag}-signals.jsonl`)
/** Pids of the replays this run started: their workers' segments are named after them. */
const replayPids = new Set<number>()
resources.onCleanup(() => {
  rmSync(chaosLog, { force: true })
  // A replay stopped by force leaves its workers' segments (mpcache-replay-<its pid>-…); ours are the only ones with these pids.
  try {
    for (const name of readdirSync("/dev/shm")) {
      const pid = /^mpcache-replay-(\d+)-/.exec(name)?.[1]
      if (pid !== undefined && replayPids.has(Number(pid))) rmSync(`/dev/shm/${name}`, { force: true })
    }
  } catch {
    // nothing to clean where /dev/shm cannot be listed
  }
})

/** One line of bench/chaos/preload.ts's log. */
type ChaosEvent =
  | { readonly at: number; readonly event: "signal"; readonly pid: number; readonly signal: string | number }
  | { readonly at: number; readonly event: "ready"; readonly pid: number; readonly instanceId: string }
  | { readonly at: number; readonly event: "exit"; readonly pid: number }

const readChaosLog = (): Array<ChaosEvent> => {
  try {
    return readFileSync(chaosLog, "utf8").split("\n").filter((l) => l !== "").map((l) => JSON.parse(l) as ChaosEvent)
  } catch {
    return []
  }
}

/** A "reaped instance" line of the server's log: the id, the reason and the server's timestamp (ms). */
interface Reap {
  readonly instanceId: string
  readonly reason: string
  readonly at: number
}

/** How each reap is explained by what the replays did to the worker before it. */
interface ReapClasses {
  readonly killed: number
  /** SIGSTOPped (and not SIGKILLed) before the reap. */
  readonly paused: number
  /** A replay worker neither killed nor paused before its reap: must be 0. */
  readonly live: ReadonlyArray<string>
  /** An instance no replay worker registered as. */
  readonly unknown: ReadonlyArray<string>
  /** Workers SIGKILLed while registered whose instance was never reaped (the replays' leaked count covers it too). */
  readonly killedNotReaped: ReadonlyArray<string>
}

const classify = (reaps: ReadonlyArray<Reap>, events: ReadonlyArray<ChaosEvent>): ReapClasses => {
  const pidOf = new Map<string, number>()
  const signals = new Map<number, Array<{ at: number; signal: string }>>()
  for (const e of events) {
    if (e.event === "ready") pidOf.set(e.instanceId, e.pid)
    if (e.event === "signal") {
      const list = signals.get(e.pid) ?? []
      list.push({ at: e.at, signal: String(e.signal) })
      signals.set(e.pid, list)
    }
  }
  let killed = 0
  let paused = 0
  const live: Array<string> = []
  const unknown: Array<string> = []
  for (const r of reaps) {
    const pid = pidOf.get(r.instanceId)
    if (pid === undefined) {
      unknown.push(r.instanceId)
      continue
    }
    const before = (signals.get(pid) ?? []).filter((s) => s.at <= r.at)
    if (before.some((s) => s.signal === "SIGKILL")) killed++
    else if (before.some((s) => s.signal === "SIGSTOP")) paused++
    else live.push(`${r.instanceId} (pid ${pid}, ${r.reason})`)
  }
  const reaped = new Set(reaps.map((r) => r.instanceId))
  const killedNotReaped = [...pidOf].filter(([id, pid]) => !reaped.has(id) && (signals.get(pid) ?? []).some((s) => s.signal === "SIGKILL"))
    .map(([id]) => id)
  return { killed, paused, live, unknown, killedNotReaped }
}

/** What the rounds add up to. */
interface Totals {
  rounds: number
  requests: number
  failed: number
  retried: number
  killed: number
  paused: number
  replaced: number
  leaked: number
  /** The largest open_mappings_after_shutdown of a round (each is the server's whole count then). */
  openMappings: number
  mismatches: number
  seconds: number
  readonly reaped: Record<string, number>
  readonly failures: Array<string>
  readonly exitCodes: Array<number | null>
}

/** Runs one replay round of `requests` against the bench's server; resolves with its JSON summary. */
const replayRound = async (requests: number, httpUrl: string): Promise<{ summary: ReplaySummary; code: number | null }> => {
  const argv = [
    "--import",
    "./bench/chaos/preload.ts",
    "src/cli/main.ts",
    "replay",
    "--server",
    endpoint,
    "--http-url",
    httpUrl,
    "--workers",
    String(WORKERS),
    "--kill-every",
    String(KILL_EVERY_S),
    "--pause-every",
    String(PAUSE_EVERY_S),
    "--pause-seconds",
    String(PAUSE_S),
    "--max-rate",
    "--model",
    "small",
    "--requests",
    String(requests),
    "--json"
  ]
  const child = startLineChild("mpcache replay", argv, resources.children)
  if (child.process.pid !== undefined) replayPids.add(child.process.pid)
  const stdout: Array<string> = []
  child.onLine((line, stream) => {
    if (stream === "stdout") stdout.push(line)
    else if (line.startsWith("[")) log(`    ${line}`) // its progress line, every 5 s
  })
  const { code } = await withDeadline(child.exited, ROUND_TIMEOUT_MS, "a replay round")
  const text = stdout.join("\n")
  const start = text.indexOf("{")
  if (start === -1) throw new Error(`the replay exited ${code} without its JSON summary; output:\n${child.tail()}`)
  return { summary: JSON.parse(text.slice(start)) as ReplaySummary, code }
}

// ------------------------------------------------------------------ report

interface Report {
  readonly totals: Totals
  readonly classes: ReapClasses
  readonly reaps: number
  readonly after: { readonly tracked: number; readonly openMappings: number; readonly peers: number; readonly pendingJobs: number; readonly heldLocks: number; readonly seconds: number }
  readonly heapMiB: { readonly start: number; readonly end: number }
  readonly rssMiB: { readonly start: number; readonly end: number }
  readonly warnings: number
  readonly seconds: number
  readonly loadBefore: ReadonlyArray<number>
  readonly loadAfter: ReadonlyArray<number>
}

const clean = (r: Report): boolean =>
  r.totals.failed === 0 && r.totals.leaked === 0 && r.totals.openMappings === 0 && r.totals.mismatches === 0 &&
  r.classes.live.length === 0 && r.classes.unknown.length === 0 && r.after.tracked === 0 && r.after.openMappings === 0 &&
  r.totals.exitCodes.every((c) => c === 0)

const section = (r: Report): string => {
  const t = r.totals
  const zero = (n: number) => (n === 0 ? "0" : `**${int(n)}**`)
  return [
    HEADING,
    "",
    `Measured ${measuredDate()} · ${nodeAndCpu()} · ${args.quick ? "`--quick`" : `\`--cycles ${CYCLES}\``} · ${r.seconds.toFixed(0)} s · ` +
    `load average ${loadText(r.loadBefore)} before, ${loadText(r.loadAfter)} after.`,
    "",
    `Method: one \`mpcache serve --chunk-size ${CHUNK_TOKENS} --l1-size-gb ${L1_SIZE_GB} --worker-disconnect-grace-seconds ${DISCONNECT_GRACE_S}\``,
    `for the whole run; \`mpcache replay --server … --workers ${WORKERS} --kill-every ${KILL_EVERY_S} --pause-every ${PAUSE_EVERY_S} --pause-seconds ${PAUSE_S}`,
    "--max-rate --model small` of the Mooncake conversation trace in rounds against it until the kill cycles are done",
    "(each round sized from the kills per request so far), with `bench/chaos/preload.ts` logging every signal the",
    "replay sends and each worker's instance id, so that every reap in the server's log is matched to what had",
    "happened to that worker before it.",
    "",
    "| figure | value |",
    "|---|---:|",
    `| kill cycles (SIGKILL + replacement) | ${int(t.killed)} |`,
    `| pauses (SIGSTOP ${PAUSE_S} s) | ${int(t.paused)} |`,
    `| replacements started | ${int(t.replaced)} |`,
    `| rounds · requests · retried on another worker | ${t.rounds} · ${int(t.requests)} · ${int(t.retried)} |`,
    `| failed requests | ${zero(t.failed)} |`,
    `| leaked contexts | ${zero(t.leaked)} |`,
    `| open mappings after shutdown | ${zero(t.openMappings)} |`,
    `| data mismatches | ${zero(t.mismatches)} |`,
    `| reaps (${Object.entries(t.reaped).map(([k, v]) => `${k} ${v}`).join(", ")}) | ${int(r.reaps)} |`,
    `| … of a killed worker · of a paused one | ${int(r.classes.killed)} · ${int(r.classes.paused)} |`,
    `| … of a live worker · of an unknown instance | ${zero(r.classes.live.length)} · ${zero(r.classes.unknown.length)} |`,
    `| killed workers never reaped | ${zero(r.classes.killedNotReaped.length)} |`,
    `| server after the last round: tracked · open mappings · peers · pending jobs · held locks | ` +
    `${zero(r.after.tracked)} · ${zero(r.after.openMappings)} · ${zero(r.after.peers)} · ${zero(r.after.pendingJobs)} · ${zero(r.after.heldLocks)} |`,
    `| server heap after GC, start → end (MiB) · RSS | ${r.heapMiB.start.toFixed(1)} → ${r.heapMiB.end.toFixed(1)} · ${r.rssMiB.start.toFixed(0)} → ${r.rssMiB.end.toFixed(0)} |`,
    "",
    (r.classes.live.length > 0 ? `Live workers reaped: ${r.classes.live.slice(0, 10).join(", ")}. ` : "") +
    (t.failures.length > 0 ? `First failures: ${t.failures.slice(0, 5).join("; ")}. ` : "") +
    `Replay exit codes: ${t.exitCodes.join(", ")}. Server WARN/ERROR lines: ${int(r.warnings)} (each reap is one). ` +
    `${clean(r) ? "**Clean.**" : "**Not clean.**"}`,
    "",
    "Reproduce: `npm run bench:chaos` (1,000 cycles; `-- --quick` for 20, `-- --cycles N`).",
    ""
  ].join("\n")
}

// -------------------------------------------------------------------- main

const main = async (): Promise<void> => {
  const t0 = process.hrtime.bigint()
  const loadBefore = os.loadavg()
  process.env["MPCACHE_CHAOS_LOG"] = chaosLog // inherited by the replays (their workers load no preload)
  const s = await startProbedServer(endpoint, [
    "--chunk-size",
    String(CHUNK_TOKENS),
    "--l1-size-gb",
    String(L1_SIZE_GB),
    "--worker-disconnect-grace-seconds",
    String(DISCONNECT_GRACE_S)
  ], resources.children)
  const reaps: Array<Reap> = []
  s.child.onLine((line, _stream, at) => {
    const m = line.match(/reaped instance (\d+): .*\(reason (\w+)\)/)
    if (m === null) return
    const ts = /"timestamp":"([^"]+)"/.exec(line)?.[1]
    reaps.push({ instanceId: m[1]!, reason: m[2]!, at: ts === undefined ? at : Date.parse(ts) })
  })
  const heap0 = await s.heap()
  log(`server up (${endpoint}, ${s.httpUrl}, pid ${s.pid}); ${CYCLES} kill cycles`)

  const totals: Totals = {
    rounds: 0, requests: 0, failed: 0, retried: 0, killed: 0, paused: 0, replaced: 0, leaked: 0, openMappings: 0, mismatches: 0, seconds: 0,
    reaped: {}, failures: [], exitCodes: []
  }
  let requests = FIRST_ROUND_REQUESTS
  while (totals.killed < CYCLES && totals.rounds < MAX_ROUNDS) {
    const r0 = process.hrtime.bigint()
    log(`round ${totals.rounds + 1}: ${requests} requests (${totals.killed} of ${CYCLES} cycles so far)`)
    const { summary: r, code } = await Promise.race([replayRound(requests, s.httpUrl), s.exited])
    totals.rounds++
    totals.requests += r.requests
    totals.failed += r.failed_requests
    totals.retried += r.retried_requests
    totals.killed += r.churn.killed
    totals.paused += r.churn.paused
    totals.replaced += r.churn.replaced
    totals.leaked += r.leaked_contexts
    totals.openMappings = Math.max(totals.openMappings, r.open_mappings_after_shutdown)
    totals.mismatches += r.data_mismatches
    totals.seconds += r.duration_seconds
    totals.exitCodes.push(code)
    for (const [k, v] of Object.entries(r.reaped)) totals.reaped[k] = (totals.reaped[k] ?? 0) + v
    for (const f of r.failures) if (totals.failures.length < 20) totals.failures.push(`request ${f.request}: ${f.message}`)
    log(
      `  ${r.requests} requests in ${r.duration_seconds} s (${secondsSince(r0).toFixed(0)} s with start and checks): killed ${r.churn.killed}, ` +
        `paused ${r.churn.paused}, failed ${r.failed_requests}, leaked ${r.leaked_contexts}, open ${r.open_mappings_after_shutdown}, ` +
        `mismatches ${r.data_mismatches}, exit ${code}`
    )
    // The next round: enough requests for the cycles left at this round's kills per request, within the trace.
    const perRequest = r.churn.killed / Math.max(1, r.requests)
    const left = CYCLES - totals.killed
    requests = perRequest > 0
      ? Math.min(TRACE_REQUESTS, Math.max(MIN_ROUND_REQUESTS, Math.ceil((left / perRequest) * 1.1)))
      : Math.min(TRACE_REQUESTS, requests * 4)
  }

  // Killed workers of the last round are reaped within the grace; then nothing may be tracked, mapped or connected.
  const settleT0 = process.hrtime.bigint()
  let status = await s.status()
  while (
    (status.worker_liveness.tracked_instances > 0 || status.native.open_mappings > 0 || status.connected_peers > 0) &&
    secondsSince(settleT0) * 1000 < SETTLE_TIMEOUT_MS
  ) {
    await sleep(250)
    status = await s.status()
  }
  const after = {
    tracked: status.worker_liveness.tracked_instances,
    openMappings: status.native.open_mappings,
    peers: status.connected_peers,
    pendingJobs: status.lookup.pending_jobs,
    heldLocks: status.lookup.held_locks,
    seconds: secondsSince(settleT0)
  }
  const heap1 = await s.heap()
  const classes = classify(reaps, readChaosLog())
  const report: Report = {
    totals,
    classes,
    reaps: reaps.length,
    after,
    heapMiB: { start: heap0.heapUsed / 2 ** 20, end: heap1.heapUsed / 2 ** 20 },
    rssMiB: { start: heap0.rss / 2 ** 20, end: heap1.rss / 2 ** 20 },
    warnings: s.warnings.count,
    seconds: secondsSince(t0),
    loadBefore,
    loadAfter: os.loadavg()
  }
  await resources.cleanup()
  const t = totals
  process.exitCode = finishBench(args, { heading: HEADING, body: section(report), rows: [{
    bench: "chaos",
    figure: `replay --kill-every ${KILL_EVERY_S} --pause-every ${PAUSE_EVERY_S}: ${int(t.killed)} kill / ${int(t.paused)} pause cycles, ${int(t.requests)} requests`,
    measured: `failed ${t.failed}, leaked ${t.leaked}, open ${t.openMappings}, mismatches ${t.mismatches}, live reaped ${classes.live.length}`,
    reference: `${int(report.reaps)} reaps: ${classes.killed} killed, ${classes.paused} paused, ${classes.unknown.length} unknown`,
    ratio: null,
    target: "all 0; every reap a killed or paused worker",
    met: clean(report)
  }] })
}

await runBench("bench:chaos", main, resources)
