/**
 * `mpcache serve` as the long-run benches (bench:soak, bench:chaos) run it:
 * a child process with bench/lib/heap-probe.ts preloaded under `--expose-gc`,
 * so that its heap after a full GC can be read at any moment (SIGWINCH),
 * its RSS from /proc/<pid>/status, and its `GET /api/status` decoded with
 * the schema (src/schema/Status.ts). Nothing is added to the server.
 */
import { readFileSync } from "node:fs"
import { Effect } from "effect"
import { decodeStatusDocument, type StatusDocument } from "../../src/schema/Status.ts"
import { runNode, startLineChild, type LineChild, type Tracker } from "./children.ts"

/** The server's `process.memoryUsage()` right after a full GC, bytes. */
export interface HeapSample {
  readonly heapUsed: number
  readonly heapTotal: number
  readonly external: number
  readonly arrayBuffers: number
  readonly rss: number
}

export interface ProbedServer {
  readonly child: LineChild
  readonly pid: number
  readonly endpoint: string
  readonly httpUrl: string
  /** Full GC, then the heap (bench/lib/heap-probe.ts); rejects after `timeoutMs` without an answer. */
  readonly heap: (timeoutMs?: number) => Promise<HeapSample>
  /** VmRSS and VmHWM of the server now, bytes (/proc). */
  readonly rss: () => { readonly rss: number; readonly peak: number }
  /** `GET /api/status`, decoded. */
  readonly status: () => Promise<StatusDocument>
  /** WARN/ERROR log lines so far, and the first few. */
  readonly warnings: { count: number; readonly first: Array<string> }
  /** Rejects when the server exits: race anything that waits on it against this. */
  readonly exited: Promise<never>
}

const READY_TIMEOUT_MS = 60_000
const HEAP_TIMEOUT_MS = 10_000

/** Whether `mpcache serve --help` lists `flag` (e.g. "--prepare-ttl-seconds"): flags other branches add may be missing. */
export const serveHelpLists = async (flag: string): Promise<boolean> => {
  const { stdout } = await runNode(["src/cli/main.ts", "serve", "--help"], true)
  return new RegExp(`(^|\\s)${flag.replace(/[-/\\^$*+?.()|[\]{}]/g, "\\$&")}(\\s|$)`, "m").test(stdout)
}

/** Un-labelled Prometheus samples (a counter never updated yet is absent and reads 0). */
export const metricValues = async (httpUrl: string, names: ReadonlyArray<string>): Promise<Record<string, number>> => {
  const text = await (await fetch(`${httpUrl}/metrics`)).text()
  const out: Record<string, number> = {}
  for (const name of names) {
    const line = text.split("\n").find((l) => l.startsWith(`${name} `))
    out[name] = line === undefined ? 0 : Number(line.slice(line.lastIndexOf(" ") + 1))
  }
  return out
}

/**
 * Starts `mpcache serve --endpoint <endpoint> --http-port 0 --log-format
 * json …serveFlags` with the heap probe; resolves once both frontends listen.
 */
export const startProbedServer = async (
  endpoint: string,
  serveFlags: ReadonlyArray<string>,
  tracker: Tracker
): Promise<ProbedServer> => {
  const argv = [
    "--expose-gc",
    "--import",
    "./bench/lib/heap-probe.ts",
    "src/cli/main.ts",
    "serve",
    "--endpoint",
    endpoint,
    "--http-port",
    "0",
    "--log-format",
    "json",
    ...serveFlags
  ]
  const child = startLineChild("mpcache server", argv, tracker)
  const warnings = { count: 0, first: [] as Array<string> }
  const exited = child.exited.then(({ code, signal }): never => {
    throw new Error(`the mpcache server exited (code ${code}, signal ${signal}); output:\n${child.tail()}`)
  })
  exited.catch(() => {}) // observed where it is raced
  const heapWaiters: Array<(h: HeapSample) => void> = []
  child.onLine((line) => {
    if (line.startsWith("{\"bench_heap\"")) {
      const h = (JSON.parse(line) as {
        bench_heap: { heap_used: number; heap_total: number; external: number; array_buffers: number; rss: number }
      }).bench_heap
      heapWaiters.shift()?.({ heapUsed: h.heap_used, heapTotal: h.heap_total, external: h.external, arrayBuffers: h.array_buffers, rss: h.rss })
      return
    }
    if (/"level":"(WARN|WARNING|ERROR|FATAL)"/.test(line)) {
      warnings.count++
      if (warnings.first.length < 8) warnings.first.push(line.slice(0, 400))
    }
  })
  const [, http] = await Promise.race([
    Promise.all([
      child.waitFor(/MQ server listening on/, READY_TIMEOUT_MS),
      child.waitFor(/HTTP frontend listening on (http:\/\/[^\s"]+)/, READY_TIMEOUT_MS)
    ]),
    exited
  ])
  const pid = child.process.pid
  if (pid === undefined) throw new Error(`the mpcache server has no pid; output:\n${child.tail()}`)
  const httpUrl = http[1]!
  const heap = (timeoutMs = HEAP_TIMEOUT_MS): Promise<HeapSample> =>
    new Promise((resolve, reject) => {
      const waiter = (h: HeapSample) => {
        clearTimeout(timer)
        resolve(h)
      }
      const timer = setTimeout(() => {
        heapWaiters.splice(heapWaiters.indexOf(waiter), 1)
        reject(new Error(`the server's heap probe did not answer within ${timeoutMs} ms`))
      }, timeoutMs)
      heapWaiters.push(waiter)
      if (!child.process.kill("SIGWINCH")) waiter({ heapUsed: Number.NaN, heapTotal: Number.NaN, external: Number.NaN, arrayBuffers: Number.NaN, rss: Number.NaN })
    })
  const rss = () => {
    const text = readFileSync(`/proc/${pid}/status`, "utf8")
    const kib = (field: string) => Number(new RegExp(`^${field}:\\s+(\\d+) kB`, "m").exec(text)?.[1] ?? Number.NaN) * 1024
    return { rss: kib("VmRSS"), peak: kib("VmHWM") }
  }
  const status = async (): Promise<StatusDocument> => {
    const json: unknown = await (await fetch(`${httpUrl}/api/status`)).json()
    return Effect.runPromise(decodeStatusDocument(json))
  }
  return { child, pid, endpoint, httpUrl, heap, rss, status, warnings, exited }
}
