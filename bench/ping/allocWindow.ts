/**
 * Bytes the mpcache server allocates per PING: the server runs with
 * bench/ping/alloc-probe.ts preloaded; `clients` raw PING clients warm it up,
 * then the probe's window is opened, exactly `pings` PINGs are answered,
 * and the window is closed (issue 16: "bytes allocated per PING on the
 * server … over 100k PINGs"). The same works for the bare echo.
 */
import { pingLoop, type PingRun, type Responder } from "../lib/pingClient.ts"
import type { LineChild } from "../lib/children.ts"
import type { TopEntry } from "./profileTop.ts"
import { sleep } from "../lib/time.ts"

/** The argv that preloads the probe into `node … src/cli/main.ts serve`. */
export const ALLOC_PROBE_ARGV: ReadonlyArray<string> = ["--import", "./bench/ping/alloc-probe.ts"]

/** What one window measured. */
export interface AllocWindow {
  readonly pings: number
  /** Heap statistics deltas (every GC's freed bytes plus the used heap's growth) ÷ PINGs. */
  readonly gcBytesPerPing: number
  /** Allocation sampling ÷ PINGs. */
  readonly sampledBytesPerPing: number
  readonly gcs: number
  readonly top: ReadonlyArray<TopEntry>
}

interface ProbeLine {
  readonly gc_bytes: number
  readonly sampled_bytes: number
  readonly gcs: number
  readonly top: ReadonlyArray<TopEntry>
}

const WARMUP_MS = 1_000
const LINE_TIMEOUT_MS = 30_000

/**
 * Runs one window against `server` (started with ALLOC_PROBE_ARGV) listening on `endpoint`; `responder`:
 * which server it is (the bare echo, bench/lib/echo-router.ts, takes the probe too: its bytes per round trip are
 * the floor of this stack).
 */
export const measureAllocation = async (
  server: LineChild,
  endpoint: string,
  clients: number,
  pings: number,
  responder: Responder = "mpcache"
): Promise<AllocWindow> => {
  const run: PingRun = { measuring: false, stopped: false, latenciesUs: [] }
  const all = Promise.all(Array.from({ length: clients }, () => pingLoop(endpoint, run, responder)))
  let failure: unknown
  all.catch((e: unknown) => {
    failure = e
  })
  try {
    await sleep(WARMUP_MS)
    const pid = server.process.pid!
    const lines: Array<string> = []
    server.onLine((line) => {
      if (line.includes("\"bench_alloc\"")) lines.push(line)
    })
    process.kill(pid, "SIGURG")
    await server.waitFor(/"bench_alloc":"started"/, LINE_TIMEOUT_MS)
    // The PINGs timed from here on were all sent, answered and received inside the window.
    run.measuring = true
    while (run.latenciesUs.length < pings && failure === undefined) await sleep(2)
    // Every PING sent in the window is answered in it: the clients stop, then the window closes (reading the
    // sampled profile can take the server seconds, which a running client would time out on).
    run.stopped = true
    await all.catch(() => {})
    const answered = run.latenciesUs.length
    process.kill(pid, "SIGURG")
    const match = await server.waitFor(/"bench_alloc":\{.*\}\}$/, LINE_TIMEOUT_MS)
    const line = (JSON.parse(match.input!) as { readonly bench_alloc: ProbeLine }).bench_alloc
    if (failure !== undefined) throw failure
    return {
      pings: answered,
      gcBytesPerPing: line.gc_bytes / answered,
      sampledBytesPerPing: line.sampled_bytes / answered,
      gcs: line.gcs,
      top: line.top
    }
  } finally {
    run.stopped = true
    await all.catch(() => {})
  }
}
