/**
 * bench:liveness part 4, SIGKILL → reaped with
 * `--worker-disconnect-grace-seconds 1`: `mpcache serve` in a child process;
 * worker processes (test/support/worker-daemon.ts, heartbeat 1 s) started in
 * batches, each SIGKILLed at its own moment once its first store succeeded;
 * the latency is the server's timestamp of its "reaped instance <id>"
 * WARNING minus the kill time (same wall clock), ms. Target: p99 ≤ grace +
 * 0.25 s. The killed workers' shared memory is unlinked here (SIGKILL skips
 * their own cleanup), and by the run's cleanup on every other path.
 */
import { randomUUID } from "node:crypto"
import { readdirSync, readFileSync, rmSync } from "node:fs"
import path from "node:path"
import { ROOT, startLineChild, stopChild } from "../lib/children.ts"
import { int, times } from "../lib/format.ts"
import type { Resources } from "../lib/resources.ts"
import { ascending, median, percentile } from "../lib/stats.ts"
import { sleep } from "../lib/time.ts"
import { sec, type TargetRow } from "./report.ts"

const DAEMON = path.join(ROOT, "test", "support", "worker-daemon.ts")
const SHM_DIR = "/dev/shm"
/** The disconnect grace the server runs with, seconds. */
const GRACE_S = 1
/** The server's chunk size, tokens: the workers' KV caches are tiny (test/support/worker-daemon.ts). */
const CHUNK_TOKENS = 64
const TARGET_REAP_P99_S = GRACE_S + 0.25
const SERVER_READY_TIMEOUT_MS = 60_000
const WORKER_READY_TIMEOUT_MS = 60_000
const REAP_TIMEOUT_MS = 10_000
/** How long after the last reap `/api/status` may take to show no context and no mapping. */
const STATUS_SETTLE_MS = 3_000
const STOP_TIMEOUT_MS = 5_000

/** How many workers to kill, and how many are started (then killed) at a time. */
export interface KillPlan {
  readonly kills: number
  readonly batch: number
}

/** Unlinks the shared-memory segments of a worker (SIGKILL skips its own cleanup). */
const removeShm = (prefix: string): void => {
  for (const file of readdirSync(SHM_DIR)) if (file.startsWith(`${prefix}-L`)) rmSync(path.join(SHM_DIR, file), { force: true })
}

/** What part 4 measured: latencies from each kill, ms, and the server's state once all were reaped. */
export interface KillResult {
  readonly kills: number
  /** Kill → the server's "lost its last connection; suspect" log, ms. */
  readonly suspectMs: ReadonlyArray<number>
  /** Kill → the server's "reaped instance" WARNING timestamp, ms. */
  readonly reapedMs: ReadonlyArray<number>
  /** Kill → that WARNING line read here, ms (cross-check). */
  readonly seenMs: ReadonlyArray<number>
  readonly reasons: ReadonlyArray<string>
  /** `/api/status` afterwards. */
  readonly trackedAfter: number
  readonly openMappingsAfter: number
  /** open_mappings before any worker registered (the server's own, e.g. its L1 pool). */
  readonly openMappingsBaseline: number
  /** When the status was taken, ms after the last reap was seen. */
  readonly settleMs: number
  /** Segments of the killed workers the server process still maps (/proc/<pid>/maps). */
  readonly stillMapped: ReadonlyArray<string>
}

interface ServerLogLine {
  readonly message: unknown
  readonly timestamp?: string
}

/** Kills `plan.kills` workers of one server and times each reap. */
export const measureKills = async (resources: Resources, plan: KillPlan): Promise<KillResult> => {
  process.stderr.write(
    `[4/4] SIGKILL → reaped, disconnect grace ${GRACE_S} s: ${plan.kills} kills in batches of ${plan.batch}\n`
  )
  const endpoint = resources.ipcEndpoint("serve")
  const server = startLineChild("mpcache serve", [
    "src/cli/main.ts",
    "serve",
    "--endpoint",
    endpoint,
    "--http-port",
    "0",
    "--chunk-size",
    String(CHUNK_TOKENS),
    "--worker-disconnect-grace-seconds",
    String(GRACE_S),
    "--log-format",
    "json"
  ], resources.children)
  try {
    const [, port] = await server.waitFor(/HTTP frontend listening on http:\/\/127\.0\.0\.1:(\d+)/, SERVER_READY_TIMEOUT_MS, "stderr")
    await server.waitFor(/MQ server listening on/, SERVER_READY_TIMEOUT_MS, "stderr")
    const statusNow = async () => {
      const status = await fetch(`http://127.0.0.1:${port}/api/status`).then((r) => r.json() as Promise<Record<string, unknown>>)
      return {
        tracked: (status["worker_liveness"] as { tracked_instances: number }).tracked_instances,
        openMappings: (status["native"] as { open_mappings: number }).open_mappings
      }
    }
    // The server's own mappings (the L1 pool) before any worker: what must be left once all are reaped.
    const baseline = await statusNow()

    // Server log events by instance id: when it was logged (server clock) and when it was read here.
    const events = new Map<string, { suspect?: number; reaped?: number; seen?: number; reason?: string }>()
    const waiters = new Map<string, () => void>()
    server.onLine((line, stream, at) => {
      if (stream !== "stderr" || !line.startsWith("{")) return
      let entry: ServerLogLine
      try {
        entry = JSON.parse(line) as ServerLogLine
      } catch {
        return
      }
      // Effect's JSON logger writes `message` as a string, or as an array (text, then the structured fields).
      const first: unknown = Array.isArray(entry.message) ? entry.message[0] : entry.message
      const message = typeof first === "string" ? first : ""
      const ts = entry.timestamp !== undefined ? Date.parse(entry.timestamp) : at
      const suspect = message.match(/^instance (\d+) lost its last connection; suspect/)
      const reaped = message.match(/^reaped instance (\d+): .*\(reason (\w+)\)/)
      if (suspect !== null) {
        const e = events.get(suspect[1]!) ?? {}
        events.set(suspect[1]!, { ...e, suspect: ts })
      }
      if (reaped !== null) {
        const e = events.get(reaped[1]!) ?? {}
        events.set(reaped[1]!, { ...e, reaped: ts, seen: at, reason: reaped[2]! })
        waiters.get(reaped[1]!)?.()
      }
    })
    const reapedOf = (id: string): Promise<void> =>
      new Promise((resolve, reject) => {
        if (events.get(id)?.reaped !== undefined) return resolve()
        const timer = setTimeout(() => reject(new Error(`instance ${id} not reaped within ${REAP_TIMEOUT_MS} ms of its kill; server output:\n${server.tail()}`)), REAP_TIMEOUT_MS)
        waiters.set(id, () => {
          clearTimeout(timer)
          waiters.delete(id)
          resolve()
        })
      })

    const startWorker = async () => {
      const namePrefix = `${resources.tag}-w-${randomUUID().slice(0, 8)}`
      resources.onCleanup(() => removeShm(namePrefix))
      const worker = startLineChild(`worker ${namePrefix}`, [
        DAEMON,
        JSON.stringify({ endpoint, namePrefix, heartbeatIntervalMs: 1000, storeEveryMs: 60_000 })
      ], resources.children)
      const [, instanceId] = await worker.waitFor(/"event":"registered","instanceId":"(\d+)"/, WORKER_READY_TIMEOUT_MS, "stdout")
      await worker.waitFor(/"event":"store","n":1,"ok":true/, WORKER_READY_TIMEOUT_MS, "stdout")
      return { worker, namePrefix, instanceId: instanceId! }
    }

    const suspectMs: Array<number> = []
    const reapedMs: Array<number> = []
    const seenMs: Array<number> = []
    const reasons: Array<string> = []
    let killed = 0
    while (killed < plan.kills) {
      const size = Math.min(plan.batch, plan.kills - killed)
      const batch = await Promise.all(Array.from({ length: size }, startWorker))
      // Let the start-up load settle, then kill one at a time at distinct moments, spaced by a random
      // 150-500 ms so that the kills fall at every phase of the reaper's 0.5 s scan grid.
      await sleep(500)
      const pending: Array<Promise<void>> = []
      for (const { worker, instanceId } of batch) {
        const killAt = Date.now()
        worker.process.kill("SIGKILL")
        pending.push(
          reapedOf(instanceId).then(() => {
            const e = events.get(instanceId)!
            reapedMs.push(e.reaped! - killAt)
            seenMs.push(e.seen! - killAt)
            if (e.suspect !== undefined) suspectMs.push(e.suspect - killAt)
            reasons.push(e.reason!)
          })
        )
        await sleep(150 + Math.random() * 350)
      }
      await Promise.all(pending)
      await Promise.all(batch.map(({ worker }) => worker.exited))
      for (const { namePrefix } of batch) removeShm(namePrefix)
      killed += size
      process.stderr.write(`  ${killed}/${plan.kills} killed and reaped\n`)
    }

    // Every context reaped: the server should hold no context and no mapping beyond its baseline. Poll
    // briefly, so that a release still finishing is told from one that never happens.
    const lastReap = Math.max(...[...events.values()].map((e) => e.seen ?? 0))
    let after = await statusNow()
    while ((after.tracked > 0 || after.openMappings > baseline.openMappings) && Date.now() - lastReap < STATUS_SETTLE_MS) {
      await sleep(100)
      after = await statusNow()
    }
    // The workers' segments the server process still maps (/proc/<pid>/maps): none expected.
    const stillMapped = server.process.pid === undefined ? [] : [
      ...new Set(
        readFileSync(`/proc/${server.process.pid}/maps`, "utf8").split("\n").filter((l) => l.includes(`${resources.tag}-w-`)).map((l) =>
          l.split("/").pop()!
        )
      )
    ]
    return {
      kills: killed,
      suspectMs,
      reapedMs,
      seenMs,
      reasons,
      trackedAfter: after.tracked,
      openMappingsAfter: after.openMappings,
      openMappingsBaseline: baseline.openMappings,
      settleMs: Date.now() - lastReap,
      stillMapped
    }
  } finally {
    await stopChild(server.process, STOP_TIMEOUT_MS)
  }
}

/** The target: p99 of kill → reaped WARNING, against the grace. */
export const killTargets = (k: KillResult): ReadonlyArray<TargetRow> => {
  const reapP99 = percentile(ascending(k.reapedMs), 99)
  return [{
    check: `SIGKILL → reaped p99 (${k.kills} kills)`,
    measured: `${sec(reapP99)} s`,
    reference: `grace ${GRACE_S} s`,
    ratio: times(reapP99 / (GRACE_S * 1000)),
    target: `≤ ${TARGET_REAP_P99_S} s`,
    ok: reapP99 <= TARGET_REAP_P99_S * 1000
  }]
}

const killTable = (k: KillResult): string => {
  const row = (name: string, xs: ReadonlyArray<number>) => {
    const s = ascending(xs)
    return `| ${name} | ${s.length} | ${sec(s[0] ?? NaN)} | ${sec(median(s))} | ${sec(percentile(s, 99))} | ${sec(s[s.length - 1] ?? NaN)} |`
  }
  const reasons = [...new Set(k.reasons)].join(", ")
  return [
    "| kill → … (s) | samples | min | median | p99 | max |",
    "|---|---:|---:|---:|---:|---:|",
    row("suspect (server log: last connection lost)", k.suspectMs),
    row("**reaped** (server log: WARNING)", k.reapedMs),
    row("reaped WARNING read by the bench", k.seenMs),
    "",
    `Reap reason(s): ${reasons}. \`/api/status\` ${int(k.settleMs)} ms after the last reap: tracked_instances ${k.trackedAfter}, ` +
    `native open_mappings ${k.openMappingsAfter} (${k.openMappingsBaseline} before the first worker: the server's own); ` +
    `workers' segments still in the server's /proc/<pid>/maps: ${k.stillMapped.length === 0 ? "none" : k.stillMapped.join(", ")}.`,
    `Reference: the grace is ${GRACE_S} s and the reaper scans every grace / 2 = ${GRACE_S / 2} s, so by design a reap lands`,
    `between ${GRACE_S} s and ${GRACE_S * 1.5} s after the disconnect is noticed.`
  ].join("\n")
}

/** The part's subsection of the report, as lines (the last one empty). */
export const killSection = (k: KillResult, plan: KillPlan): ReadonlyArray<string> => [
  "### SIGKILL → reaped",
  "",
  `\`mpcache serve --endpoint ipc://… --http-port 0 --chunk-size ${CHUNK_TOKENS} --worker-disconnect-grace-seconds ${GRACE_S} --log-format json\``,
  `in a child process; workers are \`test/support/worker-daemon.ts\` processes (heartbeat 1 s), started ${plan.batch} at a time;`,
  "once each has registered and stored, they are SIGKILLed one at a time, 150-500 ms apart (random), and the",
  "latency is the timestamp of the server's \"reaped instance <id>\" WARNING (or \"lost its last connection\" INFO)",
  "minus the kill time (same wall clock, ms resolution). Their shm segments are unlinked by the bench afterwards.",
  "",
  killTable(k),
  ""
]
