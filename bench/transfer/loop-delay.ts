/**
 * Preloaded into the mpcache server by bench:transfer (`node --import
 * ./bench/transfer/loop-delay.ts src/cli/main.ts serve …`): measures the server's
 * event-loop delay without touching server code. On SIGUSR2 it writes one
 * line `{"bench_loop_delay":{"p50_ms","p99_ms","max_ms","count"}}` to stderr
 * (the delays since the previous SIGUSR2, beyond the sampler's own period)
 * and starts over.
 *
 * Only for benchmarks: without this preload SIGUSR2 would kill the server.
 */
import { monitorEventLoopDelay } from "node:perf_hooks"

/** Timer period of the sampler, ms: delays are measured beyond it. */
const RESOLUTION_MS = 2

const histogram = monitorEventLoopDelay({ resolution: RESOLUTION_MS })
histogram.enable()

process.on("SIGUSR2", () => {
  // The histogram holds the time between two sampler ticks: the lateness is that minus the period.
  const ms = (ns: number): number => Math.max(0, Math.round(ns / 1e4) / 100 - RESOLUTION_MS)
  const stats = histogram.count === 0
    ? { p50_ms: 0, p99_ms: 0, max_ms: 0, count: 0 }
    : { p50_ms: ms(histogram.percentile(50)), p99_ms: ms(histogram.percentile(99)), max_ms: ms(histogram.max), count: histogram.count }
  process.stderr.write(`${JSON.stringify({ bench_loop_delay: stats })}\n`)
  histogram.reset()
})
