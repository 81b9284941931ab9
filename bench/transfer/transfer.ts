/**
 * `npm run bench:transfer [-- --quick | --full | --duration S] [-- --server-prof DIR] [-- --summary FILE]`
 * (MPCACHE_BENCH_SERVER_NODE_OPTIONS: more node options for the server, bench/lib/serverNodeOptions.ts)
 *
 * STORE and RETRIEVE throughput of the LMCache-driven data path (DESIGN §4)
 * for 256-token chunks of a 32-layer, 8 heads × 128 head size, float16 model
 * with 16-token engine blocks (one chunk of one rank = 2 × 32 × 256 × 1024 ×
 * 2 B = 32 MiB, 16 blocks per chunk), beside a plain single-thread memcpy of
 * the same bytes measured in the same process and run; and PING p99 latency
 * while the transfers run flat out against PING p99 idle, because bulk copies
 * must run off the server's JS thread and never delay PING.
 *
 * - Server: `mpcache serve` in a child process (ipc endpoint, HTTP port 0,
 *   `--l1-size-gb 4`, `--chunk-size 256`, JSON logs on stderr), with
 *   bench/transfer/loop-delay.ts preloaded to report its event-loop delay per window.
 * - Worker: in this process. A PagedKvCache in POSIX shm (one segment per
 *   layer, 257 blocks: block 0 is vLLM's null block and stays unused),
 *   registered through the WorkerAdapter, every block filled once with
 *   non-zero bytes. Block ids are a fixed shuffle (an engine's block table
 *   after some churn), so every 32 KiB block is its own copy range.
 * - STORE: 2 streams, each with one STORE of 4 chunks (1,024 tokens, 128 MiB)
 *   in flight from its own 64 source blocks; fresh token ids every request,
 *   so every chunk is copied into a new L1 object (and, once L1 is full, LRU
 *   objects are evicted).
 * - RETRIEVE: 8 requests of 4 chunks (1 GiB) stored once, then 2 streams each
 *   loop LOOKUP (scheduler adapter) → RETRIEVE into its own 64 destination
 *   blocks → END_SESSION over that set. One RETRIEVE is checked byte for byte
 *   against the source blocks afterwards.
 * - memcpy: `Uint8Array.prototype.set` of a 32 MiB buffer into another, one
 *   thread, warmed up, as many copies as the phase moved chunks, right after
 *   each phase.
 * - Descriptor kinds: every phase runs once per entry of KINDS (cpu_shm, and
 *   cpu_memfd of issue 13 item 2), each with a worker (and instance) of its
 *   own, after a CLEAR.
 * - The fault guard's cost (issue 13, target under 5 %): one chunk's copy job
 *   of the server's own code (`copyBatch` with the server's copy plan) against
 *   the same job outside the guard (`copyBatchUnguarded`), in this process,
 *   on the cpu_shm cache (bench/transfer/guardCost.ts).
 * - PING: a raw zeromq DEALER (as in bench/ping/ping.ts) with one PING [nil] in
 *   flight, in a child process of its own (bench/lib/pingChild.ts), idle first
 *   and then through each measured transfer window.
 * - Measuring starts once the server's background L1 prefault is done.
 * - Beside each window: the server's event-loop delay, its JS-thread and
 *   other-thread CPU and how long its JS thread waited for a CPU (/proc), and
 *   the whole machine's load, so a slow figure can be told from a busy box.
 *
 * Prints a table and writes the section "## STORE and RETRIEVE throughput
 * (bench:transfer)" of docs/benchmarks.md. A benchmark, never a test: exits
 * 0 on success, 1 on failure, and always stops the server, removes the ipc
 * socket file and unlinks every shared-memory segment it created.
 */
import type { ChildProcess } from "node:child_process"
import { randomBytes } from "node:crypto"
import os from "node:os"
import path from "node:path"
import { monitorEventLoopDelay } from "node:perf_hooks"
import { Effect, Exit, Layer, ManagedRuntime, References, Scope } from "effect"
import { loggerLayer } from "../../src/layers/Logging.ts"
import { ClientLive } from "../../src/layers/Client.ts"
import { type AddonMapping, loadNativeAddon, type NativeError, NativeMemory } from "../../src/native/Native.ts"
import type { InvalidArgument } from "../../src/schema/WireError.ts"
import { validateKvCaches } from "../../src/services/kv/KvCacheLayout.ts"
import { chunkRanges, segmentPlan } from "../../src/services/server/internal/CopyPlan.ts"
import type { ZmqSockets } from "../../src/services/zmq/Sockets.ts"
import { Clear } from "../../src/schema/Op.ts"
import { makeMqClient, type RequestError } from "../../src/services/client/MqClient.ts"
import { makePagedKvCache, type PagedKvCache, type PagedKvCacheOptions } from "../../src/services/client/PagedKvCache.ts"
import { makeSchedulerAdapter, type SchedulerAdapterShape } from "../../src/services/client/SchedulerAdapter.ts"
import { makeWorkerAdapter, type TransferRequest, type WorkerAdapterShape } from "../../src/services/client/WorkerAdapter.ts"
import { parseBenchArgs, positiveSeconds } from "../lib/args.ts"
import {
  BLOCK_BYTES,
  BLOCK_TOKENS,
  BLOCKS_PER_CHUNK,
  CHUNK_BYTES,
  CHUNK_TOKENS,
  DTYPE,
  ELEMENT_BYTES,
  HEAD_SIZE,
  layerBytes,
  makeFilledCache,
  NUM_HEADS,
  NUM_LAYERS,
  segmentNamesOf,
  unlinkSegments
} from "../lib/kvChunks.ts"
import { spawnReady, startLineChild, stopChild } from "../lib/children.ts"
import { awaitL1Prefault } from "../lib/l1Prefault.ts"
import { SERVER_NODE_OPTIONS } from "../lib/serverNodeOptions.ts"
import { int as intOf, orNa } from "../lib/format.ts"
import { type GuardCost, measureGuardCost } from "./guardCost.ts"
import { freeGiB, machineJiffies, measuredDate, memAvailableGiB, nodeAndCpu, processMemoryGiB, threadCpu } from "../lib/machine.ts"
import { DOC_NAME, writeDocSection } from "../lib/report.ts"
import { makeResources } from "../lib/resources.ts"
import { summarizeUs, type LatencySummary } from "../lib/stats.ts"
import { writeSummary, type SummaryRow } from "../lib/summary.ts"
import { secondsSince, sleep } from "../lib/time.ts"
import { startPingChild, type PingChild } from "../lib/pingChild.ts"

const HEADING = "## STORE and RETRIEVE throughput (bench:transfer)"

// Model geometry (one kv rank): bench/lib/kvChunks.ts.
const MODEL = "bench-32l-8x128-f16"

/**
 * The descriptor kinds whose STORE/RETRIEVE the bench measures, each with
 * how its worker makes the KV cache in the worker's scope (`namePrefix` is
 * this run's unique tag) and registers it. Every phase, table row, summary
 * row and the byte check run once per entry.
 *
 * makePagedKvCache defaults to cpu_memfd, so the cpu_shm entry names its
 * backing (guardCost opens that cache's segments by name); a memfd cache is
 * registered through registerPagedKvCache, which hands its descriptors over.
 */
interface CacheKind {
  readonly kind: "cpu_shm" | "cpu_memfd"
  readonly makeCache: (
    options: PagedKvCacheOptions
  ) => Effect.Effect<PagedKvCache, InvalidArgument | NativeError, NativeMemory | ZmqSockets | Scope.Scope>
  readonly register: (adapter: WorkerAdapterShape, cache: PagedKvCache) => Effect.Effect<void, RequestError>
}
/** REGISTER_KV_CACHE with the cache's descriptors as they are (cpu_shm). */
const byDescriptors = (adapter: WorkerAdapterShape, cache: PagedKvCache) => adapter.registerKvCaches(cache.descriptors)
const KINDS: ReadonlyArray<CacheKind> = [
  { kind: "cpu_shm", makeCache: (o) => makePagedKvCache({ ...o, backing: "cpu_shm" }), register: byDescriptors },
  { kind: "cpu_memfd", makeCache: (o) => makePagedKvCache({ ...o, backing: "cpu_memfd" }), register: (adapter, cache) => adapter.registerPagedKvCache(cache) }
]

// Load shape.
const CHUNKS_PER_REQUEST = 4
/** Requests in flight, one per stream. */
const STREAMS = 2
const BLOCKS_PER_REQUEST = CHUNKS_PER_REQUEST * BLOCKS_PER_CHUNK
const REQUEST_TOKENS = CHUNKS_PER_REQUEST * CHUNK_TOKENS
const REQUEST_BYTES = CHUNKS_PER_REQUEST * CHUNK_BYTES
/** Requests stored once for the RETRIEVE phase: 1 GiB, far beyond any CPU cache. */
const RETRIEVE_SET = 8
/** Block 0 (null, unused) + STREAMS × 64 source blocks + STREAMS × 64 destination blocks. */
const NUM_BLOCKS = 1 + 2 * STREAMS * BLOCKS_PER_REQUEST
const LAYER_BYTES = layerBytes(NUM_BLOCKS)
const L1_SIZE_GB = 4

// Timing.
const QUICK_PHASE_S = 4
const QUICK_IDLE_S = 3
const FULL_PHASE_S = 12
const WARMUP_S = 1
/** A transfer window runs on past its duration until this many requests completed in it… */
const MIN_REQUESTS = 8
/** …but no longer than this many times its duration. */
const MAX_STRETCH = 4
const MEMCPY_WARMUP_COPIES = 8
/** The guard-cost measurement: rounds of one chunk job of each variant, per direction (quick, full). */
const GUARD_ROUNDS_QUICK = 150
const GUARD_ROUNDS_FULL = 400
/** "The guard must cost under 5 %" (issue 13): guarded ÷ unguarded time below this. */
const GUARD_TARGET = 1.05
const READY_TIMEOUT_MS = 30_000
const STOP_TIMEOUT_MS = 10_000
const REQUEST_TIMEOUT_MS = 30_000
const PROBE_TIMEOUT_MS = 5_000
const PREFAULT_TIMEOUT_MS = 300_000
/** The PING probes' pace: 200 PINGs/s each, a light fixed load beside what they measure. */
const PING_INTERVAL_MS = 5
const CORES = os.cpus().length

// ---------------------------------------------------------------- arguments

const args = parseBenchArgs({ duration: { type: "string" }, "server-prof": { type: "string" } })
const durationS = args.duration !== undefined ? positiveSeconds("--duration", args.duration) : args.full ? FULL_PHASE_S : QUICK_PHASE_S
const idleS = args.duration !== undefined ? durationS : args.full ? FULL_PHASE_S : QUICK_IDLE_S
const serverProfDir = args["server-prof"] === undefined ? undefined : path.resolve(args["server-prof"])

const log = (line: string): void => {
  process.stderr.write(`${line}\n`)
}

// ------------------------------------------------------- resources to clean

// On a signal: SIGKILL the server and the echo at once, remove the sockets, unlink our segments.
const resources = makeResources(`mpcache-bench-${process.pid}-${Date.now().toString(36)}`, { stopTimeoutMs: STOP_TIMEOUT_MS, onSignal: "kill" })
const tag = resources.tag
const endpoint = resources.ipcEndpoint()
const echoEndpoint = resources.ipcEndpoint("echo")
const segmentNames = segmentNamesOf(tag)
let serverChild: ChildProcess | undefined
resources.onCleanup(() => unlinkSegments(segmentNames))

// ------------------------------------------------------------------ server

/** Event-loop delay over a window, ms beyond the sampler's period. */
interface LoopDelay {
  readonly p50: number
  readonly p99: number
  readonly max: number
}

const NO_DELAY: LoopDelay = { p50: Number.NaN, p99: Number.NaN, max: Number.NaN }

interface Server {
  readonly child: ChildProcess
  readonly pid: number
  readonly httpUrl: string
  /** The tail of its output, for error messages. */
  readonly tail: () => string
  /** WARN/ERROR log lines so far and the first few of them. */
  readonly warnings: { count: number; readonly first: Array<string> }
  /** The server's event-loop delay since the previous call (SIGUSR2 to bench/transfer/loop-delay.ts). */
  readonly loopDelay: () => Promise<LoopDelay>
  /** Rejects when the server exits: race anything that waits on it against this. */
  readonly exited: Promise<never>
}

/** Starts `mpcache serve`; resolves once both the MQ and the HTTP frontends listen. */
const startServer = async (): Promise<Server> => {
  const argv = [
    ...SERVER_NODE_OPTIONS,
    ...(serverProfDir === undefined ? [] : ["--cpu-prof", `--cpu-prof-dir=${serverProfDir}`]),
    "--import",
    "./bench/transfer/loop-delay.ts",
    "src/cli/main.ts",
    "serve",
    "--endpoint",
    endpoint,
    "--http-port",
    "0",
    "--l1-size-gb",
    String(L1_SIZE_GB),
    "--chunk-size",
    String(CHUNK_TOKENS),
    "--log-format",
    "json"
  ]
  const child = startLineChild("mpcache server", argv, resources.children)
  serverChild = child.process
  const warnings = { count: 0, first: [] as Array<string> }
  const exited = child.exited.then(({ code, signal }): never => {
    throw new Error(`the mpcache server exited (code ${code}, signal ${signal}); output:\n${child.tail()}`)
  })
  exited.catch(() => {}) // observed where it is raced
  const delayWaiters: Array<(d: LoopDelay) => void> = []
  const loopDelay = (): Promise<LoopDelay> =>
    new Promise((done) => {
      const waiter = (d: LoopDelay) => {
        clearTimeout(giveUp)
        done(d)
      }
      const giveUp = setTimeout(() => {
        delayWaiters.splice(delayWaiters.indexOf(waiter), 1)
        done(NO_DELAY)
      }, PROBE_TIMEOUT_MS)
      delayWaiters.push(waiter)
      if (!child.process.kill("SIGUSR2")) waiter(NO_DELAY)
    })
  child.onLine((line) => {
    if (line.startsWith("{\"bench_loop_delay\"")) {
      const d = (JSON.parse(line) as { bench_loop_delay: { p50_ms: number; p99_ms: number; max_ms: number } }).bench_loop_delay
      delayWaiters.shift()?.({ p50: d.p50_ms, p99: d.p99_ms, max: d.max_ms })
      return
    }
    if (/"level":"(WARN|WARNING|ERROR|FATAL)"/.test(line)) {
      warnings.count++
      if (warnings.first.length < 5) warnings.first.push(line.slice(0, 400))
    }
  })
  const [, http] = await Promise.all([
    child.waitFor(/MQ server listening on/, READY_TIMEOUT_MS),
    child.waitFor(/HTTP frontend listening on (http:\/\/[^\s"]+)/, READY_TIMEOUT_MS)
  ])
  const pid = child.process.pid
  if (pid === undefined) throw new Error(`the mpcache server has no pid; output:\n${child.tail()}`)
  return { child: child.process, pid, httpUrl: http[1]!, tail: child.tail, warnings, loopDelay, exited }
}

/** Starts bench/lib/echo-router.ts on `echoEndpoint`; resolves once it listens. */
const startEcho = async (): Promise<void> => {
  await spawnReady("echo router", ["bench/lib/echo-router.ts", echoEndpoint], "echo router listening on", READY_TIMEOUT_MS, resources.children)
}

/** SIGTERM (graceful: the server unmaps and writes its CPU profile), SIGKILL if it hangs. */
const stopServer = (): Promise<void> => serverChild === undefined ? Promise.resolve() : stopChild(serverChild, STOP_TIMEOUT_MS)


/** Un-labelled Prometheus samples of the server; a counter never updated yet is absent and reads 0. */
const metrics = async (s: Server, names: ReadonlyArray<string>): Promise<Record<string, number>> => {
  const text = await (await fetch(`${s.httpUrl}/metrics`)).text()
  const out: Record<string, number> = {}
  for (const name of names) {
    const line = text.split("\n").find((l) => l.startsWith(`${name} `))
    out[name] = line === undefined ? 0 : Number(line.slice(line.lastIndexOf(" ") + 1))
  }
  return out
}

// -------------------------------------------------------------------- ping

/** Round trips of one probe over a window, µs. */
type PingResult = LatencySummary

// ------------------------------------------------------------------ worker

/** Deterministic shuffle (xorshift32) of `ids`, like an engine's block table after some churn. */
const shuffled = (ids: Array<number>, seed: number): Array<number> => {
  let x = seed >>> 0 || 1
  for (let i = ids.length - 1; i > 0; i--) {
    x ^= x << 13
    x >>>= 0
    x ^= x >>> 17
    x ^= x << 5
    x >>>= 0
    const j = x % (i + 1)
    ;[ids[i], ids[j]] = [ids[j]!, ids[i]!]
  }
  return ids
}
const range = (from: number, count: number): Array<number> => Array.from({ length: count }, (_, i) => from + i)
const sourcePool = shuffled(range(1, STREAMS * BLOCKS_PER_REQUEST), 0x9e3779b9)
const destPool = shuffled(range(1 + STREAMS * BLOCKS_PER_REQUEST, STREAMS * BLOCKS_PER_REQUEST), 0x85ebca6b)
const sourceBlocks = (stream: number) => sourcePool.slice(stream * BLOCKS_PER_REQUEST, (stream + 1) * BLOCKS_PER_REQUEST)
const destBlocks = (stream: number) => destPool.slice(stream * BLOCKS_PER_REQUEST, (stream + 1) * BLOCKS_PER_REQUEST)

/** Token ids of request `n`: its first token makes every chunk hash of the request unique. */
const tokensFor = (n: number): Array<number> =>
  Array.from({ length: REQUEST_TOKENS }, (_, i) => (i === 0 ? 100_000 + n : (i * 31 + 7) % 32_000))
const SET_BASE = 1_000_000

interface Worker {
  readonly cache: PagedKvCache
  readonly adapter: WorkerAdapterShape
  readonly scheduler: SchedulerAdapterShape
  readonly clear: () => Promise<void>
}

const runtime = ManagedRuntime.make(
  Layer.mergeAll(ClientLive, loggerLayer("pretty"), Layer.succeed(References.MinimumLogLevel, "Warn"))
)
let workerScope: Scope.Closeable | undefined

/** Runs `effect` in the worker's scope: its sockets and segments live until `stopWorker`. */
const run = <A, E>(effect: Effect.Effect<A, E, NativeMemory | ZmqSockets | Scope.Scope>): Promise<A> =>
  workerScope === undefined
    ? Promise.reject(new Error("the worker is not started"))
    : runtime.runPromise(Scope.provide(workerScope)(effect))

const startWorker = async (kind: CacheKind): Promise<Worker> => {
  workerScope = await runtime.runPromise(Scope.make())
  const cache = await run(makeFilledCache(tag, NUM_BLOCKS, kind.makeCache))
  const adapter = await run(makeWorkerAdapter({ endpoint, modelName: MODEL, worldSize: 1, kvRank: 0, requestTimeoutMs: REQUEST_TIMEOUT_MS }))
  await run(kind.register(adapter, cache))
  const scheduler = await run(makeSchedulerAdapter({ endpoint, modelName: MODEL, worldSize: 1, requestTimeoutMs: REQUEST_TIMEOUT_MS }))
  const admin = await run(makeMqClient({ endpoint, requestTimeoutMs: REQUEST_TIMEOUT_MS }))
  return { cache, adapter, scheduler, clear: () => run(admin.request(Clear, [false])) }
}

/** UNREGISTER, sockets closed, segments unmapped and unlinked. */
const stopWorker = async (): Promise<void> => {
  const scope = workerScope
  workerScope = undefined
  if (scope !== undefined) await runtime.runPromise(Scope.close(scope, Exit.void))
}

// ------------------------------------------------------------ measurements

const COUNTERS = ["mpcache_stored_bytes_total", "mpcache_retrieved_bytes_total", "mpcache_l1_evictions_total"] as const

/** What one measured window saw, beside the load it ran. */
interface Window {
  readonly seconds: number
  readonly ping: PingResult
  /** The same probe against the echo router, in the same window. */
  readonly echoPing: PingResult
  readonly serverLoop: LoopDelay
  readonly benchLoop: LoopDelay
  /** CPU in cores (1.0 = one core busy all the window). */
  readonly serverJsCores: number
  readonly serverOtherCores: number
  /** Share of the window the server's JS thread spent runnable but waiting for a CPU. */
  readonly serverJsRunqueueShare: number
  readonly benchCores: number
  /** The whole machine, other users included. */
  readonly machineCores: number
  /** Deltas of the server's counters over the window. */
  readonly counters: Record<string, number>
}

const benchLoopDelay = monitorEventLoopDelay({ resolution: 2 })
benchLoopDelay.enable()
const readBenchLoopDelay = (): LoopDelay => {
  const ms = (ns: number) => Math.max(0, ns / 1e6 - 2)
  return { p50: ms(benchLoopDelay.percentile(50)), p99: ms(benchLoopDelay.percentile(99)), max: ms(benchLoopDelay.max) }
}

/**
 * Measures `seconds` (longer while `enough()` says no, up to MAX_STRETCH ×)
 * with PING recording; `onStart`/`onEnd` bracket the load's own counting.
 */
const measure = async (
  s: Server,
  ping: Probes,
  seconds: number,
  onStart: () => void,
  onEnd: () => void,
  enough: () => boolean = () => true
): Promise<Window> => {
  const counters0 = await metrics(s, COUNTERS)
  await s.loopDelay() // resets the server's histogram
  benchLoopDelay.reset()
  const cpu0 = threadCpu(s.pid)
  const bench0 = process.cpuUsage()
  const machine0 = machineJiffies()
  const t0 = process.hrtime.bigint()
  onStart()
  ping.server.measure()
  ping.echo.measure()
  await sleep(seconds * 1000)
  while (!enough() && secondsSince(t0) < seconds * MAX_STRETCH) await sleep(20)
  onEnd()
  const [latenciesUs, echoLatenciesUs] = await Promise.all([ping.server.collect(), ping.echo.collect()])
  const elapsed = secondsSince(t0)
  const cpu1 = threadCpu(s.pid)
  const bench1 = process.cpuUsage(bench0)
  const machine1 = machineJiffies()
  const benchLoop = readBenchLoopDelay()
  const serverLoop = await s.loopDelay()
  const counters1 = await metrics(s, COUNTERS)
  return {
    seconds: elapsed,
    ping: summarizeUs(latenciesUs),
    echoPing: summarizeUs(echoLatenciesUs),
    serverLoop,
    benchLoop,
    serverJsCores: (cpu1.js - cpu0.js) / elapsed,
    serverOtherCores: (cpu1.other - cpu0.other) / elapsed,
    serverJsRunqueueShare: (cpu1.jsRunqueueWait - cpu0.jsRunqueueWait) / elapsed,
    benchCores: (bench1.user + bench1.system) / 1e6 / elapsed,
    machineCores: ((machine1.busy - machine0.busy) / (machine1.total - machine0.total)) * CORES,
    counters: Object.fromEntries(COUNTERS.map((c) => [c, counters1[c]! - counters0[c]!]))
  }
}

/**
 * The two PING probes of a window, each a process of its own at the same pace: one against the server, one
 * against a bare zeromq.js echo (bench/lib/echo-router.ts) on the same machine under the same load — what any
 * ZeroMQ responder gets from this machine at that moment, the reference for the server's PING under load.
 */
interface Probes {
  readonly server: PingChild
  readonly echo: PingChild
  readonly failed: Promise<never>
  readonly stop: () => Promise<void>
}

const startProbes = (): Probes => {
  const server = startPingChild(endpoint, PING_INTERVAL_MS, "mpcache")
  const echo = startPingChild(echoEndpoint, PING_INTERVAL_MS, "echo")
  const failed = Promise.race([server.failed, echo.failed])
  failed.catch(() => {}) // observed where it is raced
  return { server, echo, failed, stop: async () => void (await Promise.all([server.stop(), echo.stop()])) }
}

const idle = async (s: Server): Promise<Window> => {
  const ping = startProbes()
  const failed = Promise.race([ping.failed, s.exited])
  try {
    await Promise.race([sleep(500), failed])
    return await Promise.race([measure(s, ping, idleS, () => {}, () => {}), failed])
  } finally {
    await ping.stop()
  }
}

/** Mean latency of each stage of a request, ms. */
type Stages = Record<string, number>

interface Phase extends Window {
  readonly requests: number
  readonly bytes: number
  readonly gbps: number
  /** Means over the requests completed in the window. */
  readonly stagesMs: Stages
}

/** Times one stage of a request into `stages`. */
const timed = async <A>(stages: Stages, stage: string, f: () => Promise<A>): Promise<A> => {
  const t0 = performance.now()
  try {
    return await f()
  } finally {
    stages[stage] = (stages[stage] ?? 0) + performance.now() - t0
  }
}

/**
 * `STREAMS` loops of `once` (each returns the bytes it moved), a warm-up,
 * then the window: throughput = bytes of the requests that complete in it ÷
 * its length. PING runs throughout.
 */
const phase = async (
  s: Server,
  name: string,
  once: (stream: number, iteration: number, stages: Stages) => Promise<number>
): Promise<Phase> => {
  const state = { stop: false, measuring: false, requests: 0, bytes: 0 }
  const stagesMs: Stages = {}
  const loops = Promise.all(range(0, STREAMS).map(async (stream) => {
    for (let i = 0; !state.stop; i++) {
      const stages: Stages = {}
      const moved = await timed(stages, "request", () => once(stream, i, stages))
      if (!state.measuring) continue
      state.requests++
      state.bytes += moved
      for (const [k, v] of Object.entries(stages)) stagesMs[k] = (stagesMs[k] ?? 0) + v
    }
  }))
  const ping = startProbes()
  // A failing stream or PING client, or the server's exit, ends the phase at once.
  const failed = Promise.race([loops.then(() => new Promise<never>(() => {})), ping.failed, s.exited])
  let ok = false
  try {
    await Promise.race([sleep(WARMUP_S * 1000), failed])
    const w = await Promise.race([
      measure(s, ping, durationS, () => (state.measuring = true), () => (state.measuring = false), () => state.requests >= MIN_REQUESTS),
      failed
    ])
    for (const k of Object.keys(stagesMs)) stagesMs[k] = stagesMs[k]! / Math.max(1, state.requests)
    const result: Phase = { ...w, requests: state.requests, bytes: state.bytes, gbps: state.bytes / w.seconds / 1e9, stagesMs }
    log(
      `  ${name}: ${result.requests} requests, ${(result.bytes / 2 ** 30).toFixed(2)} GiB in ${w.seconds.toFixed(2)} s; ` +
        `mean ms per request: ${stagesText(stagesMs)}; L1 evictions ${w.counters.mpcache_l1_evictions_total}`
    )
    ok = true
    return result
  } finally {
    state.stop = true
    await ping.stop()
    // On success the streams end after their requests in flight; on failure
    // closing the worker fails whatever still waits.
    if (ok) await loops
  }
}

const stagesText = (stages: Stages): string => Object.entries(stages).map(([k, v]) => `${k} ${v.toFixed(1)}`).join(", ")

/** Single-thread memcpy of `chunks` × 32 MiB between two warm buffers: GB/s. */
const memcpy = (chunks: number): number => {
  const src = Buffer.alloc(CHUNK_BYTES)
  src.fill(randomBytes(4099).map((b) => b | 1))
  const dst = Buffer.alloc(CHUNK_BYTES)
  for (let i = 0; i < MEMCPY_WARMUP_COPIES; i++) dst.set(src)
  const t0 = process.hrtime.bigint()
  for (let i = 0; i < chunks; i++) dst.set(src)
  const seconds = secondsSince(t0)
  if (!dst.equals(src)) throw new Error("the memcpy reference did not copy")
  return (chunks * CHUNK_BYTES) / seconds / 1e9
}

/** The phase with the memcpy reference of as many chunks as it moved, measured now. */
const withMemcpy = (p: Phase): Measured => {
  const chunks = Math.max(MEMCPY_WARMUP_COPIES, p.bytes / CHUNK_BYTES)
  const memcpyGbps = memcpy(chunks)
  log(`  memcpy reference: ${chunks} × 32 MiB at ${f2(memcpyGbps)} GB/s`)
  return { ...p, memcpyGbps }
}

/**
 * The fault guard's cost on the cpu_shm cache: the server's copy job of one chunk (stream 0's first 16
 * source blocks, the server's copy plan over every layer's segment) with and without the guard.
 */
const guardCost = async (cache: PagedKvCache): Promise<GuardCost> => {
  const validated = validateKvCaches(cache.descriptors, CHUNK_TOKENS)
  if ("error" in validated) throw new Error(`the bench's KV cache does not validate: ${validated.error}`)
  const segments = segmentPlan(validated.layers)
  const ranges = chunkRanges(validated.geometry, validated.layers, CHUNK_TOKENS, sourceBlocks(0).slice(0, BLOCKS_PER_CHUNK), 0, segments)
  const addon = loadNativeAddon()
  const mappings: Array<AddonMapping> = []
  try {
    for (const name of segments.names) mappings.push(addon.openMapping(name, LAYER_BYTES))
    const job = { mappings, ranges, buffer: Buffer.alloc(CHUNK_BYTES) }
    return await measureGuardCost(addon, job, args.full ? GUARD_ROUNDS_FULL : GUARD_ROUNDS_QUICK)
  } finally {
    await Promise.all(mappings.map((m) => m.close()))
  }
}

/** One RETRIEVE of set request `r` into stream `stream`'s blocks, checked against the source blocks. */
const verify = async (w: Worker, r: number, stream: number): Promise<void> => {
  const src = sourceBlocks(r % STREAMS)
  const dst = destBlocks(stream)
  const zero = Buffer.alloc(BLOCK_BYTES)
  const layers = [0, NUM_LAYERS >> 1, NUM_LAYERS - 1]
  // Scribble over the destinations first, so that only this RETRIEVE can make them match.
  for (const l of layers) for (const kv of [0, 1] as const) for (const b of dst) await run(w.cache.writeBlock(l, kv, b, zero))
  const request: TransferRequest = { requestId: `verify-${r}`, tokenIds: tokensFor(SET_BASE + r), start: 0, end: REQUEST_TOKENS, blockIds: dst }
  if (!(await run(w.adapter.retrieve(request)))) throw new Error("the verification RETRIEVE answered ok = false")
  for (const l of layers) {
    for (const kv of [0, 1] as const) {
      for (let j = 0; j < BLOCKS_PER_REQUEST; j++) {
        const expected = await run(w.cache.readBlock(l, kv, src[j]!))
        const actual = await run(w.cache.readBlock(l, kv, dst[j]!))
        if (!expected.equals(actual)) {
          throw new Error(`RETRIEVE wrote wrong bytes: layer ${l}, kv ${kv}, block ${dst[j]} (stored from block ${src[j]})`)
        }
      }
    }
  }
}

// ------------------------------------------------------------------ report

/** A transfer phase and the memcpy reference of the same bytes measured right after it. */
interface Measured extends Phase {
  readonly memcpyGbps: number
}

/** One descriptor kind's phases. */
interface KindReport {
  readonly kind: CacheKind["kind"]
  readonly store: Measured
  readonly retrieve: Measured
}

interface Report {
  readonly idle: Window
  readonly kinds: ReadonlyArray<KindReport>
  readonly guard: GuardCost
  readonly serverMemory: { rss: number; peak: number }
  readonly serverWarnings: number
}

const f2 = orNa((n) => n.toFixed(2))
const f3 = orNa((n) => n.toFixed(3))
const f1 = orNa((n) => n.toFixed(1))
const int = orNa(intOf)

const table = (r: Report): string => {
  const row = (name: string, w: Window, m?: Measured) =>
    `| ${name} | ${m === undefined ? "—" : f2(m.gbps)} | ${m === undefined ? "—" : f2(m.memcpyGbps)} | ` +
    `${m === undefined ? "—" : `**${f2(m.gbps / m.memcpyGbps)}**`} | ` +
    `${int(w.ping.p50Us)} | ${int(w.ping.p99Us)} | **${f2(w.ping.p99Us / r.idle.ping.p99Us)}** | ` +
    `${int(w.echoPing.p99Us)} | ${f2(w.ping.p99Us / w.echoPing.p99Us)} | ` +
        `${f1(w.serverLoop.p99)} / ${f1(w.serverLoop.max)} | ${f1(w.benchLoop.p99)} | ${f2(w.serverJsCores)} / ${f2(w.serverOtherCores)} | ` +
        `${int(w.serverJsRunqueueShare * 100)} % | ` +
        `${f2(w.benchCores)} / ${f2(w.machineCores)} |`
  return [
    "| measurement | GB/s | memcpy GB/s (same bytes, right after) | GB/s ÷ memcpy | PING p50 µs | PING p99 µs | PING p99 ÷ idle | echo PING p99 µs (same window) | PING p99 ÷ echo p99 | server event-loop delay p99 / max, ms | bench event-loop delay p99, ms | server CPU: JS thread / other threads (cores) | server JS thread waiting for a CPU | CPU: bench process / whole machine (cores) |",
    "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    row("idle (PING only)", r.idle),
    ...r.kinds.flatMap((k) => [
      row(`STORE (${k.kind})`, k.store, k.store),
      row(`RETRIEVE (${k.kind}; with LOOKUP, END_SESSION)`, k.retrieve, k.retrieve)
    ])
  ].join("\n")
}

/** The guard's cost: GB/s with and without it, and the median time ratio, per direction. */
const guardTable = (g: GuardCost): string =>
  [
    "| fault guard, one chunk's copy job | gather GB/s (worker → L1, STORE) | scatter GB/s (L1 → worker, RETRIEVE) |",
    "|---|---:|---:|",
    `| guard on (\`copyBatch\`, what the server runs) | ${f2(g.gather.guardedGbps)} | ${f2(g.scatter.guardedGbps)} |`,
    `| guard off (\`copyBatchUnguarded\`, the same job) | ${f2(g.gather.unguardedGbps)} | ${f2(g.scatter.unguardedGbps)} |`,
    `| guarded ÷ unguarded time, median of ${g.rounds} rounds | **${f3(g.gather.timeRatio)}** | **${f3(g.scatter.timeRatio)}** |`
  ].join("\n")

const section = (r: Report): string => {
  const count = (p: Phase) => `${p.requests} requests (${f2(p.bytes / 2 ** 30)} GiB) in a ${f1(p.seconds)} s window`
  return [
    HEADING,
    "",
    `Measured ${measuredDate()} · ${nodeAndCpu()} · transport ipc · ` +
    `${WARMUP_S} s warm-up then ${durationS} s per transfer phase; ${idleS} s idle PING.`,
    "",
    `Model: ${NUM_LAYERS} layers, ${NUM_HEADS} heads × ${HEAD_SIZE} head size, ${DTYPE}, one kv rank; engine block ${BLOCK_TOKENS} tokens; ` +
    `chunk ${CHUNK_TOKENS} tokens = ${BLOCKS_PER_CHUNK} blocks = 2 × ${NUM_LAYERS} × ${CHUNK_TOKENS} × ${NUM_HEADS * HEAD_SIZE} × ` +
    `${ELEMENT_BYTES} B = **${CHUNK_BYTES / 2 ** 20} MiB** (one block of one layer's K or V: ${BLOCK_BYTES / 1024} KiB). GB = 10^9 bytes.`,
    "",
    `Method: \`mpcache serve --l1-size-gb ${L1_SIZE_GB} --chunk-size ${CHUNK_TOKENS}\` (default pools) in a child process, with`,
    "`bench/transfer/loop-delay.ts` preloaded to report its event-loop delay per window. The worker runs in the bench process:",
    `a PagedKvCache in POSIX shm (${NUM_LAYERS} segments × ${NUM_BLOCKS} blocks, ${f2((NUM_LAYERS * LAYER_BYTES) / 2 ** 30)} GiB, every block`,
    "non-zero; block 0, vLLM's null block, unused; block ids shuffled so that each 32 KiB block is its own copy range)",
    `registered through the WorkerAdapter. ${STREAMS} streams each keep one request of ${CHUNKS_PER_REQUEST} chunks`,
    `(${REQUEST_TOKENS} tokens, ${REQUEST_BYTES / 2 ** 20} MiB) in flight; one worker means one AFFINITY lane, so the server`,
    "runs its transfers one after the other and the second stream only hides round trips.",
    "*STORE*: fresh token ids every request, so every chunk is copied into a new L1 object.",
    `*RETRIEVE*: ${RETRIEVE_SET} requests (${(RETRIEVE_SET * REQUEST_BYTES) / 2 ** 30} GiB) stored once, then each stream loops LOOKUP`,
    "(scheduler adapter) → RETRIEVE into its own destination blocks → END_SESSION; one RETRIEVE is checked byte for",
    "byte against its source blocks afterwards. GB/s = bytes of the requests completed in the window ÷ the window;",
    `a window runs on past its duration until ${MIN_REQUESTS} requests completed in it (at most ${MAX_STRETCH} × its duration).`,
    "*memcpy*: `Uint8Array.prototype.set` of a 32 MiB buffer into another (both already faulted in), one thread,",
    `in the bench process, ${MEMCPY_WARMUP_COPIES} copies of warm-up, then as many copies as the phase moved chunks, right after`,
    "the phase (so that both see about the same machine load).",
    `*Kinds*: the phases run once per descriptor kind (${r.kinds.map((k) => k.kind).join(", ")}), each with its own worker`,
    "and instance, after a CLEAR.",
    `*PING*: a raw zeromq DEALER sending one PING [nil] every ${PING_INTERVAL_MS} ms whatever the replies do (several may be in`,
    "flight; each timed from its own send), in a process of its own (`bench/lib/pingChild.ts`), idle before the transfers",
    "and through each measured window. Beside it, the same probe against a bare zeromq.js echo (`bench/lib/echo-router.ts`,",
    "its own process) in the same windows: what any ZeroMQ responder gets from this machine under that load. Event-loop delay: lateness",
    "of a 2 ms timer (`monitorEventLoopDelay`) in the server and in the bench process (which runs the worker).",
    `The bench starts measuring once the server's background L1 prefault is done (waited ${f1(prefaultSeconds)} s here),`,
    "as a long-running server's L1 is: the first write of a fresh page costs seconds per GiB under some hypervisors.",
    "CPU from /proc: JS thread = the server's main thread; other = its libuv pool (the copies), V8 and ZeroMQ threads;",
    "*waiting for a CPU* = the share of the window its JS thread sat runnable on a run queue (schedstat): high means",
    "CPU starvation, low with a large event-loop delay means the JS thread itself was busy or blocked. The whole",
    "machine includes anything else running on it.",
    "",
    table(r),
    "",
    ...r.kinds.flatMap((k) => [
      `STORE (${k.kind}): ${count(k.store)}, mean ms per request: ${stagesText(k.store.stagesMs)}; ` +
      `L1 evictions in the window: ${k.store.counters.mpcache_l1_evictions_total}.`,
      `RETRIEVE (${k.kind}): ${count(k.retrieve)}, mean ms per request: ${stagesText(k.retrieve.stagesMs)}.`
    ]),
    `PING max µs: idle ${int(r.idle.ping.maxUs)}` +
    r.kinds.map((k) => `, STORE (${k.kind}) ${int(k.store.ping.maxUs)}, RETRIEVE (${k.kind}) ${int(k.retrieve.ping.maxUs)}`).join("") +
    `. Server memory at the end: RSS ${f2(r.serverMemory.rss)} GiB, peak ${f2(r.serverMemory.peak)} GiB ` +
    `(L1 capacity ${L1_SIZE_GB} GiB). Server WARN/ERROR log lines: ${r.serverWarnings}.`,
    "",
    "### The fault guard's cost",
    "",
    "Every copy of worker memory runs under the fault guard (issue 13: a worker that shrinks its segment gets an",
    "error, the server survives); the guard must cost under 5 %. Measured on the real copy code: the server's copy",
    `job of one chunk (the addon's \`copyBatch\` over the ${r.guard.mappings} layer segments of the cpu_shm cache, with the`,
    `${r.guard.ranges} ranges the server's copy plan gives for 16 shuffled blocks: ${r.guard.jobBytes / 2 ** 20} MiB) against the same job through`,
    "`copyBatchUnguarded`, the same loop outside the guard (a switch of the addon used by this bench only), in the",
    `bench process on the libuv pool, one job at a time: ${r.guard.rounds} rounds of one job of each, the order alternating`,
    "between rounds; gather first, then scatter of the gathered bytes back into the same blocks. GB/s of the median",
    "job; the ratio is the median over rounds of guarded ÷ unguarded time (1.00: no cost; a shared machine's noise",
    "moves it both ways).",
    "",
    guardTable(r.guard),
    "",
    "Reproduce: `npm run bench:transfer` (`-- --full` for 12 s windows, `-- --duration S` for S seconds per phase and",
    "idle; `-- --server-prof DIR` also writes the server's V8 CPU profile to DIR).",
    ""
  ].join("\n")
}

/**
 * The transfer targets: GB/s ≥ 0.6 × memcpy (issue 16; the first round asked 0.5×), PING p99 under
 * transfers ≤ 2 × the bare echo probed in the same windows (issue 16), the fault guard under 5 % (issue 13).
 */
/** STORE and RETRIEVE GB/s against memcpy of the same bytes (issue 16). */
const MEMCPY_TARGET = 0.6

const summaryRows = (r: Report): Array<SummaryRow> => {
  const rows: Array<SummaryRow> = []
  const phases = r.kinds.flatMap((k) => [[`STORE (${k.kind})`, k.store], [`RETRIEVE (${k.kind})`, k.retrieve]] as const)
  for (const [name, m] of phases) {
    const ratio = m.gbps / m.memcpyGbps
    rows.push({
      bench: "transfer",
      figure: `${name} GB/s, 256-token chunks, 32 layers × 8 × 128, float16`,
      measured: `${f2(m.gbps)} GB/s`,
      reference: `memcpy ${f2(m.memcpyGbps)} GB/s`,
      ratio,
      target: `≥ ${MEMCPY_TARGET} × memcpy`,
      met: ratio >= MEMCPY_TARGET
    })
  }
  // Issue 16: against the bare echo probed in the same windows (the machine's own tail under that load).
  for (const [name, m] of phases) {
    const ratio = m.ping.p99Us / m.echoPing.p99Us
    rows.push({
      bench: "transfer",
      figure: `PING p99 while ${name} runs flat out`,
      measured: `${int(m.ping.p99Us)} µs`,
      reference: `bare echo in the same windows ${int(m.echoPing.p99Us)} µs (idle: mpcache ${int(r.idle.ping.p99Us)} µs)`,
      ratio,
      target: "≤ 2 × echo",
      met: ratio <= 2
    })
  }
  for (const [name, d] of [["gather", r.guard.gather], ["scatter", r.guard.scatter]] as const) {
    rows.push({
      bench: "transfer",
      figure: `fault guard cost: one chunk's ${name} (${r.guard.mappings} mappings, ${r.guard.ranges} ranges), guarded ÷ unguarded time`,
      measured: `${f2(d.guardedGbps)} GB/s guarded`,
      reference: `${f2(d.unguardedGbps)} GB/s unguarded (same job, copyBatchUnguarded)`,
      ratio: d.timeRatio,
      target: `< ${GUARD_TARGET} (under 5 %)`,
      met: d.timeRatio < GUARD_TARGET
    })
  }
  return rows
}

// -------------------------------------------------------------------- main

/** Refuses to start when /dev/shm or memory cannot hold the KV cache and L1. */
const checkRoom = (): void => {
  const shmGiB = (NUM_LAYERS * LAYER_BYTES) / 2 ** 30
  const shmFreeGiB = freeGiB("/dev/shm")
  const availableGiB = memAvailableGiB()
  const neededGiB = shmGiB + L1_SIZE_GB + 1
  log(`KV cache ${f2(shmGiB)} GiB in /dev/shm (${f1(shmFreeGiB)} GiB free); L1 ${L1_SIZE_GB} GiB; ${f1(availableGiB)} GiB memory available`)
  if (shmFreeGiB < shmGiB * 1.1) throw new Error(`/dev/shm has ${f2(shmFreeGiB)} GiB free; the KV cache needs ${f2(shmGiB)} GiB`)
  if (availableGiB < neededGiB) throw new Error(`${f1(availableGiB)} GiB of memory available; the bench needs about ${f1(neededGiB)} GiB`)
}

let prefaultSeconds = Number.NaN

/** Fresh token ids for every STORE of the run, across kinds. */
let serial = 0

/** One kind's phases with a worker of its own: STORE, CLEAR + the RETRIEVE set, RETRIEVE, the byte check. */
const measureKind = async (s: Server, w: Worker, kind: CacheKind["kind"]): Promise<KindReport> => {
  const guard = <A>(p: Promise<A>): Promise<A> => Promise.race([p, s.exited])
  await guard(w.clear())
  log(`STORE (${kind}) …`)
  const storePhase = await phase(s, `STORE (${kind})`, async (stream, _i, stages) => {
    const n = serial++
    const request = { requestId: `store-${n}`, tokenIds: tokensFor(n), start: 0, end: REQUEST_TOKENS, blockIds: sourceBlocks(stream) }
    const ok = await timed(stages, "STORE", () => run(w.adapter.store(request)))
    if (!ok) throw new Error(`STORE ${n} answered ok = false; server output:\n${s.tail()}`)
    return REQUEST_BYTES
  })
  const store = withMemcpy(storePhase)

  log(`CLEAR, then STORE the RETRIEVE set (${RETRIEVE_SET} requests) …`)
  await guard(w.clear())
  for (let r = 0; r < RETRIEVE_SET; r++) {
    const request = { requestId: `set-${r}`, tokenIds: tokensFor(SET_BASE + r), start: 0, end: REQUEST_TOKENS, blockIds: sourceBlocks(r % STREAMS) }
    if (!(await guard(run(w.adapter.store(request))))) throw new Error(`STORE of set request ${r} answered ok = false`)
  }

  log(`RETRIEVE (${kind}) …`)
  const retrievePhase = await phase(s, `RETRIEVE (${kind})`, async (stream, i, stages) => {
    const r = (i * STREAMS + stream) % RETRIEVE_SET
    const requestId = `retrieve-${kind}-${stream}-${i}`
    const tokenIds = tokensFor(SET_BASE + r)
    const hit = await timed(stages, "LOOKUP", () => run(w.scheduler.lookup(requestId, tokenIds)))
    if (hit !== REQUEST_TOKENS) throw new Error(`LOOKUP of set request ${r} hit ${hit} of ${REQUEST_TOKENS} tokens`)
    const request = { requestId, tokenIds, start: 0, end: hit, blockIds: destBlocks(stream) }
    const ok = await timed(stages, "RETRIEVE", () => run(w.adapter.retrieve(request)))
    await timed(stages, "END_SESSION", () => run(w.scheduler.endSession(requestId)))
    if (!ok) throw new Error(`RETRIEVE of set request ${r} answered ok = false`)
    return (hit / CHUNK_TOKENS) * CHUNK_BYTES
  })
  const retrieve = withMemcpy(retrievePhase)
  await guard(verify(w, 3, 0))
  log("  one RETRIEVE verified byte for byte")

  for (const [p, counter] of [[store, "mpcache_stored_bytes_total"], [retrieve, "mpcache_retrieved_bytes_total"]] as const) {
    const counted = p.counters[counter]!
    if (Math.abs(counted - p.bytes) > STREAMS * REQUEST_BYTES) log(`  note: the server counted ${counted} bytes (${counter}), the bench ${p.bytes}`)
  }
  return { kind, store, retrieve }
}

const main = async (): Promise<void> => {
  checkRoom()
  await startEcho()
  const s = await startServer()
  log(`server up (${endpoint}, ${s.httpUrl}, pid ${s.pid}); ${durationS} s per phase`)
  prefaultSeconds = await Promise.race([awaitL1Prefault(s.httpUrl, PREFAULT_TIMEOUT_MS, 200), s.exited])
  log(`L1 prefaulted (waited ${f1(prefaultSeconds)} s)`)

  let idleWindow: Window | undefined
  let guardCostOf: GuardCost | undefined
  const kinds: Array<KindReport> = []
  for (const kind of KINDS) {
    const w = await Promise.race([startWorker(kind), s.exited])
    log(`worker registered (${kind.kind}): ${NUM_LAYERS} segments of ${f2(LAYER_BYTES / 2 ** 20)} MiB, filled`)
    if (idleWindow === undefined) {
      log(`PING idle (${idleS} s) …`)
      idleWindow = await idle(s)
    }
    kinds.push(await measureKind(s, w, kind.kind))
    if (kind.kind === "cpu_shm") {
      log("fault guard: one chunk's copy job with and without the guard …")
      guardCostOf = await guardCost(w.cache)
      log(
        `  gather ${f2(guardCostOf.gather.guardedGbps)} GB/s guarded, ${f2(guardCostOf.gather.unguardedGbps)} unguarded (×${f3(guardCostOf.gather.timeRatio)} time); ` +
          `scatter ${f2(guardCostOf.scatter.guardedGbps)} / ${f2(guardCostOf.scatter.unguardedGbps)} (×${f3(guardCostOf.scatter.timeRatio)})`
      )
    }
    await stopWorker()
  }
  if (idleWindow === undefined || guardCostOf === undefined) throw new Error("KINDS must include cpu_shm")

  const report: Report = {
    idle: idleWindow,
    kinds,
    guard: guardCostOf,
    serverMemory: processMemoryGiB(s.pid),
    serverWarnings: s.warnings.count
  }
  if (s.warnings.count > 0) log(`the server logged ${s.warnings.count} WARN/ERROR line(s); first:\n${s.warnings.first.join("\n")}`)

  await runtime.dispose()
  await stopServer()
  const body = section(report)
  process.stdout.write(`\n${body}\n`)
  writeDocSection(HEADING, body)
  writeSummary(args.summary, summaryRows(report))
  process.stdout.write(`wrote ${DOC_NAME}\n`)
}

try {
  await main()
} catch (error) {
  process.stderr.write(`bench:transfer failed: ${error instanceof Error ? error.stack ?? error.message : String(error)}\n`)
  process.exitCode = 1
  await stopWorker().catch(() => {})
  await runtime.dispose().catch(() => {})
  await stopServer()
} finally {
  resources.cleanupSync()
}
