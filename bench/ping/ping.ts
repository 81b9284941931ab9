/**
 * `npm run bench:ping [-- --quick | --full] [-- --duration S --rounds R] [-- --summary FILE] [-- --curve] [-- --only startup]`
 *
 * PING round trips per second and p50/p99 latency with 1, 4 and 16
 * concurrent clients, against (a) the real mpcache server and (b) a bare
 * zeromq.js ROUTER that echoes every message (bench/lib/echo-router.ts), both in
 * child processes, in the same run; for PING [nil] (a scheduler's probe) and
 * PING [id] naming the instance of a registered worker (bench/ping/worker.ts,
 * a real KV cache registered through the WorkerAdapter; issue 25 item 4). The same raw DEALER client code drives
 * both, so the only difference is the server. The two servers alternate
 * round by round, so a change in the machine's load hits both alike. Prints
 * a table; `--write-docs` rewrites the section "## PING round trips
 * (bench:ping)" of docs/benchmarks.md; `--summary FILE` writes the target rows
 * as JSON for bench/suite.ts; `--check` exits 1 when a target was missed.
 *
 * `--curve` (issue 14): instead of the echo, the reference is the same
 * mpcache server with CURVE off, and the subject mpcache with CURVE on
 * (per-run keys; each client speaks CURVE and binds its connection with
 * HELLO before it is timed), both in the same run, alternating the same way;
 * writes "## PING with CURVE (bench:ping --curve)". Target: CURVE costs
 * under 15 % of the round trips per second at 16 clients.
 *
 * Then, in the same run (issue 16): the bytes the server allocates per PING
 * over 100k PINGs from 16 clients (bench/ping/alloc-probe.ts preloaded; the bare
 * echo measured the same way is the floor), and spawn → first reply of
 * `mpcache serve` (npm start's bundled entry, and from source) beside a
 * plain `node -e` that binds a zeromq.js ROUTER (bench/ping/startup.ts),
 * alternately. The round trips are measured against the bundled entry
 * (scripts/bundle-serve.mjs, rebuilt first when stale), as `npm start` runs
 * it; the allocation window against `src/cli/main.ts serve` (the same code,
 * with readable sites).
 *
 * `--flood` (issue 27 item 1): one peer flooding PINGs and reading none, then eight, beside a fresh client and a
 * worker's heartbeat: their timeouts and p99 against no flood, in the same run (bench/ping/flood.ts); writes
 * "## PING under a flood (bench:ping --flood)".
 *
 * `--only startup`: only the spawn → first reply part, printed (the doc and
 * the summary are left as they are: they hold the whole run's figures).
 *
 * A benchmark, never a test: exits 0 on success, 1 on failure, and always
 * stops its child processes and removes its ipc socket files (and keys).
 */
import type { ChildProcess } from "node:child_process"
import { mkdtempSync, rmSync, writeFileSync } from "node:fs"
import os from "node:os"
import path from "node:path"
import { newKeyPair } from "../../src/services/auth/Curve.ts"
import type { DealerCurve } from "../../src/services/zmq/Sockets.ts"
import { bundleServe, LAUNCHER } from "../../scripts/bundle-serve.mjs"
import { type InstanceId, makeInstanceId } from "../../src/schema/InstanceId.ts"
import { Ping } from "../../src/schema/Op.ts"
import { ALLOC_PROBE_ARGV, measureAllocation, type AllocWindow } from "./allocWindow.ts"
import { parseBenchArgs, positiveSeconds, usageError } from "../lib/args.ts"
import { isRunning, spawnReady, startLineChild, stopChild } from "../lib/children.ts"
import { int } from "../lib/format.ts"
import { measuredDate, nodeAndCpu } from "../lib/machine.ts"
import { pingLoop, type PingRun, type Responder } from "../lib/pingClient.ts"
import { finishBench } from "../lib/outcome.ts"
import { makeResources, runBench } from "../lib/resources.ts"
import { runFlood } from "./flood.ts"
import { PLAIN_ECHO_SCRIPT, spawnToFirstReply } from "./startup.ts"
import { median, summarizeUs } from "../lib/stats.ts"
import type { SummaryRow } from "../lib/summary.ts"
import { secondsSince, sleep } from "../lib/time.ts"
import { SERVE_FLAGS } from "./serveFlags.ts"

const HEADING = "## PING round trips (bench:ping)"
const CURVE_HEADING = "## PING with CURVE (bench:ping --curve)"
/** The CURVE target: round trips/s with CURVE ≥ 0.85 × without, at 16 clients. */
const CURVE_TARGET = 0.85
const CONCURRENCY = [1, 4, 16] as const
const WARMUP_S = 0.5
const READY_TIMEOUT_MS = 30_000
const STOP_TIMEOUT_MS = 5_000
/** PINGs of the allocation window (issue 16: "over 100k PINGs"), and its clients. */
const ALLOC_PINGS = 100_000
const ALLOC_CLIENTS = 16
/** `npm start`'s entry (scripts/bundle-serve.mjs): `node SERVE_ENTRY [flags]` is `mpcache serve [flags]`. */
const SERVE_ENTRY = LAUNCHER

// ---------------------------------------------------------------- arguments

const args = parseBenchArgs({
  duration: { type: "string" },
  rounds: { type: "string" },
  curve: { type: "boolean" },
  flood: { type: "boolean" },
  only: { type: "string" }
})
if (args.only !== undefined && args.only !== "startup") usageError(`--only takes "startup", got ${args.only}`)
/** Seconds measured per server and configuration, over all rounds. */
const durationS = args.duration !== undefined ? positiveSeconds("--duration", args.duration) : args.full ? 12 : 4
const rounds = args.rounds !== undefined ? Number(args.rounds) : args.flood === true ? (args.full ? 10 : args.quick ? 2 : 5) : args.full ? 6 : 4
if (!Number.isInteger(rounds) || rounds < 1) usageError(`--rounds must be a positive integer, got ${args.rounds}`)
/** Spawns per server in the start-up part. */
const startups = args.full ? 10 : 5

// ------------------------------------------------------- child processes

interface Server {
  readonly name: string
  readonly endpoint: string
  readonly responder: Responder
  readonly child: ChildProcess
  /** The clients' CURVE keys when the server speaks CURVE. */
  readonly curve?: DealerCurve
}

const resources = makeResources(`mpcache-bench-${process.pid}-${Date.now()}`, { stopTimeoutMs: STOP_TIMEOUT_MS, onSignal: "stop" })

/** Spawns `node ...argv` and resolves once its stdout or stderr shows `ready`. */
const startServer = async (
  responder: Responder,
  endpoint: string,
  argv: ReadonlyArray<string>,
  ready: string,
  options: { readonly name?: string; readonly curve?: DealerCurve } = {}
): Promise<Server> => {
  const name = options.name ?? responder
  const child = await spawnReady(`${name} server`, argv, ready, READY_TIMEOUT_MS, resources.children)
  return { name, endpoint, responder, child, ...(options.curve === undefined ? {} : { curve: options.curve }) }
}

/** `mpcache serve` on `endpoint` (npm start's bundled entry) with the bench's settings and `extra` flags. */
const mpcacheArgv = (endpoint: string, extra: ReadonlyArray<string> = []) => [SERVE_ENTRY, ...SERVE_FLAGS(endpoint), ...extra]

/** Per-run CURVE keys in a private folder (removed on cleanup): the server's flags and one client's keys. */
const curveKeys = (): { readonly serverFlags: ReadonlyArray<string>; readonly client: DealerCurve } => {
  const dir = mkdtempSync(path.join(os.tmpdir(), `${resources.tag}-keys-`))
  resources.onCleanup(() => rmSync(dir, { recursive: true, force: true }))
  const server = newKeyPair()
  const client = newKeyPair()
  const secretFile = path.join(dir, "server.key")
  const authorized = path.join(dir, "authorized_keys")
  writeFileSync(secretFile, `${server.secretKey}\n`, { mode: 0o600 })
  writeFileSync(authorized, `${client.publicKey} bench admin\n`, { mode: 0o600 })
  return {
    serverFlags: ["--curve-secret-key-file", secretFile, "--curve-authorized-keys", authorized],
    client: { serverPublicKey: server.publicKey, secretKey: client.secretKey, publicKey: client.publicKey }
  }
}

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

/** What the PINGs carry: nil, or the id of the registered worker's instance. */
interface Form {
  readonly name: string
  readonly instanceId: InstanceId | null
}
const NIL_FORM: Form = { name: "[nil]", instanceId: null }

/** One round: `clients` clients sending PING `form` for WARMUP_S, then `seconds` measured into `into`. */
const measure = async (server: Server, form: Form, clients: number, seconds: number, into: Pooled): Promise<void> => {
  const run: PingRun = { measuring: false, stopped: false, latenciesUs: into.latenciesUs }
  const client = () => pingLoop(server.endpoint, run, server.responder, server.curve, form.instanceId)
  const all = Promise.all(Array.from({ length: clients }, client)).catch(
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
  readonly form: string
  readonly clients: number
  readonly mpcache: Result
  readonly echo: Result
}

const table = (rows: readonly Row[]): string => {
  const ratio = (n: number): string => n.toFixed(2)
  const lines = [
    "| PING | clients | mpcache req/s | echo req/s | req/s ratio | mpcache p50 µs | echo p50 µs | mpcache p99 µs | echo p99 µs | p99 ratio |",
    "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
  ]
  for (const { form, clients, mpcache: m, echo: e } of rows) {
    lines.push(
      `| ${form} | ${clients} | ${int(m.rps)} | ${int(e.rps)} | ${ratio(m.rps / e.rps)} | ${int(m.p50Us)} | ${int(e.p50Us)} | ${int(m.p99Us)} | ${int(e.p99Us)} | ${ratio(m.p99Us / e.p99Us)} |`
    )
  }
  return lines.join("\n")
}

/** The first line of both sections: when, where, and how long each server was measured. */
const measuredLine = (): string =>
  `Measured ${measuredDate()} · ${nodeAndCpu()} · transport ipc · ` +
  `${durationS} s measured per server and configuration, in ${rounds} rounds that alternate the two servers ` +
  `(each round after a ${WARMUP_S} s warm-up); percentiles over all the rounds' round trips.`

const section = (rows: readonly Row[], more: string): string =>
  [
    HEADING,
    "",
    measuredLine(),
    "",
    `Each client is a raw zeromq.js DEALER keeping exactly one PING (op ${Ping.id}) in flight: *[nil]* a scheduler's probe,`,
    "*[id]* naming the instance of a worker registered for the run (bench/ping/worker.ts: a real KV cache registered",
    "through the WorkerAdapter); each client's first named PING binds its connection to the instance (pooled path), the",
    "rest take the fast path (src/services/server/internal/FastPath.ts, \"The PING path\").",
    "*mpcache* is `mpcache serve` (npm start's bundled entry) with default pools; *echo* is a bare zeromq.js ROUTER that",
    "sends every message back undecoded (`bench/lib/echo-router.ts`), the ceiling of this stack. Each server",
    "runs in its own child process. Latencies are round trips in microseconds;",
    "req/s ratio = mpcache / echo (1.00 = as fast as the echo), p99 ratio = mpcache / echo (1.00 = no added tail).",
    "All clients share the bench's one event loop: on a machine with few cores the client side, not the server,",
    "can be what saturates first, which the echo column shows.",
    "",
    table(rows),
    "",
    more,
    "Reproduce: `npm run bench:ping` (`-- --full` for 12 s in 6 rounds; `-- --duration S --rounds R` for S seconds in R rounds).",
    ""
  ].join("\n")

/** Spawn → first reply, ms, of each server (medians over `startups` spawns each, alternating). */
interface Startup {
  readonly bundled: ReadonlyArray<number>
  readonly source: ReadonlyArray<number>
  readonly plain: ReadonlyArray<number>
}

const allocSection = (m: AllocWindow, e: AllocWindow): string =>
  [
    "### Bytes allocated per PING",
    "",
    `${int(m.pings)} PINGs [nil] from ${ALLOC_CLIENTS} clients, counted on the server by bench/ping/alloc-probe.ts: the heap statistics`,
    "deltas (what every GC freed plus the used heap's growth, `v8.GCProfiler`) and V8's allocation sampling",
    "(keeping collected objects) over the same window. The bare echo, measured the same way, is the floor of",
    "this stack: zeromq.js allocates the received frames, the message array and the promises of `receive` and `send`.",
    "",
    "| server | bytes per round trip (heap deltas) | (sampling) | GCs in the window |",
    "|---|---:|---:|---:|",
    `| mpcache | ${int(m.gcBytesPerPing)} | ${int(m.sampledBytesPerPing)} | ${m.gcs} |`,
    `| echo | ${int(e.gcBytesPerPing)} | ${int(e.sampledBytesPerPing)} | ${e.gcs} |`,
    "",
    "mpcache's top allocation sites in the window, bytes per PING:",
    "",
    "| site | bytes per PING | share |",
    "|---|---:|---:|",
    ...m.top.slice(0, 8).map((t) => `| \`${t.site}\` | ${int(t.amount / m.pings)} | ${(t.share * 100).toFixed(1)} % |`),
    ""
  ].join("\n")

const ms = (xs: ReadonlyArray<number>): string => `${int(median(xs))} ms`

const startupSection = (st: Startup): string =>
  [
    "### Spawn → first reply",
    "",
    `Time from \`spawn()\` to the reply of a PING queued before the spawn on a DEALER that retries its connection every`,
    `millisecond (bench/ping/startup.ts), median of ${st.plain.length} spawns each, the three alternating. *plain node*: \`node -e\``,
    "binding a zeromq.js ROUTER that echoes, the floor (Node's own start plus loading zeromq). *bundled*: `npm start`'s",
    "entry (build/cli/bin/serve.mjs, scripts/bundle-serve.mjs). *source*: `node src/cli/main.ts serve`.",
    "",
    "| server | median | min | max | ÷ plain node |",
    "|---|---:|---:|---:|---:|",
    ...([["mpcache serve, bundled", st.bundled], ["mpcache serve, from source", st.source], ["plain node + zeromq", st.plain]] as const).map(
      ([name, xs]) =>
        `| ${name} | ${ms(xs)} | ${int(Math.min(...xs))} ms | ${int(Math.max(...xs))} ms | ${(median(xs) / median(st.plain)).toFixed(2)} |`
    ),
    ""
  ].join("\n")

/** The targets (issue 16): req/s at 4 and 16 clients, p99 at 1, 4 and 16, bytes per PING, start-up. */
const summaryRows = (all: ReadonlyArray<Row>, alloc: { readonly m: AllocWindow; readonly e: AllocWindow }, st: Startup): Array<SummaryRow> => {
  const out: Array<SummaryRow> = []
  const rows = all.filter((r) => r.form === NIL_FORM.name)
  for (const r of rows.filter((r) => r.clients === 4 || r.clients === 16)) {
    const ratio = r.mpcache.rps / r.echo.rps
    out.push({
      bench: "ping",
      figure: `PING round trips/s, ${r.clients} clients`,
      measured: `${int(r.mpcache.rps)} /s`,
      reference: `echo ${int(r.echo.rps)} /s`,
      ratio,
      target: "≥ 0.9 × echo",
      met: ratio >= 0.9
    })
  }
  for (const r of rows) {
    const ratio = r.mpcache.p99Us / r.echo.p99Us
    out.push({
      bench: "ping",
      figure: `PING p99, ${r.clients} client${r.clients === 1 ? "" : "s"}`,
      measured: `${int(r.mpcache.p99Us)} µs`,
      reference: `echo ${int(r.echo.p99Us)} µs`,
      ratio,
      target: "≤ 1.3 × echo",
      met: ratio <= 1.3
    })
  }
  // Named PINGs (issue 25 item 4): reported beside the nil ones, against the echo of the same PINGs.
  for (const r of all.filter((r) => r.form !== NIL_FORM.name && r.clients === 16)) {
    out.push({
      bench: "ping",
      figure: `PING ${r.form} round trips/s, ${r.clients} clients`,
      measured: `${int(r.mpcache.rps)} /s`,
      reference: `echo ${int(r.echo.rps)} /s`,
      ratio: r.mpcache.rps / r.echo.rps,
      target: "reported",
      met: null
    })
  }
  out.push({
    bench: "ping",
    figure: `bytes allocated per PING on the server (${int(alloc.m.pings)} PINGs)`,
    measured: `${int(alloc.m.gcBytesPerPing)} B`,
    reference: `bare echo ${int(alloc.e.gcBytesPerPing)} B per round trip`,
    ratio: alloc.m.gcBytesPerPing / alloc.e.gcBytesPerPing,
    target: "≤ 1 KB",
    met: alloc.m.gcBytesPerPing <= 1024
  })
  const startRatio = median(st.bundled) / median(st.plain)
  out.push({
    bench: "ping",
    figure: "spawn → first reply (npm start's entry)",
    measured: ms(st.bundled),
    reference: `plain node + zeromq ${ms(st.plain)}`,
    ratio: startRatio,
    target: "≤ 0.5 s and ≤ 0.3 × plain node",
    met: median(st.bundled) <= 500 && startRatio <= 0.3
  })
  return out
}

// ------------------------------------------------------------- CURVE report

interface CurveRow {
  readonly clients: number
  readonly on: Result
  readonly off: Result
}

const curveTable = (rows: ReadonlyArray<CurveRow>): string => {
  const ratio = (n: number): string => n.toFixed(2)
  const lines = [
    "| clients | CURVE off req/s | CURVE on req/s | req/s ratio (on / off) | cost | off p50 µs | on p50 µs | off p99 µs | on p99 µs |",
    "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
  ]
  for (const { clients, on, off } of rows) {
    lines.push(
      `| ${clients} | ${int(off.rps)} | ${int(on.rps)} | ${ratio(on.rps / off.rps)} | ${((1 - on.rps / off.rps) * 100).toFixed(1)} % | ` +
        `${int(off.p50Us)} | ${int(on.p50Us)} | ${int(off.p99Us)} | ${int(on.p99Us)} |`
    )
  }
  return lines.join("\n")
}

const curveSection = (rows: ReadonlyArray<CurveRow>): string =>
  [
    CURVE_HEADING,
    "",
    measuredLine(),
    "",
    "Two `mpcache serve` processes in the same run: one with CURVE off, one with CURVE on (per-run keys,",
    "`--curve-secret-key-file`, `--curve-authorized-keys`; the ZAP handler and the tenant guard on every request).",
    `Each client is a raw zeromq.js DEALER keeping exactly one PING (op ${Ping.id}, nil instance id) in flight; with CURVE`,
    "it speaks CURVE and binds its connection with HELLO before it is timed. cost = 1 − on / off in round trips per second.",
    `Target (issue 14): CURVE costs under ${((1 - CURVE_TARGET) * 100).toFixed(0)} % at 16 clients.`,
    "",
    curveTable(rows),
    "",
    "Reproduce: `npm run bench:ping -- --curve` (`-- --full` and `-- --duration S --rounds R` as above).",
    ""
  ].join("\n")

const curveSummaryRows = (rows: ReadonlyArray<CurveRow>): Array<SummaryRow> => {
  const at16 = rows.find((r) => r.clients === 16)
  if (at16 === undefined) return []
  const ratio = at16.on.rps / at16.off.rps
  return [{
    bench: "ping",
    figure: "PING round trips/s with CURVE, 16 clients",
    measured: `${int(at16.on.rps)} /s`,
    reference: `CURVE off ${int(at16.off.rps)} /s`,
    ratio,
    target: `≥ ${CURVE_TARGET} × CURVE off`,
    met: ratio >= CURVE_TARGET
  }]
}

// -------------------------------------------------------------------- main

/** Bytes per PING of mpcache and per round trip of the echo, each a fresh server with the probe preloaded. */
const measureAllocations = async (): Promise<{ readonly m: AllocWindow; readonly e: AllocWindow }> => {
  const run = async (responder: Responder, argv: ReadonlyArray<string>, ready: RegExp, endpoint: string): Promise<AllocWindow> => {
    const child = startLineChild(`${responder} (allocation probe)`, [...ALLOC_PROBE_ARGV, ...argv], resources.children)
    try {
      await child.waitFor(ready, READY_TIMEOUT_MS)
      return await measureAllocation(child, endpoint, ALLOC_CLIENTS, ALLOC_PINGS, responder)
    } finally {
      await stopChild(child.process, STOP_TIMEOUT_MS)
    }
  }
  const mEndpoint = resources.ipcEndpoint("alloc-mpcache")
  const eEndpoint = resources.ipcEndpoint("alloc-echo")
  // From source, so that the sites read as src/ names (the bundle runs the same code, minified).
  const m = await run("mpcache", ["src/cli/main.ts", "serve", ...SERVE_FLAGS(mEndpoint)], /MQ server listening on/, mEndpoint)
  const e = await run("echo", ["bench/lib/echo-router.ts", eEndpoint], /echo router listening on/, eEndpoint)
  return { m, e }
}

/** `startups` spawns of each server, alternating (default flags but the endpoint and an ephemeral HTTP port). */
const measureStartups = async (): Promise<Startup> => {
  const st = { bundled: [] as Array<number>, source: [] as Array<number>, plain: [] as Array<number> }
  for (let i = 0; i < startups; i++) {
    const b = resources.ipcEndpoint(`start-b${i}`)
    const s = resources.ipcEndpoint(`start-s${i}`)
    const p = resources.ipcEndpoint(`start-p${i}`)
    const serveFlags = (endpoint: string) => ["--endpoint", endpoint, "--http-port", "0"]
    st.plain.push(await spawnToFirstReply(["-e", PLAIN_ECHO_SCRIPT, p], p, "echo", resources.children))
    st.bundled.push(await spawnToFirstReply([SERVE_ENTRY, ...serveFlags(b)], b, "mpcache", resources.children))
    st.source.push(await spawnToFirstReply(["src/cli/main.ts", "serve", ...serveFlags(s)], s, "mpcache", resources.children))
  }
  return st
}

/**
 * `subject` against `reference` at each concurrency: the servers alternate round by round (and which goes
 * first), so that a drift in machine load hits both alike.
 */
const compare = async (subject: Server, reference: Server, forms: ReadonlyArray<Form> = [NIL_FORM]) => {
  process.stderr.write(`servers up (${subject.endpoint}, ${reference.endpoint}); ${durationS} s per configuration\n`)
  const rows: Array<{ readonly form: string; readonly clients: number; readonly subject: Result; readonly reference: Result }> = []
  for (const form of forms) {
    for (const clients of CONCURRENCY) {
      const pooledSubject: Pooled = { latenciesUs: [], seconds: 0 }
      const pooledReference: Pooled = { latenciesUs: [], seconds: 0 }
      for (let r = 0; r < rounds; r++) {
        const referenceRound = () => measure(reference, form, clients, durationS / rounds, pooledReference)
        const subjectRound = () => measure(subject, form, clients, durationS / rounds, pooledSubject)
        if (r % 2 === 0) await referenceRound().then(subjectRound)
        else await subjectRound().then(referenceRound)
      }
      rows.push({ form: form.name, clients, subject: result(pooledSubject), reference: result(pooledReference) })
      process.stderr.write(`  PING ${form.name}, ${clients} client(s) done\n`)
    }
  }
  return rows
}

/** Starts the worker the named PINGs name (bench/ping/worker.ts) against `endpoint`; resolves with its instance id once registered. */
const startWorker = async (endpoint: string): Promise<{ readonly instanceId: InstanceId; readonly child: ChildProcess }> => {
  const worker = startLineChild("worker", ["bench/ping/worker.ts", endpoint], resources.children, { stdin: true })
  const m = await worker.waitFor(/"registered":"(\d+)"/, READY_TIMEOUT_MS, "stdout")
  return { instanceId: makeInstanceId(BigInt(m[1]!)), child: worker.process }
}

const report = (heading: string, body: string, rows: Array<SummaryRow>): void => {
  process.exitCode = finishBench(args, { heading, body, rows })
}

const main = async (): Promise<void> => {
  process.stderr.write(`bundle-serve: ${await bundleServe()}\n`)
  if (args.only === "startup") {
    process.stdout.write(`\n${startupSection(await measureStartups())}\n`)
    return
  }
  if (args.flood === true) return runFlood(resources, rounds, args)
  const mpcacheEndpoint = resources.ipcEndpoint("mpcache")
  if (args.curve === true) {
    const keys = curveKeys()
    const curveEndpoint = resources.ipcEndpoint("mpcache-curve")
    const [on, off] = await Promise.all([
      startServer("mpcache", curveEndpoint, mpcacheArgv(curveEndpoint, keys.serverFlags), "MQ server listening on", {
        name: "mpcache (CURVE on)",
        curve: keys.client
      }),
      startServer("mpcache", mpcacheEndpoint, mpcacheArgv(mpcacheEndpoint), "MQ server listening on", { name: "mpcache (CURVE off)" })
    ])
    const rows = (await compare(on, off)).map((r) => ({ clients: r.clients, on: r.subject, off: r.reference }))
    return report(CURVE_HEADING, curveSection(rows), curveSummaryRows(rows))
  }
  const echoEndpoint = resources.ipcEndpoint("echo")
  const [mpcache, echo] = await Promise.all([
    startServer("mpcache", mpcacheEndpoint, mpcacheArgv(mpcacheEndpoint), "MQ server listening on"),
    startServer("echo", echoEndpoint, ["bench/lib/echo-router.ts", echoEndpoint], "echo router listening on")
  ])
  const worker = await startWorker(mpcacheEndpoint)
  const named: Form = { name: "[id]", instanceId: worker.instanceId }
  const rows = (await compare(mpcache, echo, [NIL_FORM, named])).map((r) => ({
    form: r.form,
    clients: r.clients,
    mpcache: r.subject,
    echo: r.reference
  }))
  // The worker first (it unregisters), then the servers.
  await stopChild(worker.child, STOP_TIMEOUT_MS)
  await Promise.all([mpcache.child, echo.child].map((child) => stopChild(child, STOP_TIMEOUT_MS)))
  const alloc = await measureAllocations()
  process.stderr.write(`  allocation: ${int(alloc.m.gcBytesPerPing)} B per PING (echo ${int(alloc.e.gcBytesPerPing)} B)\n`)
  const st = await measureStartups()
  process.stderr.write(`  start-up: bundled ${ms(st.bundled)}, source ${ms(st.source)}, plain node ${ms(st.plain)}\n`)
  report(HEADING, section(rows, `${allocSection(alloc.m, alloc.e)}\n${startupSection(st)}`), summaryRows(rows, alloc, st))
}

await runBench("bench:ping", main, resources)
