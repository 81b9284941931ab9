/**
 * `npm run bench:liveness [-- --quick | --full] [-- --parts 1,2,3,4] [-- --summary FILE]`
 * (`--quick` is the default; `--summary FILE` also writes the target rows as
 * JSON for bench/suite.ts)
 *
 * Worker liveness (DESIGN §5) under load, each figure beside a reference
 * measured in the same run where one exists:
 *
 * 1. Reaper scan time with 1k, 10k and 100k tracked contexts
 *    (bench/liveness-scan.ts, its own process): `InstanceRegistry.popStale`
 *    popping nothing and popping 1 %, the whole `Management.scan` over a
 *    LivenessTarget around that registry, and the reference — one pass of
 *    the same `judge` over the same records in a plain Map. Median of
 *    several timed runs, interleaved. Target: popStale under 50 ms at 100k.
 * 2. PING p99 while the management module scans 100k contexts back to back
 *    against PING p99 idle, same server, same run: an in-process MQ server
 *    (bench/liveness-server.ts, its own process) and, here, a raw zeromq
 *    DEALER with one PING [id] in flight. Target: p99 during scans ≤ 3 × idle.
 * 3. Heap per tracked context (bench/liveness-heap.ts under --expose-gc, one
 *    process per case): heapUsed growth / N for N = 100k registry entries,
 *    beside the same records in a plain Map, and for entries carrying a
 *    ContextEntry-shaped resource without mappings. Target: ≤ 2 KB per
 *    registry entry.
 * 4. SIGKILL → reaped with `--worker-disconnect-grace-seconds 1`: `mpcache
 *    serve` in a child process; worker processes (test/support/worker-daemon.ts,
 *    heartbeat 1 s) started in batches, each SIGKILLed at its own moment
 *    once its first store succeeded; the latency is the server's timestamp
 *    of its "reaped instance <id>" WARNING minus the kill time (same wall
 *    clock). Target: p99 ≤ grace + 0.25 s.
 *
 * Prints the tables and writes the section "## Liveness (bench:liveness)" of
 * docs/benchmarks.md. A benchmark, never a test: exits 0 when it measured
 * (whether or not a target was met), 1 when it could not, and always stops
 * its child processes, removes its ipc socket files and unlinks the shared
 * memory of the workers it killed.
 */
import { spawn, type ChildProcess } from "node:child_process"
import { randomUUID } from "node:crypto"
import { readdirSync, readFileSync, rmSync } from "node:fs"
import os from "node:os"
import path from "node:path"
import { parseArgs } from "node:util"
import { Packr } from "msgpackr"
import { Dealer } from "zeromq"
import type { ScanRow } from "./liveness-scan.ts"
import { DOC, writeDocSection } from "./docs.ts"
import { writeSummary } from "./summary.ts"

const ROOT = path.resolve(import.meta.dirname, "..")
const HEADING = "## Liveness (bench:liveness)"
const DAEMON = path.join(ROOT, "test", "support", "worker-daemon.ts")
const SHM_DIR = "/dev/shm"
const STOP_TIMEOUT_MS = 5_000

// ---------------------------------------------------------------- arguments

const { values: args } = parseArgs({
  options: {
    quick: { type: "boolean", default: false },
    full: { type: "boolean", default: false },
    parts: { type: "string", default: "1,2,3,4" },
    summary: { type: "string" }
  }
})
if (args.quick && args.full) {
  process.stderr.write("--quick and --full exclude each other\n")
  process.exit(2)
}
const full = args.full
/** Which parts to run; docs/benchmarks.md is written only when all four ran. */
const parts = new Set(args.parts.split(",").map((p) => p.trim()))
if ([...parts].some((p) => !["1", "2", "3", "4"].includes(p))) {
  process.stderr.write(`--parts takes a comma-separated subset of 1,2,3,4 (got ${args.parts})\n`)
  process.exit(2)
}

const PLAN = full
  ? { scanRepeats: 31, pingRounds: 3, pingPhaseS: 5, kills: 50, batch: 5 }
  : { scanRepeats: 11, pingRounds: 1, pingPhaseS: 2, kills: 10, batch: 5 }
const SCAN_SIZES = [1_000, 10_000, 100_000] as const
const PING_TRACKED = 100_000
const HEAP_N = 100_000
/** The 32-layer ContextEntry case is ~14 KB a context: measured over fewer entries. */
const HEAP_N_LARGE = 10_000
const GRACE_S = 1
const PING_IDLE_WARMUP_S = 0.5
const PING_SCAN_WARMUP_S = 1
/** Open-loop PING rate: one every 5 ms (200/s). */
const PING_INTERVAL_MS = 5
/** A PING without a reply this long fails the run. */
const REPLY_TIMEOUT_MS = 30_000
/** The reaper's period with a 1 s disconnect grace (grace / 2); the default flags give 5 s. */
const PERIODIC_SCAN_MS = 500
const WORKER_READY_TIMEOUT_MS = 60_000
const REAP_TIMEOUT_MS = 10_000
/** How long after the last reap `/api/status` may take to show no context and no mapping. */
const STATUS_SETTLE_MS = 3_000

const TARGET = {
  scanMs: 50,
  pingRatio: 3,
  heapBytes: 2048,
  reapP99S: GRACE_S + 0.25
} as const

// ------------------------------------------------------- child processes

const tag = `mpcache-bench-live-${process.pid}-${Date.now()}`
const socketFiles: Array<string> = []
const shmPrefixes: Array<string> = []
const children = new Set<ChildProcess>()

const ipcEndpoint = (name: string): string => {
  const file = path.join(os.tmpdir(), `${tag}-${name}.sock`)
  socketFiles.push(file)
  return `ipc://${file}`
}

const isRunning = (child: ChildProcess): boolean => child.exitCode === null && child.signalCode === null

/** A child whose stdout and stderr lines are kept (bounded) and can be waited for. */
interface Child {
  readonly name: string
  readonly process: ChildProcess
  /** Resolves with the first match of `pattern` in a future or past stdout/stderr line. */
  readonly waitFor: (pattern: RegExp, timeoutMs: number, stream?: "stdout" | "stderr") => Promise<RegExpMatchArray>
  readonly onLine: (listener: (line: string, stream: "stdout" | "stderr", at: number) => void) => void
  readonly tail: () => string
  readonly exited: Promise<{ readonly code: number | null; readonly signal: NodeJS.Signals | null }>
}

const KEEP_LINES = 400

const startChild = (name: string, argv: ReadonlyArray<string>, options: { readonly stdin?: boolean } = {}): Child => {
  const child = spawn(process.execPath, argv, { cwd: ROOT, stdio: [options.stdin === true ? "pipe" : "ignore", "pipe", "pipe"] })
  children.add(child)
  const lines: Array<{ readonly line: string; readonly stream: "stdout" | "stderr" }> = []
  const listeners: Array<(line: string, stream: "stdout" | "stderr", at: number) => void> = []
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) => {
    child.once("exit", (code, signal) => {
      children.delete(child)
      resolve({ code, signal })
    })
    child.once("error", () => {
      children.delete(child)
      resolve({ code: null, signal: null })
    })
  })
  for (const stream of ["stdout", "stderr"] as const) {
    let partial = ""
    child[stream]!.on("data", (chunk: Buffer) => {
      const at = Date.now()
      const parts = (partial + chunk.toString()).split("\n")
      partial = parts.pop()!
      for (const line of parts) {
        lines.push({ line, stream })
        if (lines.length > KEEP_LINES) lines.shift()
        for (const listener of listeners) listener(line, stream, at)
      }
    })
  }
  const tail = () => lines.slice(-40).map((l) => `${l.stream}: ${l.line}`).join("\n").slice(-6000)
  const waitFor = (pattern: RegExp, timeoutMs: number, stream?: "stdout" | "stderr") =>
    new Promise<RegExpMatchArray>((resolve, reject) => {
      for (const l of lines) {
        const m = (stream === undefined || l.stream === stream) ? l.line.match(pattern) : null
        if (m !== null) return resolve(m)
      }
      let done = false
      const timer = setTimeout(() => finish(new Error(`${name}: no line matching ${pattern} within ${timeoutMs} ms; output:\n${tail()}`)), timeoutMs)
      const finish = (result: RegExpMatchArray | Error) => {
        if (done) return
        done = true
        clearTimeout(timer)
        if (result instanceof Error) reject(result)
        else resolve(result)
      }
      listeners.push((line, s) => {
        if (stream !== undefined && s !== stream) return
        const m = line.match(pattern)
        if (m !== null) finish(m)
      })
      void exited.then(({ code, signal }) =>
        finish(new Error(`${name} exited (code ${code}, signal ${signal}) before a line matching ${pattern}; output:\n${tail()}`))
      )
    })
  return { name, process: child, waitFor, onLine: (l) => void listeners.push(l), tail, exited }
}

/** SIGTERM, wait for the exit; SIGKILL if it does not come. */
const stopChild = (child: ChildProcess): Promise<void> =>
  new Promise((resolve) => {
    if (!isRunning(child)) return resolve()
    const timer = setTimeout(() => child.kill("SIGKILL"), STOP_TIMEOUT_MS)
    child.once("exit", () => {
      clearTimeout(timer)
      resolve()
    })
    child.kill("SIGTERM")
  })

/** Runs a child program to its end and returns its last stdout line, parsed. */
const runJson = async <A>(name: string, argv: ReadonlyArray<string>): Promise<A> => {
  const child = startChild(name, argv)
  let last = ""
  child.onLine((line, stream) => {
    if (stream === "stdout" && line.trim().startsWith("{")) last = line
  })
  const { code, signal } = await child.exited
  if (code !== 0 || last === "") throw new Error(`${name} failed (code ${code}, signal ${signal}); output:\n${child.tail()}`)
  return JSON.parse(last) as A
}

/** Unlinks the shared-memory segments of a worker (SIGKILL skips its own cleanup). */
const removeShm = (prefix: string): void => {
  for (const file of readdirSync(SHM_DIR)) if (file.startsWith(`${prefix}-L`)) rmSync(path.join(SHM_DIR, file), { force: true })
}

const cleanup = async (): Promise<void> => {
  await Promise.all([...children].map(stopChild))
  for (const file of socketFiles) rmSync(file, { force: true })
  for (const prefix of shmPrefixes) removeShm(prefix)
}

// Last resort for an abrupt exit: nothing async is possible here.
process.once("exit", () => {
  for (const child of children) if (isRunning(child)) child.kill("SIGKILL")
  for (const file of socketFiles) rmSync(file, { force: true })
  for (const prefix of shmPrefixes) removeShm(prefix)
})
for (const signal of ["SIGINT", "SIGTERM"] as const) {
  process.once(signal, () => {
    void cleanup().finally(() => process.exit(signal === "SIGINT" ? 130 : 143))
  })
}

// -------------------------------------------------------------- statistics

const percentile = (sorted: ReadonlyArray<number>, p: number): number =>
  sorted[Math.max(0, Math.ceil((p / 100) * sorted.length) - 1)] ?? Number.NaN
const ascending = (xs: ReadonlyArray<number>): Array<number> => [...xs].sort((a, b) => a - b)
const median = (xs: ReadonlyArray<number>): number => {
  const s = ascending(xs)
  if (s.length === 0) return Number.NaN
  const mid = s.length >> 1
  return s.length % 2 === 1 ? s[mid]! : (s[mid - 1]! + s[mid]!) / 2
}
const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms))

// ------------------------------------------------- 1. reaper scan time

const measureScans = async (): Promise<ReadonlyArray<ScanRow>> => {
  process.stderr.write(`[1/4] reaper scan time: ${SCAN_SIZES.join(", ")} contexts, median of ${PLAN.scanRepeats}\n`)
  const result = await runJson<{ scan: ReadonlyArray<ScanRow> }>("scan", [
    "--expose-gc",
    "bench/liveness-scan.ts",
    "--sizes",
    SCAN_SIZES.join(","),
    "--repeats",
    String(PLAN.scanRepeats)
  ])
  return result.scan
}

// ---------------------------------------- 2. PING p99 during scans vs idle

const packr = new Packr({ useRecords: false, int64AsType: "bigint" })
const OP_PING = 22
const OP_FRAME = packr.pack(OP_PING)

/** `closed`: one PING in flight, the next sent on its reply; `open`: one sent every PING_INTERVAL_MS regardless. */
type ClientMode = "closed" | "open"

interface PingRun {
  /** Where the round trips of PINGs sent now go (undefined: warm-up, not measured). */
  into: Array<number> | undefined
  /** Replies received while true are counted (answered rate). */
  counting: boolean
  answered: number
  stopped: boolean
}

/**
 * One DEALER sending PING [id] to the server. `closed`: exactly one in
 * flight (as bench:ping). `open`: one every `PING_INTERVAL_MS` whatever the
 * replies do — heartbeats of many workers do not wait for each other — with
 * the replies received on the side, so a server stall delays every PING sent
 * during it and each is a sample (a closed-loop client sees one per stall).
 * A round trip runs from the actual send and counts in the phase the PING
 * was sent in (`run.into`). Once `run.stopped` it sends no more and waits
 * for every reply outstanding.
 */
const pingClient = async (endpoint: string, idFrame: Buffer, run: PingRun, mode: ClientMode): Promise<void> => {
  const dealer = new Dealer({ linger: 0, sendTimeout: 10_000, receiveTimeout: REPLY_TIMEOUT_MS })
  const sent = new Map<number, { readonly at: bigint; readonly into: Array<number> | undefined }>()
  const receiveOne = async (): Promise<void> => {
    const reply = await dealer.receive()
    const end = process.hrtime.bigint()
    const [rUid, rOp, rResponse] = reply.map((frame): unknown => packr.unpack(frame))
    const request = typeof rUid === "number" ? sent.get(rUid) : undefined
    if (reply.length !== 3 || request === undefined || rOp !== OP_PING || rResponse !== true) {
      throw new Error(`unexpected reply: ${JSON.stringify(reply.map((f) => packr.unpack(f)), (_, v) => typeof v === "bigint" ? v.toString() : v)}`)
    }
    sent.delete(rUid as number)
    request.into?.push(Number(end - request.at) / 1000)
    if (run.counting) run.answered++
  }
  const send = (uid: number) => {
    sent.set(uid, { at: process.hrtime.bigint(), into: run.into })
    return dealer.send([packr.pack(uid), OP_FRAME, idFrame])
  }
  try {
    dealer.connect(endpoint)
    if (mode === "closed") {
      for (let uid = 0; !run.stopped; uid++) {
        await send(uid)
        await receiveOne()
      }
      return
    }
    let sending = true
    const receiver = (async () => {
      while (sending || sent.size > 0) await receiveOne()
    })()
    const sender = (async () => {
      const start = performance.now()
      for (let uid = 0; !run.stopped; uid++) {
        const wait = start + uid * PING_INTERVAL_MS - performance.now()
        if (wait > 0) await sleep(wait)
        await send(uid)
      }
    })().finally(() => {
      sending = false
    })
    await Promise.all([sender, receiver])
  } finally {
    dealer.close()
  }
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
type PingResult = ReadonlyArray<PingRow>

/** The windows: per client mode, idle and then under scans. The target compares the first two. */
const PING_WINDOWS: ReadonlyArray<readonly [ClientMode, Load]> = [
  ["closed", "idle"],
  ["closed", "back-to-back"],
  ["open", "idle"],
  ["open", "periodic"],
  ["open", "back-to-back"]
]

const measurePing = async (): Promise<PingResult> => {
  process.stderr.write(
    `[2/4] PING under scans over ${PING_TRACKED.toLocaleString("en-US")} contexts vs idle: ` +
      `${PLAN.pingRounds} round(s) of ${PING_WINDOWS.length} windows of ${PLAN.pingPhaseS} s\n`
  )
  const endpoint = ipcEndpoint("scan-server")
  const server = startChild("in-process server", ["bench/liveness-server.ts", "--endpoint", endpoint, "--n", String(PING_TRACKED)], {
    stdin: true
  })
  try {
    const ready = JSON.parse((await server.waitFor(/^\{"ready":true.*\}$/, 120_000, "stdout"))[0]) as { pingId: string }
    const idFrame = packr.pack(BigInt(ready.pingId))
    const scanReports: Array<{ scans: number; scanMs: Array<number> }> = []
    server.onLine((line, stream) => {
      if (stream === "stdout" && line.startsWith("{\"scans\"")) scanReports.push(JSON.parse(line) as { scans: number; scanMs: Array<number> })
    })
    const samples = new Map<string, { latencies: Array<number>; answered: number; seconds: number; scanMs: Array<number> }>()

    /** One window: scans per `load`, a fresh client, warm-up, PLAN.pingPhaseS measured, then every reply. */
    const window = async (mode: ClientMode, load: Load): Promise<void> => {
      const key = `${mode}/${load}`
      const acc = samples.get(key) ?? { latencies: [], answered: 0, seconds: 0, scanMs: [] }
      samples.set(key, acc)
      const reported = scanReports.length
      if (load !== "idle") server.process.stdin!.write(load === "periodic" ? `scan every ${PERIODIC_SCAN_MS}\n` : "scan on\n")
      const run: PingRun = { into: undefined, counting: false, answered: 0, stopped: false }
      const client = pingClient(endpoint, idFrame, run, mode)
      const failed = client.then(() => new Promise<never>(() => {}))
      try {
        await Promise.race([sleep((load === "idle" ? PING_IDLE_WARMUP_S : PING_SCAN_WARMUP_S) * 1000), failed])
        run.into = acc.latencies
        run.counting = true
        const t0 = performance.now()
        await Promise.race([sleep(PLAN.pingPhaseS * 1000), failed])
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

    for (let round = 0; round < PLAN.pingRounds; round++) {
      for (const [mode, load] of PING_WINDOWS) await window(mode, load)
      process.stderr.write(`  round ${round + 1} done\n`)
    }
    server.process.stdin!.write("quit\n")
    return PING_WINDOWS.map(([mode, load]): PingRow => {
      const acc = samples.get(`${mode}/${load}`)!
      const sorted = ascending(acc.latencies)
      const scans = ascending(acc.scanMs)
      return {
        mode,
        load,
        phase: {
          pings: sorted.length,
          p50Us: percentile(sorted, 50),
          p99Us: percentile(sorted, 99),
          maxUs: sorted[sorted.length - 1] ?? Number.NaN,
          answeredPerS: acc.answered / acc.seconds
        },
        scans: load === "idle" ? undefined : { scans: scans.length, scanP50Ms: percentile(scans, 50), scanP99Ms: percentile(scans, 99) }
      }
    })
  } finally {
    await stopChild(server.process)
  }
}

// ----------------------------------------------- 3. heap per tracked context

interface HeapRow {
  readonly name: string
  readonly n: number
  readonly bytesPerEntry: number
}

const HEAP_CASES: ReadonlyArray<readonly [string, number]> = [
  ["registry", HEAP_N],
  ["registry, pinged", HEAP_N],
  ["plain Map", HEAP_N],
  ["registry + ContextEntry (2 layers)", HEAP_N],
  ["registry + ContextEntry (32 layers)", HEAP_N_LARGE]
]

const measureHeap = async (): Promise<ReadonlyArray<HeapRow>> => {
  process.stderr.write(`[3/4] heap per tracked context: ${HEAP_CASES.length} cases, one process each\n`)
  const rows: Array<HeapRow> = []
  for (const [name, n] of HEAP_CASES) {
    const { heap } = await runJson<{ heap: HeapRow }>(`heap ${name}`, [
      "--expose-gc",
      "bench/liveness-heap.ts",
      "--n",
      String(n),
      "--case",
      name
    ])
    rows.push(heap)
  }
  return rows
}

// ------------------------------------------------- 4. SIGKILL → reaped

interface KillResult {
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

const measureKills = async (): Promise<KillResult> => {
  process.stderr.write(
    `[4/4] SIGKILL → reaped, disconnect grace ${GRACE_S} s: ${PLAN.kills} kills in batches of ${PLAN.batch}\n`
  )
  const endpoint = ipcEndpoint("serve")
  const server = startChild("mpcache serve", [
    "src/cli/main.ts",
    "serve",
    "--endpoint",
    endpoint,
    "--http-port",
    "0",
    "--chunk-size",
    "64",
    "--worker-disconnect-grace-seconds",
    String(GRACE_S),
    "--log-format",
    "json"
  ])
  try {
    const [, port] = await server.waitFor(/HTTP frontend listening on http:\/\/127\.0\.0\.1:(\d+)/, 60_000, "stderr")
    await server.waitFor(/MQ server listening on/, 60_000, "stderr")
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
      const namePrefix = `${tag}-w-${randomUUID().slice(0, 8)}`
      shmPrefixes.push(namePrefix)
      const worker = startChild(`worker ${namePrefix}`, [
        DAEMON,
        JSON.stringify({ endpoint, namePrefix, heartbeatIntervalMs: 1000, storeEveryMs: 60_000 })
      ])
      const [, instanceId] = await worker.waitFor(/"event":"registered","instanceId":"(\d+)"/, WORKER_READY_TIMEOUT_MS, "stdout")
      await worker.waitFor(/"event":"store","n":1,"ok":true/, WORKER_READY_TIMEOUT_MS, "stdout")
      return { worker, namePrefix, instanceId: instanceId! }
    }

    const suspectMs: Array<number> = []
    const reapedMs: Array<number> = []
    const seenMs: Array<number> = []
    const reasons: Array<string> = []
    let killed = 0
    while (killed < PLAN.kills) {
      const size = Math.min(PLAN.batch, PLAN.kills - killed)
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
      process.stderr.write(`  ${killed}/${PLAN.kills} killed and reaped\n`)
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
        readFileSync(`/proc/${server.process.pid}/maps`, "utf8").split("\n").filter((l) => l.includes(`${tag}-w-`)).map((l) =>
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
    await stopChild(server.process)
  }
}

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

const ms = (x: number): string => (x >= 10 ? x.toFixed(1) : x >= 1 ? x.toFixed(2) : x.toFixed(3))
const int = (x: number): string => Math.round(x).toLocaleString("en-US")
const ratio = (x: number): string => `${x.toFixed(2)}×`
const sec = (xMs: number): string => (xMs / 1000).toFixed(3)
const met = (ok: boolean): string => (ok ? "yes" : "**no**")

interface TargetRow {
  readonly check: string
  readonly measured: string
  readonly reference: string
  readonly ratio: string
  readonly target: string
  readonly ok: boolean
}

const targets = (r: Report): ReadonlyArray<TargetRow> => {
  const rows: Array<TargetRow> = []
  const big = r.scans?.find((s) => s.n === 100_000)
  if (big !== undefined) {
    rows.push(
      {
        check: "popStale over 100k, none stale (median)",
        measured: `${ms(big.registryFresh.median)} ms`,
        reference: `plain Map ${ms(big.plainFresh.median)} ms`,
        ratio: ratio(big.registryFresh.median / big.plainFresh.median),
        target: `< ${TARGET.scanMs} ms`,
        ok: big.registryFresh.median < TARGET.scanMs
      },
      {
        check: "popStale over 100k, 1 % stale (median)",
        measured: `${ms(big.registryStale.median)} ms`,
        reference: `plain Map ${ms(big.plainStale.median)} ms`,
        ratio: ratio(big.registryStale.median / big.plainStale.median),
        target: `< ${TARGET.scanMs} ms`,
        ok: big.registryStale.median < TARGET.scanMs
      }
    )
  }
  if (r.ping !== undefined) {
    const of = (mode: ClientMode, load: Load) => r.ping!.find((p) => p.mode === mode && p.load === load)!.phase
    const idle = of("closed", "idle")
    const busy = of("closed", "back-to-back")
    rows.push({
      check: "PING p99 during back-to-back scans over 100k (one PING in flight)",
      measured: `${int(busy.p99Us)} µs`,
      reference: `idle ${int(idle.p99Us)} µs`,
      ratio: ratio(busy.p99Us / idle.p99Us),
      target: `≤ ${TARGET.pingRatio} × idle`,
      ok: busy.p99Us <= TARGET.pingRatio * idle.p99Us
    })
  }
  if (r.heap !== undefined) {
    const registryHeap = r.heap.find((h) => h.name === "registry")!
    const pingedHeap = r.heap.find((h) => h.name === "registry, pinged")!
    const plainHeap = r.heap.find((h) => h.name === "plain Map")!
    const worstHeap = Math.max(registryHeap.bytesPerEntry, pingedHeap.bytesPerEntry)
    rows.push({
      check: "heap per registry entry (worst of fresh / pinged)",
      measured: `${int(worstHeap)} B`,
      reference: `plain Map ${int(plainHeap.bytesPerEntry)} B`,
      ratio: ratio(worstHeap / plainHeap.bytesPerEntry),
      target: `≤ ${TARGET.heapBytes} B`,
      ok: worstHeap <= TARGET.heapBytes
    })
  }
  if (r.kills !== undefined) {
    const reapP99 = percentile(ascending(r.kills.reapedMs), 99)
    rows.push({
      check: `SIGKILL → reaped p99 (${r.kills.kills} kills)`,
      measured: `${sec(reapP99)} s`,
      reference: `grace ${GRACE_S} s`,
      ratio: ratio(reapP99 / (GRACE_S * 1000)),
      target: `≤ ${TARGET.reapP99S} s`,
      ok: reapP99 <= TARGET.reapP99S * 1000
    })
  }
  return rows
}

const targetTable = (rows: ReadonlyArray<TargetRow>): string =>
  [
    "| check | measured | reference (same run) | ratio | target | met |",
    "|---|---:|---:|---:|---:|:---:|",
    ...rows.map((t) => `| ${t.check} | ${t.measured} | ${t.reference} | ${t.ratio} | ${t.target} | ${met(t.ok)} |`)
  ].join("\n")

const scanTable = (rows: ReadonlyArray<ScanRow>): string =>
  [
    "| tracked | popStale, none stale | plain Map | ratio | popStale, 1 % stale | plain Map | ratio | Management.scan, none stale | Management.scan, 1 % stale |",
    "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ...rows.map((s) =>
      `| ${int(s.n)} | ${ms(s.registryFresh.median)} | ${ms(s.plainFresh.median)} | ${ratio(s.registryFresh.median / s.plainFresh.median)} | ` +
      `${ms(s.registryStale.median)} | ${ms(s.plainStale.median)} | ${ratio(s.registryStale.median / s.plainStale.median)} | ` +
      `${ms(s.scanFresh.median)} | ${ms(s.scanStale.median)} |`
    )
  ].join("\n")

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
        `${ratio(x.p99Us / idle.p99Us)} | ${scanText} |`
    )
  }
  return lines.join("\n")
}

const heapTable = (rows: ReadonlyArray<HeapRow>): string => {
  const plain = rows.find((h) => h.name === "plain Map")!.bytesPerEntry
  return [
    "| what is tracked | entries | heap per entry | vs plain Map |",
    "|---|---:|---:|---:|",
    ...rows.map((h) => `| ${h.name} | ${int(h.n)} | ${int(h.bytesPerEntry)} B | ${ratio(h.bytesPerEntry / plain)} |`)
  ].join("\n")
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

const section = (r: Report): string => {
  const cpus = os.cpus()
  const load = (l: ReadonlyArray<number>) => l.map((x) => x.toFixed(2)).join(" / ")
  return [
    HEADING,
    "",
    `Measured ${new Date().toISOString().slice(0, 10)} · Node ${process.version} · ` +
    `${cpus[0]?.model.trim() ?? "unknown CPU"} (${cpus.length} cores) · ${full ? "--full" : "--quick"} · ` +
    `${r.elapsedS.toFixed(0)} s · load average (1/5/15 min) ${load(r.loadBefore)} before, ${load(r.loadAfter)} after.`,
    "",
    targetTable(targets(r)),
    "",
    ...(r.scans === undefined ? [] : [
    "### Reaper scan time (ms, median)",
    "",
    `In one process (\`bench/liveness-scan.ts\`), per size: an \`InstanceRegistry\` of N fresh contexts (random 63-bit ids,`,
    "each holding a small resource with its own Scope). *popStale* is `InstanceRegistry.popStale(rule)`, one transaction;",
    "*plain Map* (the reference) is one pass of the same `judge` over the same records in a `Map<bigint, Tracked>`, then",
    "the deletes. *Management.scan* is the reaper's whole scan over a LivenessTarget built around the registry the way",
    "LmcacheDrivenTransfer builds its own: pop, close each popped Scope, one JSON WARNING per reaped instance on stderr,",
    "prune the connection tracker, update gauges. *1 % stale*: 1 % of the entries re-aged past their window before",
    `each run (untimed), all popped by it. ${PLAN.scanRepeats} timed rounds after 3 untimed ones, the six measurements`,
    "interleaved within each round.",
    "",
    scanTable(r.scans),
    ""]),
    ...(r.ping === undefined ? [] : [
    "### PING latency while the reaper scans",
    "",
    "An in-process MQ server (`bench/liveness-server.ts`: the real MqServer, handler table, management module,",
    `connection tracker and request barrier) whose management module drives one target holding ${int(PING_TRACKED)} fresh contexts;`,
    "a raw zeromq.js DEALER in the bench process sends PING [id of a tracked context] and times each round trip (µs):",
    `*1 in flight* sends the next PING on the reply (as bench:ping; what the target compares); *open* sends one every`,
    `${PING_INTERVAL_MS} ms whatever the replies do, as the heartbeats of many workers would, so every PING sent during a stall`,
    "is a sample. *answered /s*: replies received during the measured window.",
    `*idle*: no scan; *back to back*: \`Management.scan(now)\` in a loop, one event-loop turn between two scans (the`,
    `worst case, what the target is about); *every ${PERIODIC_SCAN_MS} ms*: the reaper's own loop at its period for`,
    `\`--worker-disconnect-grace-seconds 1\` (grace / 2; the default flags scan every 5 s). Scan durations are measured`,
    `in the server process. ${PLAN.pingRounds} round(s) of ${PLAN.pingPhaseS} s per window, after ${PING_IDLE_WARMUP_S} s (idle) / ${PING_SCAN_WARMUP_S} s (scans) warm-up;`,
    "each window has its own client, and waits for every reply before the next one starts.",
    "",
    pingTable(r.ping),
    ""]),
    ...(r.heap === undefined ? [] : [
    "### Heap per tracked context",
    "",
    "`bench/liveness-heap.ts` under `--expose-gc`, one process per case: (heapUsed after − before) / N, full",
    "collections before and after, ids created inside the span. *registry*: InstanceRegistry entries all holding one",
    "shared resource (the registry's own cost); *pinged*: after one PING each (touch replaces the record);",
    "*plain Map*: the same records in a `Map<bigint, Tracked>` (reference); *ContextEntry*: the entry plus a resource",
    "shaped like LmcacheDrivenTransfer's ContextEntry without mappings (decoded descriptors of the worker-daemon geometry,",
    "validated geometry and placements, an empty mappings Map, a Scope forked from a module scope with one finalizer).",
    "",
    heapTable(r.heap),
    ""]),
    ...(r.kills === undefined ? [] : [
    "### SIGKILL → reaped",
    "",
    `\`mpcache serve --endpoint ipc://… --http-port 0 --chunk-size 64 --worker-disconnect-grace-seconds ${GRACE_S} --log-format json\``,
    `in a child process; workers are \`test/support/worker-daemon.ts\` processes (heartbeat 1 s), started ${PLAN.batch} at a time;`,
    "once each has registered and stored, they are SIGKILLed one at a time, 150-500 ms apart (random), and the",
    "latency is the timestamp of the server's \"reaped instance <id>\" WARNING (or \"lost its last connection\" INFO)",
    "minus the kill time (same wall clock, ms resolution). Their shm segments are unlinked by the bench afterwards.",
    "",
    killTable(r.kills),
    ""]),
    "Reproduce: `npm run bench:liveness` (`-- --full` for 31 scan rounds, 3 × 5 s PING rounds and 50 kills;",
    "`-- --parts 1,4` runs only some parts and then leaves this file alone).",
    ""
  ].join("\n")
}

/** Replaces this bench's section of docs/benchmarks.md, keeping the others. */
const writeDoc = (body: string): void => writeDocSection(HEADING, body)

// -------------------------------------------------------------------- main

const main = async (): Promise<void> => {
  const t0 = Date.now()
  const loadBefore = os.loadavg()
  const scans = parts.has("1") ? await measureScans() : undefined
  const ping = parts.has("2") ? await measurePing() : undefined
  const heap = parts.has("3") ? await measureHeap() : undefined
  const kills = parts.has("4") ? await measureKills() : undefined
  const report: Report = { scans, ping, heap, kills, loadBefore, loadAfter: os.loadavg(), elapsedS: (Date.now() - t0) / 1000 }
  const body = section(report)
  process.stdout.write(`\n${body}\n`)
  if (parts.size === 4) {
    writeDoc(body)
    process.stdout.write(`wrote ${path.relative(ROOT, DOC)}\n`)
  } else {
    process.stdout.write(`only part(s) ${[...parts].sort().join(", ")} ran: ${path.relative(ROOT, DOC)} left as it was\n`)
  }
  writeSummary(args.summary, targets(report).map((t) => ({
    bench: "liveness",
    figure: t.check,
    measured: t.measured,
    reference: t.reference,
    ratio: Number.parseFloat(t.ratio),
    target: t.target,
    met: t.ok
  })))
  const missed = targets(report).filter((t) => !t.ok)
  if (missed.length > 0) {
    process.stdout.write(`targets missed: ${missed.map((t) => `${t.check} (${t.measured}, target ${t.target})`).join("; ")}\n`)
  }
}

try {
  await main()
  await cleanup()
} catch (error) {
  process.stderr.write(`bench:liveness failed: ${error instanceof Error ? error.stack ?? error.message : String(error)}\n`)
  await cleanup()
  process.exit(1)
}
