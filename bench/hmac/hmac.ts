/**
 * `npm run bench:hmac [-- --quick | --full] [-- --values N] [-- --mib M]`
 *
 * What an L2 value's MAC costs the event loop (issue 24 item 14 follow-up): `--values` (5) MACs of
 * `--mib` (32) MiB each started at once, as a STORE's write-throughs or a prefetch's fetches start
 * them, with the server's own HmacSha256 (src/native/Hmac.ts) — natively on the libuv pool, and with
 * its node:crypto fallback on the JS thread — and the largest event-loop delay while they run
 * (perf_hooks' monitorEventLoopDelay at 1 ms, beyond its period), beside the batch's wall time.
 * Rounds alternate which backend goes first (3 quick, 5 default, 9 full); the load average is
 * printed with each, so a slow figure can be told from a busy box. Target: the native delay at most
 * 0.25× node:crypto's (`--check` exits 1 when missed); `--write-docs` rewrites its section of
 * docs/benchmarks.md. A benchmark, never a test.
 */
import { createSecretKey, randomBytes } from "node:crypto"
import { loadavg } from "node:os"
import { monitorEventLoopDelay } from "node:perf_hooks"
import { Effect } from "effect"
import { makeHmacSha256Unsafe } from "../../src/native/Hmac.ts"
import { parseBenchArgs, usageError } from "../lib/args.ts"
import { finishBench } from "../lib/outcome.ts"
import { median } from "../lib/stats.ts"
import { sleep } from "../lib/time.ts"

const HEADING = "## L2 MAC off the event loop (bench:hmac)"
/** The native MAC must hold the loop for at most this share of what node:crypto on the JS thread holds it (docs/l2.md). */
const MAX_RATIO = 0.25

const args = parseBenchArgs({ values: { type: "string" }, mib: { type: "string" } })
const positive = (flag: string, text: string | undefined, fallback: number): number => {
  if (text === undefined) return fallback
  const n = Number(text)
  return Number.isInteger(n) && n > 0 ? n : usageError(`--${flag} must be a positive integer, got ${text}`)
}
const VALUES = positive("values", args.values, 5)
const MIB = positive("mib", args.mib, 32)
const ROUNDS = args.quick === true ? 3 : args.full === true ? 9 : 5

const key = createSecretKey(randomBytes(32))
const payloads = Array.from({ length: VALUES }, () => [randomBytes(MIB * 1024 * 1024)])
const backends = { native: makeHmacSha256Unsafe(), "node:crypto": makeHmacSha256Unsafe({ native: false }) }
if (backends.native.backend === "node:crypto") usageError(`the native HMAC is not available: ${backends.native.fallbackReason}`)

/** One batch: the largest loop delay while it ran and its wall time, ms. */
const batch = async (name: keyof typeof backends) => {
  const hmac = backends[name]
  const h = monitorEventLoopDelay({ resolution: 1 })
  h.enable()
  await sleep(20) // the sampler's first ticks: a reset's next sample only sets its reference point
  h.reset()
  await sleep(5)
  const start = performance.now()
  await Effect.runPromise(Effect.forEach(payloads, (p) => hmac.digest(key, p), { concurrency: "unbounded", discard: true }))
  const wallMs = performance.now() - start
  await sleep(5) // one more sample, so a delay that ends with the batch is recorded
  h.disable()
  return { maxLagMs: Math.max(0, h.max / 1e6 - 1), wallMs }
}

const log = (line: string) => process.stdout.write(`${line}\n`)
log(`bench:hmac — ${VALUES} MACs of ${MIB} MiB at once, ${ROUNDS} rounds; native: ${backends.native.description}`)
const results: Record<keyof typeof backends, Array<{ maxLagMs: number; wallMs: number }>> = { native: [], "node:crypto": [] }
for (let round = 1; round <= ROUNDS; round++) {
  const order: Array<keyof typeof backends> = round % 2 === 1 ? ["native", "node:crypto"] : ["node:crypto", "native"]
  const line: Array<string> = []
  for (const name of order) {
    const r = await batch(name)
    results[name].push(r)
    line.push(`${name} max lag ${r.maxLagMs.toFixed(1)} ms (wall ${r.wallMs.toFixed(0)} ms)`)
  }
  log(`  round ${round}: ${line.join("; ")}; load ${loadavg().map((x) => x.toFixed(2)).join(" ")}`)
}
const lines = (["native", "node:crypto"] as const).map((name) => {
  const lags = results[name].map((r) => r.maxLagMs)
  return `${name.padEnd(12)} max event-loop delay: median ${median(lags).toFixed(1)} ms (rounds ${Math.min(...lags).toFixed(1)}–${Math.max(...lags).toFixed(1)}); batch wall median ${median(results[name].map((r) => r.wallMs)).toFixed(0)} ms`
})
const nativeLag = median(results.native.map((r) => r.maxLagMs))
const jsLag = median(results["node:crypto"].map((r) => r.maxLagMs))
const ratio = jsLag > 0 ? nativeLag / jsLag : 0
process.exitCode = finishBench(args, {
  heading: HEADING,
  body: [
    HEADING,
    "",
    `\`npm run bench:hmac\`: ${VALUES} MAC${VALUES === 1 ? "" : "s"} of ${MIB} MiB started at once, ${ROUNDS} rounds alternating which goes first;`,
    `the largest event-loop delay while they run (native: ${backends.native.description}).`,
    "",
    "```",
    ...lines,
    "```",
    ""
  ].join("\n"),
  rows: [{
    bench: "hmac",
    figure: `max event-loop delay, ${VALUES} MAC${VALUES === 1 ? "" : "s"} of ${MIB} MiB at once, native on the libuv pool`,
    measured: `${nativeLag.toFixed(1)} ms`,
    reference: `${jsLag.toFixed(1)} ms with node:crypto on the JS thread`,
    ratio,
    target: `≤ ${MAX_RATIO}×`,
    met: ratio <= MAX_RATIO
  }]
})
