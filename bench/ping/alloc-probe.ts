/**
 * Preloaded into the mpcache server by bench:ping and bench/ping/profile.ts
 * (`node --import ./bench/ping/alloc-probe.ts src/cli/main.ts serve …`): counts
 * the bytes the server's JS heap allocates in a window, without touching
 * server code. SIGURG opens the window (and writes `{"bench_alloc":
 * "started"}` to stderr), the next SIGURG closes it and writes one line
 * `{"bench_alloc":{"gc_bytes","sampled_bytes","gcs","top"}}`:
 *
 * - `gc_bytes`: heap statistics deltas — what every GC in the window freed
 *   (`v8.GCProfiler`: used before minus used after) plus the growth of the
 *   used heap from the start to the end of the window; i.e. every byte
 *   allocated in it, whether it died young or lived on.
 * - `sampled_bytes` and `top`: V8's allocation sampling over the same window,
 *   keeping the samples of objects GC has since collected (Node's
 *   `--heap-prof` keeps only the live ones), and its 15 largest call sites.
 *
 * SIGURG because SIGWINCH is bench/lib/heap-probe.ts's and SIGUSR2
 * bench/transfer/loop-delay.ts's; its default action is to be ignored, so a server
 * without this preload shrugs it off. Only for benchmarks.
 */
import { Session } from "node:inspector/promises"
import v8 from "node:v8"
import { heapTop, type HeapProfile } from "./profileTop.ts"

/** Mean bytes between allocation samples: small, so that the sampled total is close to the real one. */
const SAMPLING_INTERVAL = 1024

interface Window {
  readonly gc: v8.GCProfiler
  readonly usedAtStart: number
}

let open: Window | undefined
let busy = false
const session = new Session()
session.connect()

const write = (line: unknown): void => {
  process.stderr.write(`${JSON.stringify(line)}\n`)
}

const start = async (): Promise<void> => {
  await session.post("HeapProfiler.startSampling", {
    samplingInterval: SAMPLING_INTERVAL,
    includeObjectsCollectedByMajorGC: true,
    includeObjectsCollectedByMinorGC: true
  })
  const gc = new v8.GCProfiler()
  gc.start()
  open = { gc, usedAtStart: v8.getHeapStatistics().used_heap_size }
  write({ bench_alloc: "started" })
}

const stop = async (window: Window): Promise<void> => {
  const usedAtEnd = v8.getHeapStatistics().used_heap_size
  const stats = window.gc.stop()?.statistics ?? []
  const { profile } = await session.post("HeapProfiler.stopSampling")
  let freed = 0
  for (const s of stats) freed += s.beforeGC.heapStatistics.usedHeapSize - s.afterGC.heapStatistics.usedHeapSize
  const sampled = heapTop(profile as unknown as HeapProfile, 15)
  write({
    bench_alloc: {
      gc_bytes: freed + usedAtEnd - window.usedAtStart,
      sampled_bytes: sampled.totalBytes,
      gcs: stats.length,
      top: sampled.top
    }
  })
}

process.on("SIGURG", () => {
  if (busy) return
  busy = true
  const window = open
  open = undefined
  void (window === undefined ? start() : stop(window)).finally(() => {
    busy = false
  })
})
