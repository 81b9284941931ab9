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
import { Ping } from "../src/schema/Op.ts"
import { parseBenchArgs, positiveSeconds, usageError } from "./lib/args.ts"
import { isRunning, spawnReady } from "./lib/children.ts"
import { int } from "./lib/format.ts"
import { measuredDate, nodeAndCpu } from "./lib/machine.ts"
import { pingLoop, type PingRun, type Responder } from "./lib/pingClient.ts"
import { DOC_NAME, writeDocSection } from "./lib/report.ts"
import { makeResources, runBench } from "./lib/resources.ts"
import { summarizeUs } from "./lib/stats.ts"
import { writeSummary, type SummaryRow } from "./lib/summary.ts"
import { secondsSince, sleep } from "./lib/time.ts"

const HEADING = "## PING round trips (bench:ping)"
const CONCURRENCY = [1, 4, 16] as const
const WARMUP_S = 0.5
const READY_TIMEOUT_MS = 30_000
const STOP_TIMEOUT_MS = 5_000

// ---------------------------------------------------------------- arguments

const args = parseBenchArgs({ duration: { type: "string" }, rounds: { type: "string" } })
/** Seconds measured per server and configuration, over all rounds. */
const durationS = args.duration !== undefined ? positiveSeconds("--duration", args.duration) : args.full ? 12 : 4
const rounds = args.rounds !== undefined ? Number(args.rounds) : args.full ? 6 : 4
if (!Number.isInteger(rounds) || rounds < 1) usageError(`--rounds must be a positive integer, got ${args.rounds}`)

// ------------------------------------------------------- child processes

interface Server {
  readonly name: string
  readonly endpoint: string
  readonly responder: Responder
  readonly child: ChildProcess
}

const resources = makeResources(`mpcache-bench-${process.pid}-${Date.now()}`, { stopTimeoutMs: STOP_TIMEOUT_MS, onSignal: "stop" })

/** Spawns `node ...argv` and resolves once its stdout or stderr shows `ready`. */
const startServer = async (responder: Responder, endpoint: string, argv: ReadonlyArray<string>, ready: string): Promise<Server> => ({
  name: responder,
  endpoint,
  responder,
  child: await spawnReady(`${responder} server`, argv, ready, READY_TIMEOUT_MS, resources.children)
})

// ------------------------------------------------------------------ client

interface Result {
  readonly rps: number
  readonly p50Us: number
  readonly p99Us: number
}

/** Samples and seconds of the rounds so far of one server and configuration. */
interface Pooled {
  readonly latenciesUs: Array<number>
  seconds: number
}

const result = (p: Pooled): Result => {
  const { samples, p50Us, p99Us } = summarizeUs(p.latenciesUs)
  return { rps: samples / p.seconds, p50Us, p99Us }
}

/** One round: `clients` clients for WARMUP_S, then `seconds` measured into `into`. */
const measure = async (server: Server, clients: number, seconds: number, into: Pooled): Promise<void> => {
  const run: PingRun = { measuring: false, stopped: false, latenciesUs: into.latenciesUs }
  const all = Promise.all(Array.from({ length: clients }, () => pingLoop(server.endpoint, run, server.responder))).catch(
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
    await sleep(WARMUP_S * 1000)
    run.measuring = true
    const t0 = process.hrtime.bigint()
    await sleep(seconds * 1000)
    run.measuring = false
    return secondsSince(t0)
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

const section = (rows: readonly Row[]): string =>
  [
    HEADING,
    "",
    `Measured ${measuredDate()} · ${nodeAndCpu()} · transport ipc · ` +
    `${durationS} s measured per server and configuration, in ${rounds} rounds that alternate the two servers ` +
    `(each round after a ${WARMUP_S} s warm-up); percentiles over all the rounds' round trips.`,
    "",
    `Each client is a raw zeromq.js DEALER keeping exactly one PING (op ${Ping.id}, nil instance id) in flight.`,
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

/** The two PING targets: req/s at 16 clients ≥ 0.6 × the echo, p99 at 1 client ≤ 2 × the echo. */
const summaryRows = (rows: ReadonlyArray<Row>): Array<SummaryRow> => {
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

// -------------------------------------------------------------------- main

const main = async (): Promise<void> => {
  const mpcacheEndpoint = resources.ipcEndpoint("mpcache")
  const echoEndpoint = resources.ipcEndpoint("echo")
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
      const echoRound = () => measure(echo, clients, durationS / rounds, pooledEcho)
      const mpcacheRound = () => measure(mpcache, clients, durationS / rounds, pooledMpcache)
      if (r % 2 === 0) await echoRound().then(mpcacheRound)
      else await mpcacheRound().then(echoRound)
    }
    rows.push({ clients, mpcache: result(pooledMpcache), echo: result(pooledEcho) })
    process.stderr.write(`  ${clients} client(s) done\n`)
  }
  writeSummary(args.summary, summaryRows(rows))

  const body = section(rows)
  process.stdout.write(`\n${body}\n`)
  writeDocSection(HEADING, body)
  process.stdout.write(`wrote ${DOC_NAME}\n`)
}

await runBench("bench:ping", main, resources)
