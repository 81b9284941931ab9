/**
 * `npm run bench:ping [-- --quick | --full] [-- --duration S --rounds R] [-- --summary FILE]`
 *
 * PING round trips per second and p50/p99 latency with 1, 4 and 16
 * concurrent clients, against (a) the real mpcache server and (b) a bare
 * zeromq.js ROUTER that echoes every message (bench/echo-router.ts), both in
 * child processes, in the same run. The same raw DEALER client code drives
 * both, so the only difference is the server. The two servers alternate
 * round by round, so a change in the machine's load hits both alike. Prints
 * a table and writes the section "## PING round trips (bench:ping)" of
 * docs/benchmarks.md; `--summary FILE` also writes the target rows as JSON
 * for bench/suite.ts.
 *
 * A benchmark, never a test: exits 0 on success, 1 on failure, and always
 * stops its child processes and removes its ipc socket files.
 */
import type { ChildProcess } from "node:child_process"
import { rmSync } from "node:fs"
import os from "node:os"
import path from "node:path"
import { parseArgs } from "node:util"
import { DOC, writeDocSection } from "./docs.ts"
import { pingLoop, type PingRun } from "./pingClient.ts"
import { spawnReady } from "./spawnReady.ts"
import { writeSummary, type SummaryRow } from "./summary.ts"

const ROOT = path.resolve(import.meta.dirname, "..")
const HEADING = "## PING round trips (bench:ping)"
const CONCURRENCY = [1, 4, 16] as const
const WARMUP_S = 0.5
const READY_TIMEOUT_MS = 30_000
const STOP_TIMEOUT_MS = 5_000

// ---------------------------------------------------------------- arguments

const { values: args } = parseArgs({
  options: {
    quick: { type: "boolean", default: false },
    full: { type: "boolean", default: false },
    duration: { type: "string" },
    rounds: { type: "string" },
    summary: { type: "string" }
  }
})
if (args.quick && args.full) {
  process.stderr.write("--quick and --full exclude each other\n")
  process.exit(2)
}
/** Seconds measured per server and configuration, over all rounds. */
const durationS = args.duration !== undefined ? Number(args.duration) : args.full ? 12 : 4
const rounds = args.rounds !== undefined ? Number(args.rounds) : args.full ? 6 : 4
if (!Number.isFinite(durationS) || durationS <= 0) {
  process.stderr.write(`--duration must be a positive number of seconds, got ${args.duration}\n`)
  process.exit(2)
}
if (!Number.isInteger(rounds) || rounds < 1) {
  process.stderr.write(`--rounds must be a positive integer, got ${args.rounds}\n`)
  process.exit(2)
}

// ------------------------------------------------------- child processes

interface Server {
  readonly name: string
  readonly endpoint: string
  readonly child: ChildProcess
}

const tag = `mpcache-bench-${process.pid}-${Date.now()}`
const socketFiles: string[] = []
const children: ChildProcess[] = []

const ipcEndpoint = (name: string): string => {
  const file = path.join(os.tmpdir(), `${tag}-${name}.sock`)
  socketFiles.push(file)
  return `ipc://${file}`
}

/** Spawns `node ...argv` and resolves once its stdout or stderr shows `ready`. */
const startServer = async (name: string, endpoint: string, argv: readonly string[], ready: string): Promise<Server> => ({
  name,
  endpoint,
  child: await spawnReady(`${name} server`, argv, ready, READY_TIMEOUT_MS, (child) => children.push(child))
})

const isRunning = (child: ChildProcess): boolean => child.exitCode === null && child.signalCode === null

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

const cleanup = async (): Promise<void> => {
  await Promise.all(children.map(stopChild))
  for (const file of socketFiles) rmSync(file, { force: true })
}

// Last resort for an abrupt exit: nothing async is possible here.
process.once("exit", () => {
  for (const child of children) if (isRunning(child)) child.kill("SIGKILL")
  for (const file of socketFiles) rmSync(file, { force: true })
})
for (const signal of ["SIGINT", "SIGTERM"] as const) {
  process.once(signal, () => {
    void cleanup().finally(() => process.exit(signal === "SIGINT" ? 130 : 143))
  })
}

// ------------------------------------------------------------------ client

type Run = PingRun

interface Result {
  readonly rps: number
  readonly p50Us: number
  readonly p99Us: number
}

const percentile = (sorted: readonly number[], p: number): number =>
  sorted[Math.max(0, Math.ceil((p / 100) * sorted.length) - 1)] ?? Number.NaN

const sleep = (s: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, s * 1000))

/** Samples and seconds of the rounds so far of one server and configuration. */
interface Pooled {
  readonly latenciesUs: Array<number>
  seconds: number
}

const result = (p: Pooled): Result => {
  const sorted = p.latenciesUs.sort((a, b) => a - b)
  return { rps: sorted.length / p.seconds, p50Us: percentile(sorted, 50), p99Us: percentile(sorted, 99) }
}

/** One round: `clients` clients for WARMUP_S, then `seconds` measured into `into`. */
const measure = async (server: Server, clients: number, expected: unknown, seconds: number, into: Pooled): Promise<void> => {
  const run: Run = { measuring: false, stopped: false, latenciesUs: into.latenciesUs }
  const all = Promise.all(Array.from({ length: clients }, () => pingLoop(server.endpoint, run, expected))).catch(
    (error: unknown) => {
      const { exitCode, signalCode } = server.child
      const state = isRunning(server.child) ? "running" : `exited (code ${exitCode}, signal ${signalCode})`
      const why = error instanceof Error ? error.message : String(error)
      throw new Error(`${server.name} server (${state}), ${clients} client(s): ${why}`, { cause: error })
    }
  )
  // A client that fails ends the run at once instead of after the timers.
  const failed = all.then(() => new Promise<never>(() => {}))
  const phase = async (): Promise<number> => {
    await sleep(WARMUP_S)
    run.measuring = true
    const t0 = process.hrtime.bigint()
    await sleep(seconds)
    run.measuring = false
    return Number(process.hrtime.bigint() - t0) / 1e9
  }
  let elapsedS: number
  try {
    elapsedS = await Promise.race([phase(), failed])
  } finally {
    run.stopped = true
  }
  await all
  into.seconds += elapsedS
}

// ------------------------------------------------------------------ report

interface Row {
  readonly clients: number
  readonly mpcache: Result
  readonly echo: Result
}

const table = (rows: readonly Row[]): string => {
  const int = (n: number): string => Math.round(n).toLocaleString("en-US")
  const ratio = (n: number): string => n.toFixed(2)
  const lines = [
    "| clients | mpcache req/s | echo req/s | req/s ratio | mpcache p50 µs | echo p50 µs | mpcache p99 µs | echo p99 µs | p99 ratio |",
    "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
  ]
  for (const { clients, mpcache: m, echo: e } of rows) {
    lines.push(
      `| ${clients} | ${int(m.rps)} | ${int(e.rps)} | ${ratio(m.rps / e.rps)} | ${int(m.p50Us)} | ${int(e.p50Us)} | ${int(m.p99Us)} | ${int(e.p99Us)} | ${ratio(m.p99Us / e.p99Us)} |`
    )
  }
  return lines.join("\n")
}

const section = (rows: readonly Row[]): string => {
  const cpus = os.cpus()
  return [
    HEADING,
    "",
    `Measured ${new Date().toISOString().slice(0, 10)} · Node ${process.version} · ` +
    `${cpus[0]?.model.trim() ?? "unknown CPU"} (${cpus.length} cores) · transport ipc · ` +
    `${durationS} s measured per server and configuration, in ${rounds} rounds that alternate the two servers ` +
    `(each round after a ${WARMUP_S} s warm-up); percentiles over all the rounds' round trips.`,
    "",
    "Each client is a raw zeromq.js DEALER keeping exactly one PING (op 22, nil instance id) in flight.",
    "*mpcache* is `mpcache serve` with default pools; *echo* is a bare zeromq.js ROUTER that",
    "sends every message back undecoded (`bench/echo-router.ts`), the ceiling of this stack. Each server",
    "runs in its own child process. Latencies are round trips in microseconds;",
    "req/s ratio = mpcache / echo (1.00 = as fast as the echo), p99 ratio = mpcache / echo (1.00 = no added tail).",
    "All clients share the bench's one event loop: on a machine with few cores the client side, not the server,",
    "can be what saturates first, which the echo column shows.",
    "",
    table(rows),
    "",
    "Reproduce: `npm run bench:ping` (`-- --full` for 12 s in 6 rounds; `-- --duration S --rounds R` for S seconds in R rounds).",
    ""
  ].join("\n")
}

/** The two PING targets: req/s at 16 clients ≥ 0.6 × the echo, p99 at 1 client ≤ 2 × the echo. */
const summaryRows = (rows: ReadonlyArray<Row>): Array<SummaryRow> => {
  const int = (n: number): string => Math.round(n).toLocaleString("en-US")
  const out: Array<SummaryRow> = []
  const at16 = rows.find((r) => r.clients === 16)
  if (at16 !== undefined) {
    const ratio = at16.mpcache.rps / at16.echo.rps
    out.push({
      bench: "ping",
      figure: "PING round trips/s, 16 clients",
      measured: `${int(at16.mpcache.rps)} /s`,
      reference: `echo ${int(at16.echo.rps)} /s`,
      ratio,
      target: "≥ 0.6 × echo",
      met: ratio >= 0.6
    })
  }
  const at1 = rows.find((r) => r.clients === 1)
  if (at1 !== undefined) {
    const ratio = at1.mpcache.p99Us / at1.echo.p99Us
    out.push({
      bench: "ping",
      figure: "PING p99, 1 client",
      measured: `${int(at1.mpcache.p99Us)} µs`,
      reference: `echo ${int(at1.echo.p99Us)} µs`,
      ratio,
      target: "≤ 2 × echo",
      met: ratio <= 2
    })
  }
  return out
}

/** Replaces this bench's section of docs/benchmarks.md, keeping the others. */
const writeDoc = (body: string): void => writeDocSection(HEADING, body)

// -------------------------------------------------------------------- main

const main = async (): Promise<void> => {
  const mpcacheEndpoint = ipcEndpoint("mpcache")
  const echoEndpoint = ipcEndpoint("echo")
  const [mpcache, echo] = await Promise.all([
    startServer(
      "mpcache",
      mpcacheEndpoint,
      ["src/cli/main.ts", "serve", "--endpoint", mpcacheEndpoint, "--http-port", "0", "--log-format", "json", "--no-l1-prefault"],
      "MQ server listening on"
    ),
    startServer("echo", echoEndpoint, ["bench/echo-router.ts", echoEndpoint], "echo router listening on")
  ])
  process.stderr.write(`servers up (${mpcache.endpoint}, ${echo.endpoint}); ${durationS} s per configuration\n`)

  const rows: Row[] = []
  for (const clients of CONCURRENCY) {
    // Alternate the servers round by round (and which goes first) so that a drift in machine load hits both alike.
    const pooledMpcache: Pooled = { latenciesUs: [], seconds: 0 }
    const pooledEcho: Pooled = { latenciesUs: [], seconds: 0 }
    for (let r = 0; r < rounds; r++) {
      const echoRound = () => measure(echo, clients, null, durationS / rounds, pooledEcho)
      const mpcacheRound = () => measure(mpcache, clients, true, durationS / rounds, pooledMpcache)
      if (r % 2 === 0) await echoRound().then(mpcacheRound)
      else await mpcacheRound().then(echoRound)
    }
    rows.push({ clients, mpcache: result(pooledMpcache), echo: result(pooledEcho) })
    process.stderr.write(`  ${clients} client(s) done\n`)
  }
  writeSummary(args.summary, summaryRows(rows))

  const body = section(rows)
  process.stdout.write(`\n${body}\n`)
  writeDoc(body)
  process.stdout.write(`wrote ${path.relative(ROOT, DOC)}\n`)
}

try {
  await main()
  await cleanup()
} catch (error) {
  process.stderr.write(`bench:ping failed: ${error instanceof Error ? error.stack ?? error.message : String(error)}\n`)
  await cleanup()
  process.exit(1)
}
