/**
 * bench:liveness part 2, PING latency while the management module scans
 * 100k contexts, against PING idle, same server, same run: an in-process MQ
 * server (bench/liveness/server-child.ts, its own process, driven on stdin) and,
 * in the bench process, a raw zeromq DEALER sending PING [id of a tracked
 * context] (bench/lib/pingClient.ts `phasedPingLoop`), closed loop and open
 * loop. Round trips in µs, scan durations in ms (measured in the server).
 * Target: p99 during back-to-back scans ≤ 3 × idle (closed loop).
 */
import { makeInstanceId } from "../../src/schema/InstanceId.ts"
import { isRunning, startLineChild, stopChild } from "../lib/children.ts"
import { int, times } from "../lib/format.ts"
import { phasedPingLoop, type ClientMode, type PhasedRun } from "../lib/pingClient.ts"
import type { Resources } from "../lib/resources.ts"
import { ascending, percentile, summarizeUs } from "../lib/stats.ts"
import { sleep } from "../lib/time.ts"
import { ms, type TargetRow } from "./report.ts"

const PING_TRACKED = 100_000
const PING_IDLE_WARMUP_S = 0.5
const PING_SCAN_WARMUP_S = 1
/** Open-loop PING rate: one every 5 ms (200/s). */
const PING_INTERVAL_MS = 5
/** A PING without a reply this long fails the run. */
const REPLY_TIMEOUT_MS = 30_000
const SEND_TIMEOUT_MS = 10_000
/** The reaper's period with a 1 s disconnect grace (grace / 2); the default flags give 5 s. */
const PERIODIC_SCAN_MS = 500
const SERVER_READY_TIMEOUT_MS = 120_000
const STOP_TIMEOUT_MS = 5_000
const TARGET_RATIO = 3

/** How many rounds of the windows, and the seconds measured in each window. */
export interface PingPlan {
  readonly rounds: number
  readonly phaseS: number
}

interface PingPhase {
  readonly pings: number
  readonly p50Us: number
  readonly p99Us: number
  readonly maxUs: number
  /** Replies received per second during the measured window. */
  readonly answeredPerS: number
}
interface ScanStats {
  readonly scans: number
  readonly scanP50Ms: number
  readonly scanP99Ms: number
}
type Load = "idle" | "back-to-back" | "periodic"
interface PingRow {
  readonly mode: ClientMode
  readonly load: Load
  readonly phase: PingPhase
  readonly scans: ScanStats | undefined
}
/** One row per window of PING_WINDOWS, pooled over the rounds. */
export type PingResult = ReadonlyArray<PingRow>

/** The windows: per client mode, idle and then under scans. The target compares the first two. */
const PING_WINDOWS: ReadonlyArray<readonly [ClientMode, Load]> = [
  ["closed", "idle"],
  ["closed", "back-to-back"],
  ["open", "idle"],
  ["open", "periodic"],
  ["open", "back-to-back"]
]

/** Runs `plan.rounds` rounds of every window against one in-process server holding PING_TRACKED contexts. */
export const measurePing = async (resources: Resources, plan: PingPlan): Promise<PingResult> => {
  process.stderr.write(
    `[2/4] PING under scans over ${PING_TRACKED.toLocaleString("en-US")} contexts vs idle: ` +
      `${plan.rounds} round(s) of ${PING_WINDOWS.length} windows of ${plan.phaseS} s\n`
  )
  const endpoint = resources.ipcEndpoint("scan-server")
  const server = startLineChild(
    "in-process server",
    ["bench/liveness/server-child.ts", "--endpoint", endpoint, "--n", String(PING_TRACKED)],
    resources.children,
    { stdin: true }
  )
  try {
    const ready = JSON.parse((await server.waitFor(/^\{"ready":true.*\}$/, SERVER_READY_TIMEOUT_MS, "stdout"))[0]) as { pingId: string }
    const pingId = makeInstanceId(BigInt(ready.pingId))
    const scanReports: Array<{ scans: number; scanMs: Array<number> }> = []
    server.onLine((line, stream) => {
      if (stream === "stdout" && line.startsWith("{\"scans\"")) scanReports.push(JSON.parse(line) as { scans: number; scanMs: Array<number> })
    })
    const samples = new Map<string, { latencies: Array<number>; answered: number; seconds: number; scanMs: Array<number> }>()

    /** One window: scans per `load`, a fresh client, warm-up, plan.phaseS measured, then every reply. */
    const window = async (mode: ClientMode, load: Load): Promise<void> => {
      const key = `${mode}/${load}`
      const acc = samples.get(key) ?? { latencies: [], answered: 0, seconds: 0, scanMs: [] }
      samples.set(key, acc)
      const reported = scanReports.length
      if (load !== "idle") server.process.stdin!.write(load === "periodic" ? `scan every ${PERIODIC_SCAN_MS}\n` : "scan on\n")
      const run: PhasedRun = { into: undefined, counting: false, answered: 0, stopped: false }
      const client = phasedPingLoop(endpoint, pingId, run, mode, {
        intervalMs: PING_INTERVAL_MS,
        sendTimeoutMs: SEND_TIMEOUT_MS,
        replyTimeoutMs: REPLY_TIMEOUT_MS
      })
      const failed = client.then(() => new Promise<never>(() => {}))
      try {
        await Promise.race([sleep((load === "idle" ? PING_IDLE_WARMUP_S : PING_SCAN_WARMUP_S) * 1000), failed])
        run.into = acc.latencies
        run.counting = true
        const t0 = performance.now()
        await Promise.race([sleep(plan.phaseS * 1000), failed])
        acc.seconds += (performance.now() - t0) / 1000
        run.counting = false
        run.into = undefined
        acc.answered += run.answered
      } catch (error) {
        const state = isRunning(server.process) ? "running" : "exited"
        throw new Error(`PING client, ${key} (server ${state}): ${error instanceof Error ? error.message : String(error)}\n${server.tail()}`, {
          cause: error
        })
      } finally {
        run.stopped = true
        if (load !== "idle") server.process.stdin!.write("scan off\n")
      }
      await client // every reply outstanding has arrived
      if (load !== "idle") {
        while (scanReports.length === reported) await sleep(20)
        // One by one: scans that find nothing due take microseconds, so a window holds far more of them
        // than a spread's argument list may.
        for (const ms of scanReports[reported]!.scanMs) acc.scanMs.push(ms)
      }
    }

    for (let round = 0; round < plan.rounds; round++) {
      for (const [mode, load] of PING_WINDOWS) await window(mode, load)
      process.stderr.write(`  round ${round + 1} done\n`)
    }
    server.process.stdin!.write("quit\n")
    return PING_WINDOWS.map(([mode, load]): PingRow => {
      const acc = samples.get(`${mode}/${load}`)!
      const { samples: pings, p50Us, p99Us, maxUs } = summarizeUs(acc.latencies)
      const scans = ascending(acc.scanMs)
      return {
        mode,
        load,
        phase: { pings, p50Us, p99Us, maxUs, answeredPerS: acc.answered / acc.seconds },
        scans: load === "idle" ? undefined : { scans: scans.length, scanP50Ms: percentile(scans, 50), scanP99Ms: percentile(scans, 99) }
      }
    })
  } finally {
    await stopChild(server.process, STOP_TIMEOUT_MS)
  }
}

/** The target: closed-loop PING p99 during back-to-back scans against idle. */
export const pingTargets = (rows: PingResult): ReadonlyArray<TargetRow> => {
  const of = (mode: ClientMode, load: Load) => rows.find((p) => p.mode === mode && p.load === load)!.phase
  const idle = of("closed", "idle")
  const busy = of("closed", "back-to-back")
  return [{
    check: "PING p99 during back-to-back scans over 100k (one PING in flight)",
    measured: `${int(busy.p99Us)} µs`,
    reference: `idle ${int(idle.p99Us)} µs`,
    ratio: times(busy.p99Us / idle.p99Us),
    target: `≤ ${TARGET_RATIO} × idle`,
    ok: busy.p99Us <= TARGET_RATIO * idle.p99Us
  }]
}

const pingTable = (rows: PingResult): string => {
  const label: Record<Load, string> = {
    "idle": "idle",
    "back-to-back": "scans back to back",
    "periodic": `one scan every ${PERIODIC_SCAN_MS} ms`
  }
  const lines = [
    "| client | server | PINGs measured | answered /s | p50 µs | p99 µs | max µs | p99 / idle p99 | scans × median (p99) duration |",
    "|---|---|---:|---:|---:|---:|---:|---:|---:|"
  ]
  for (const { mode, load, phase: x, scans } of rows) {
    const idle = rows.find((r) => r.mode === mode && r.load === "idle")!.phase
    const client = mode === "closed" ? "1 in flight" : `open, 1 every ${PING_INTERVAL_MS} ms`
    const scanText = scans === undefined ? "none" : `${int(scans.scans)} × ${ms(scans.scanP50Ms)} ms (${ms(scans.scanP99Ms)} ms)`
    lines.push(
      `| ${client} | ${label[load]} | ${int(x.pings)} | ${int(x.answeredPerS)} | ${int(x.p50Us)} | ${int(x.p99Us)} | ${int(x.maxUs)} | ` +
        `${times(x.p99Us / idle.p99Us)} | ${scanText} |`
    )
  }
  return lines.join("\n")
}

/** The part's subsection of the report, as lines (the last one empty). */
export const pingSection = (rows: PingResult, plan: PingPlan): ReadonlyArray<string> => [
  "### PING latency while the reaper scans",
  "",
  "An in-process MQ server (`bench/liveness/server-child.ts`: the real MqServer, handler table, management module,",
  `connection tracker and request barrier) whose management module drives one target holding ${int(PING_TRACKED)} fresh contexts;`,
  "a raw zeromq.js DEALER in the bench process sends PING [id of a tracked context] and times each round trip (µs):",
  `*1 in flight* sends the next PING on the reply (as bench:ping; what the target compares); *open* sends one every`,
  `${PING_INTERVAL_MS} ms whatever the replies do, as the heartbeats of many workers would, so every PING sent during a stall`,
  "is a sample. *answered /s*: replies received during the measured window.",
  `*idle*: no scan; *back to back*: \`Reaper.scan(now)\` in a loop, one event-loop turn between two scans (the`,
  `worst case, what the target is about); *every ${PERIODIC_SCAN_MS} ms*: the reaper's own loop at its period for`,
  `\`--worker-disconnect-grace-seconds 1\` (grace / 2; the default flags scan every 5 s). Scan durations are measured`,
  `in the server process. ${plan.rounds} round(s) of ${plan.phaseS} s per window, after ${PING_IDLE_WARMUP_S} s (idle) / ${PING_SCAN_WARMUP_S} s (scans) warm-up;`,
  "each window has its own client, and waits for every reply before the next one starts.",
  "",
  pingTable(rows),
  ""
]
