/**
 * bench:transfer's measurements: a window of PING probes (against the server
 * and the bare echo), CPU and event-loop delay beside whatever load runs in
 * it; a transfer phase (STREAMS loops of one request, warm-up, then the
 * window); the memcpy reference of the same bytes.
 */
import { randomBytes } from "node:crypto"
import os from "node:os"
import { monitorEventLoopDelay } from "node:perf_hooks"
import { orNa } from "../lib/format.ts"
import { CHUNK_BYTES } from "../lib/kvChunks.ts"
import { machineJiffies, threadCpu } from "../lib/machine.ts"
import { summarizeUs, type LatencySummary } from "../lib/stats.ts"
import { secondsSince, sleep } from "../lib/time.ts"
import { startPingChild, type PingChild } from "../lib/pingChild.ts"
import { type LoopDelay, metrics, type Server } from "./server.ts"
import { MAX_STRETCH, MEMCPY_WARMUP_COPIES, MIN_REQUESTS, PING_INTERVAL_MS, range, STREAMS, WARMUP_S } from "./shape.ts"

const CORES = os.cpus().length
const f2 = orNa((n) => n.toFixed(2))

/** Round trips of one probe over a window, µs. */
export type PingResult = LatencySummary

export const COUNTERS = ["mpcache_stored_bytes_total", "mpcache_retrieved_bytes_total", "mpcache_l1_evictions_total"] as const

/** What one measured window saw, beside the load it ran. */
export interface Window {
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

/**
 * The two PING probes of a window, each a process of its own at the same pace: one against the server, one
 * against a bare zeromq.js echo (bench/lib/echo-router.ts) on the same machine under the same load — what any
 * ZeroMQ responder gets from this machine at that moment, the reference for the server's PING under load.
 */
export interface Probes {
  readonly server: PingChild
  readonly echo: PingChild
  readonly failed: Promise<never>
  readonly stop: () => Promise<void>
}

/** Mean latency of each stage of a request, ms. */
export type Stages = Record<string, number>

export interface Phase extends Window {
  readonly requests: number
  readonly bytes: number
  readonly gbps: number
  /** Means over the requests completed in the window. */
  readonly stagesMs: Stages
}

/** Times one stage of a request into `stages`. */
export const timed = async <A>(stages: Stages, stage: string, f: () => Promise<A>): Promise<A> => {
  const t0 = performance.now()
  try {
    return await f()
  } finally {
    stages[stage] = (stages[stage] ?? 0) + performance.now() - t0
  }
}


/** A transfer phase and the memcpy reference of the same bytes measured right after it. */
export interface Measured extends Phase {
  readonly memcpyGbps: number
}

export const stagesText = (stages: Stages): string => Object.entries(stages).map(([k, v]) => `${k} ${v.toFixed(1)}`).join(", ")

/** Single-thread memcpy of `chunks` × 32 MiB between two warm buffers: GB/s. */
export const memcpy = (chunks: number): number => {
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
export const withMemcpy = (p: Phase, log: (line: string) => void): Measured => {
  const chunks = Math.max(MEMCPY_WARMUP_COPIES, p.bytes / CHUNK_BYTES)
  const memcpyGbps = memcpy(chunks)
  log(`  memcpy reference: ${chunks} × 32 MiB at ${f2(memcpyGbps)} GB/s`)
  return { ...p, memcpyGbps }
}

/** What the measurements of one run share: the endpoints probed, the phase lengths, the log. */
export interface MeasureSettings {
  readonly endpoint: string
  readonly echoEndpoint: string
  /** Seconds per transfer phase, and of the idle window. */
  readonly durationS: number
  readonly idleS: number
  readonly log: (line: string) => void
}

/** The measurements of one run; the bench process's own event-loop delay is sampled from here on. */
export const makeMeasurements = (settings: MeasureSettings) => {
  const { durationS, echoEndpoint, endpoint, idleS, log } = settings
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

  return { idle, phase }
}
