/**
 * `npm run bench:soak [-- --quick | --scale N] [-- --summary FILE]`
 *
 * A long run of mixed traffic against one `mpcache serve`, for a fixed
 * number of requests, watching whether anything in the server grows with
 * them (issue 18, "Long-run checks"). Full counts (the default; `--quick`
 * divides every count by 100 for a smoke run, `--scale N` by N):
 *
 * - 1,000,000 PINGs (raw DEALERs, bench/lib/pingClient.ts);
 * - 200,000 LOOKUP/QUERY_PREFETCH_STATUS/END_SESSION triples (SchedulerAdapter),
 *   each hitting a stored prefix;
 * - 100,000 LOOKUPs never ended: half hit a stored prefix (read locks held
 *   until `--lookup-lock-ttl-seconds`), half ask for a model no one registered;
 * - 50,000 PREPARE_STOREs never committed (an engine-driven context);
 * - 2,000 REGISTER/UNREGISTER cycles (a new WorkerAdapter each);
 * - 500 worker processes (bench/soak/worker.ts) that register a real POSIX-shm
 *   KV cache and are SIGKILLed (their segments unlinked here; the server reaps them).
 *
 * The load runs in child processes (bench/soak/load.ts, one per kind) in ten
 * equal steps; after each step (every 10 % of the run) the bench samples the
 * server's heap after a full GC (bench/lib/heap-probe.ts, preloaded with
 * `--expose-gc`), its RSS (/proc/<pid>/status) and its `/api/status` counters.
 *
 * Figures: the slope of heap used and of RSS against requests after the
 * warm-up (the first 20 %), least squares over the samples at 20 … 100 %,
 * in bytes per 1,000 requests (a request = one wire request: PING 1, triple
 * 3, unended lookup 2, PREPARE 1, register cycle 2, killed worker 1).
 * Targets: heap flat within noise (|slope| ≤ 2 × its standard error, or under
 * 1 MiB over the whole run); every status counter (lookup.pending_jobs,
 * lookup.held_locks, lookup.sessions, engine_driven.pending_*,
 * l1.reserved_objects, native.open_mappings, connected_peers, tracked
 * instances) back to its baseline — taken with the load processes connected
 * and idle before the first step — once the TTLs have run out, and to the
 * empty server's after the load processes closed.
 *
 * With `--write-docs` rewrites the section "## Soak (bench:soak)" of
 * docs/benchmarks.md; with `--summary FILE` writes its rows. A benchmark, never
 * a test: exits 0 when it ran (met or not, unless `--check`: then 1 when a
 * target was missed), 1 on a failure; always stops every child and
 * unlinks every segment it created.
 */
import { readdirSync, rmSync } from "node:fs"
import os from "node:os"
import { parseBenchArgs, usageError } from "../lib/args.ts"
import { startLineChild } from "../lib/children.ts"
import { withDeadline } from "../lib/deadline.ts"
import { int } from "../lib/format.ts"
import { loadText, measuredDate, nodeAndCpu } from "../lib/machine.ts"
import { startProbedServer, serveHelpLists, type HeapSample, type ProbedServer } from "../lib/probedServer.ts"
import { finishBench } from "../lib/outcome.ts"
import { makeResources, runBench } from "../lib/resources.ts"
import { CHUNK_TOKENS } from "./shape.ts"
import type { SummaryRow } from "../lib/summary.ts"
import { secondsSince, sleep } from "../lib/time.ts"
import { startSoakLoad, type RunDone, type SoakLoad, type SoakRole } from "./load.ts"
import type { StatusDocument } from "../../src/schema/Status.ts"

const HEADING = "## Soak (bench:soak)"

const args = parseBenchArgs({ scale: { type: "string" } })
/** Every count is divided by this: 100 with `--quick`, `--scale N` for a run in between. */
const SCALE = args.scale !== undefined
  ? (Number(args.scale) >= 1 ? Number(args.scale) : usageError(`--scale must be a number ≥ 1, got ${args.scale}`))
  : args.quick ? 100 : 1

/** The issue's counts; `--quick` divides each by 100. */
const FULL_COUNTS = { ping: 1_000_000, sessions: 200_000, unended: 100_000, prepare: 50_000, register: 2_000, kill: 500 } as const
type Kind = keyof typeof FULL_COUNTS
const KINDS = Object.keys(FULL_COUNTS) as ReadonlyArray<Kind>
const COUNTS = Object.fromEntries(KINDS.map((k) => [k, Math.round(FULL_COUNTS[k] / SCALE)])) as Record<Kind, number>
/** Wire requests per operation of each kind (the x axis of the slopes). */
const REQUESTS_PER_OP: Record<Kind, number> = { ping: 1, sessions: 3, unended: 2, prepare: 1, register: 2, kill: 1 }
const KIND_TEXT: Record<Kind, string> = {
  ping: "PINGs",
  sessions: "LOOKUP/QUERY/END_SESSION triples",
  unended: "lookups never ended",
  prepare: "PREPAREs never committed",
  register: "register/unregister cycles",
  kill: "SIGKILLed workers"
}
const LOAD_ROLES: ReadonlyArray<SoakRole & Kind> = ["ping", "sessions", "unended", "prepare", "register"]

const STEPS = 10
/** Samples before this step are warm-up: the slopes are fitted over the samples at 20 … 100 %. */
const FIRST_FITTED_STEP = 2
const LOCK_TTL_S = 5
const PREPARE_TTL_S = 5
const DISCONNECT_GRACE_S = 2
const L1_SIZE_GB = 1
/** SIGKILLed workers started at a time (each is a Node process: about a CPU-second to start). */
const KILL_CONCURRENCY = 2
const READY_TIMEOUT_MS = 60_000
const WORKER_READY_TIMEOUT_MS = 60_000
const STOP_TIMEOUT_MS = 15_000
/** A step that takes longer fails the run (the counts bound it; this bounds a stuck one). */
const STEP_TIMEOUT_MS = Math.max(300_000, 1_800_000 / SCALE)
/** How long the counters may take to come back once the load stops: the TTLs, the sweeps and a scan, with slack. */
const SETTLE_TIMEOUT_MS = (LOCK_TTL_S * 1.25 + PREPARE_TTL_S * 1.25 + DISCONNECT_GRACE_S + 15) * 1000
const MIB = 2 ** 20

const log = (line: string): void => {
  process.stderr.write(`${line}\n`)
}

const resources = makeResources(`mpcache-soak-${process.pid}-${Date.now().toString(36)}`, { stopTimeoutMs: STOP_TIMEOUT_MS, onSignal: "kill" })
const tag = resources.tag
const endpoint = resources.ipcEndpoint()
/** Every segment of the run starts with the tag: the load processes' and the killed workers'. */
const unlinkSegments = (prefix: string): void => {
  try {
    for (const name of readdirSync("/dev/shm")) if (name.startsWith(prefix)) rmSync(`/dev/shm/${name}`, { force: true })
  } catch {
    // nothing to clean where /dev/shm cannot be listed
  }
}
resources.onCleanup(() => unlinkSegments(tag))

/** `total` split over `parts` steps: step i (1-based) gets its share, the shares add up exactly. */
const share = (total: number, step: number): number => Math.floor((step * total) / STEPS) - Math.floor(((step - 1) * total) / STEPS)

// ---------------------------------------------------------------- counters

/** The status counters that must come back to their baseline. */
const COUNTERS = {
  "lookup.pending_jobs": (s: StatusDocument) => s.lookup.pending_jobs,
  "lookup.held_locks": (s: StatusDocument) => s.lookup.held_locks,
  "lookup.sessions": (s: StatusDocument) => s.lookup.sessions,
  "engine_driven.pending_stores": (s: StatusDocument) => s.engine_driven.pending_stores,
  "engine_driven.pending_retrieves": (s: StatusDocument) => s.engine_driven.pending_retrieves,
  "l1.reserved_objects": (s: StatusDocument) => s.l1.reserved_objects,
  "native.open_mappings": (s: StatusDocument) => s.native.open_mappings,
  "connected_peers": (s: StatusDocument) => s.connected_peers,
  "tracked_instances": (s: StatusDocument) => s.worker_liveness.tracked_instances
} as const
type Counter = keyof typeof COUNTERS
const COUNTER_NAMES = Object.keys(COUNTERS) as ReadonlyArray<Counter>
type Counters = Record<Counter, number>
const countersOf = (s: StatusDocument): Counters =>
  Object.fromEntries(COUNTER_NAMES.map((c) => [c, COUNTERS[c](s)])) as Counters
const differing = (a: Counters, b: Counters): Array<Counter> => COUNTER_NAMES.filter((c) => a[c] !== b[c])

/** One sample: after step `step` (0 = the baseline), `requests` wire requests into the run. */
interface Sample {
  readonly step: number
  readonly requests: number
  readonly seconds: number
  readonly heap: HeapSample
  readonly rss: number
  readonly counters: Counters
  readonly l1Objects: number
}

const sample = async (s: ProbedServer, step: number, requests: number, seconds: number): Promise<Sample> => {
  const heap = await s.heap()
  const rss = s.rss().rss
  const status = await s.status()
  return { step, requests, seconds, heap, rss, counters: countersOf(status), l1Objects: status.l1.objects }
}

/** Polls the status until `target(counters)` holds or `timeoutMs` passed; returns the last counters and the wait, s. */
const settle = async (s: ProbedServer, target: (c: Counters) => boolean, timeoutMs: number): Promise<{ counters: Counters; seconds: number }> => {
  const t0 = process.hrtime.bigint()
  for (;;) {
    const counters = countersOf(await s.status())
    if (target(counters) || secondsSince(t0) * 1000 > timeoutMs) return { counters, seconds: secondsSince(t0) }
    await sleep(250)
  }
}

// ------------------------------------------------------------------- kills

interface KillTally {
  killed: number
  readonly instanceIds: Set<string>
}

let workerSerial = 0

/** Starts `count` soak workers (KILL_CONCURRENCY at a time), SIGKILLs each once registered, unlinks its segments. */
const killWorkers = async (count: number, tally: KillTally): Promise<void> => {
  let next = 0
  const one = async (): Promise<void> => {
    while (next < count) {
      next++
      const prefix = `${tag}-k${workerSerial++}`
      const worker = startLineChild("soak worker", ["bench/soak/worker.ts", endpoint, prefix], resources.children)
      try {
        const m = await worker.waitFor(/"event":"registered","instanceId":"(\d+)"/, WORKER_READY_TIMEOUT_MS, "stdout")
        tally.instanceIds.add(m[1]!)
        worker.process.kill("SIGKILL")
        await worker.exited
        tally.killed++
      } finally {
        if (worker.process.exitCode === null && worker.process.signalCode === null) worker.process.kill("SIGKILL")
        unlinkSegments(`${prefix}-L`)
      }
    }
  }
  await Promise.all(Array.from({ length: Math.min(KILL_CONCURRENCY, count) }, one))
}

// ------------------------------------------------------------------ slopes

/** Least squares y = a + b·x: slope b, its standard error, the residuals' standard deviation. */
interface Fit {
  readonly slope: number
  readonly slopeSe: number
  readonly residualSd: number
}

const fit = (xs: ReadonlyArray<number>, ys: ReadonlyArray<number>): Fit => {
  const n = xs.length
  const mx = xs.reduce((a, b) => a + b, 0) / n
  const my = ys.reduce((a, b) => a + b, 0) / n
  let sxx = 0
  let sxy = 0
  for (let i = 0; i < n; i++) {
    sxx += (xs[i]! - mx) ** 2
    sxy += (xs[i]! - mx) * (ys[i]! - my)
  }
  const slope = sxy / sxx
  const a = my - slope * mx
  const sse = xs.reduce((acc, x, i) => acc + (ys[i]! - (a + slope * x)) ** 2, 0)
  const residualSd = n > 2 ? Math.sqrt(sse / (n - 2)) : Number.NaN
  return { slope, slopeSe: residualSd / Math.sqrt(sxx), residualSd }
}

// ------------------------------------------------------------------ report

interface Report {
  readonly prepareTtl: boolean
  readonly samples: ReadonlyArray<Sample>
  readonly settled: { readonly counters: Counters; readonly seconds: number; readonly heap: HeapSample; readonly rss: number }
  readonly empty: Counters
  readonly teardown: { readonly counters: Counters; readonly seconds: number; readonly heap: HeapSample }
  readonly totals: Record<Kind, number>
  readonly misses: number
  readonly reserved: number
  readonly pingFirst: RunDone["ping"]
  readonly pingLast: RunDone["ping"]
  readonly kindSeconds: Record<Kind, number>
  readonly reaps: Record<string, number>
  readonly warnings: { readonly count: number; readonly kinds: ReadonlyArray<readonly [string, number]> }
  readonly seconds: number
  readonly loadBefore: ReadonlyArray<number>
  readonly loadAfter: ReadonlyArray<number>
}

const mib = (bytes: number): string => (bytes / MIB).toFixed(1)
const perK = (bytesPerRequest: number): string => `${int(bytesPerRequest * 1000)}`

const heapFit = (r: Report) => {
  const fitted = r.samples.filter((s) => s.step >= FIRST_FITTED_STEP)
  const xs = fitted.map((s) => s.requests)
  return {
    fitted,
    heap: fit(xs, fitted.map((s) => s.heap.heapUsed)),
    rss: fit(xs, fitted.map((s) => s.rss)),
    span: xs.at(-1)! - xs[0]!
  }
}

const heapFlat = (f: Fit, totalRequests: number): boolean => Math.abs(f.slope) <= 2 * f.slopeSe || Math.abs(f.slope * totalRequests) < MIB

const section = (r: Report): string => {
  const f = heapFit(r)
  const total = r.samples.at(-1)!.requests
  const base = r.samples[0]!.counters
  const notBack = differing(r.settled.counters, base)
  const notEmpty = differing(r.teardown.counters, r.empty)
  const row = (s: Sample) =>
    `| ${s.step === 0 ? "baseline" : `${s.step * 10} %`} | ${int(s.requests)} | ${s.seconds.toFixed(0)} | ${mib(s.heap.heapUsed)} | ${mib(s.rss)} | ` +
    COUNTER_NAMES.map((c) => int(s.counters[c])).join(" | ") + ` | ${int(s.l1Objects)} |`
  const countersRow = (name: string, c: Counters, against: Counters) =>
    `| ${name} | | | | | ` + COUNTER_NAMES.map((k) => (c[k] === against[k] ? int(c[k]) : `**${int(c[k])}**`)).join(" | ") + " | |"
  const p = (x: RunDone["ping"]) => (x === undefined ? "n/a" : `p50 ${int(x.p50Us)} µs, p99 ${int(x.p99Us)} µs`)
  return [
    HEADING,
    "",
    `Measured ${measuredDate()} · ${nodeAndCpu()} · transport ipc · ${SCALE === 1 ? "full counts" : `${args.quick ? "`--quick`" : `\`--scale ${SCALE}\``} (every count ÷ ${SCALE})`} · ` +
    `${r.seconds.toFixed(0)} s · load average ${loadText(r.loadBefore)} before, ${loadText(r.loadAfter)} after.`,
    "",
    `Load (${int(total)} wire requests): ` + KINDS.map((k) => `${int(r.totals[k])} ${KIND_TEXT[k]}`).join(", ") + ".",
    "",
    `Method: \`mpcache serve --chunk-size ${CHUNK_TOKENS} --l1-size-gb ${L1_SIZE_GB} --no-l1-prefault --lookup-lock-ttl-seconds ${LOCK_TTL_S} ` +
    `--worker-disconnect-grace-seconds ${DISCONNECT_GRACE_S}${r.prepareTtl ? ` --prepare-ttl-seconds ${PREPARE_TTL_S}` : ""}\` in a child process`,
    "under `node --expose-gc` with `bench/lib/heap-probe.ts` preloaded (on SIGWINCH: two full GCs, then `process.memoryUsage()`).",
    "The load comes from one child process per kind (`bench/soak/load.ts`): raw PING DEALERs; the SchedulerAdapter",
    "(triples, and lookups never ended: half hit a stored prefix and keep its read locks until the lock TTL, half ask",
    "for a model no one registered); an engine-driven context sending PREPARE_STORE of fresh one-chunk keys, never",
    "committed; new WorkerAdapters registering and unregistering one PagedKvCache; and worker processes",
    `(\`bench/soak/worker.ts\`, ${KILL_CONCURRENCY} at a time) that register a POSIX-shm KV cache and are SIGKILLed (their`,
    "segments unlinked by the bench). Tiny model (2 layers × 2 × 16, float16, 16-token chunks of 4 KiB), so the run",
    "measures the server's bookkeeping, not its copies. Ten equal steps, all kinds at once; after each step (every",
    "10 % of the run) the heap after GC, the RSS (/proc) and `/api/status` are sampled with the load idle. The",
    `baseline is taken with every load process connected and idle, before the first step. Slopes: least squares over`,
    `the samples at ${FIRST_FITTED_STEP * 10} … 100 % (the first ${FIRST_FITTED_STEP * 10} % is warm-up), bytes per 1,000 wire requests.`,
    ...(r.prepareTtl
      ? []
      : [
        "",
        "TODO: this server's `serve --help` does not list `--prepare-ttl-seconds` (issue 18 defect 2 is added on",
        "another branch), so the soak ran without it: PREPAREs never committed stay reserved while their context lives."
      ]),
    "",
    `| sample | requests | s | heap used MiB | RSS MiB | ${COUNTER_NAMES.join(" | ")} | l1.objects |`,
    `|---|---:|---:|---:|---:|${COUNTER_NAMES.map(() => "---:|").join("")}---:|`,
    ...r.samples.map(row),
    countersRow(`settled (${r.settled.seconds.toFixed(1)} s after the last step)`, r.settled.counters, base),
    countersRow(`after the load processes closed (${r.teardown.seconds.toFixed(1)} s)`, r.teardown.counters, r.empty),
    "",
    `**Heap slope after warm-up: ${perK(f.heap.slope)} B per 1,000 requests** (standard error ${perK(f.heap.slopeSe)}; residual sd ` +
    `${mib(f.heap.residualSd)} MiB; ${mib(f.heap.slope * f.span)} MiB over the fitted ${int(f.span)} requests) — ` +
    `${heapFlat(f.heap, total) ? "flat within noise" : f.heap.slope > 0 ? "**grows**" : "**shrinks** (not flat: a release after warm-up)"}. RSS slope: ${perK(f.rss.slope)} B per 1,000 requests ` +
    `(standard error ${perK(f.rss.slopeSe)}; RSS includes the L1 pages the run touched). Heap settled ${mib(r.settled.heap.heapUsed)} MiB (RSS ${mib(r.settled.rss)} MiB); after the load processes closed ${mib(r.teardown.heap.heapUsed)} MiB.`,
    "",
    `Counters settled (load processes still connected, ${r.settled.seconds.toFixed(1)} s after the last step): ` +
    (notBack.length === 0 ? "**all back to the baseline**" : `**not back: ${notBack.map((c) => `${c} ${r.settled.counters[c]} (baseline ${base[c]})`).join(", ")}**`) +
    `. After the load processes closed: ` +
    (notEmpty.length === 0 ? "all at the empty server's values" : `**not empty: ${notEmpty.map((c) => `${c} ${r.teardown.counters[c]} (empty ${r.empty[c]})`).join(", ")}**`) + ".",
    "",
    `Lookups that missed a stored prefix: ${int(r.misses)}. Chunks reserved by the PREPAREs: ${int(r.reserved)}. ` +
    `Reaps: ${Object.entries(r.reaps).map(([k, v]) => `${k} ${v}`).join(", ") || "none"} (killed ${int(r.totals.kill)}). ` +
    `PING round trips, first step ${p(r.pingFirst)}; last step ${p(r.pingLast)}. ` +
    `Seconds of load per kind (summed over the steps): ${KINDS.map((k) => `${k} ${r.kindSeconds[k].toFixed(0)}`).join(", ")}. ` +
    `Server WARN/ERROR lines: ${int(r.warnings.count)}` +
    (r.warnings.kinds.length === 0 ? "." : ` — ${r.warnings.kinds.map(([k, n]) => `${int(n)} × "${k}"`).join("; ")}.`),
    "",
    "Reproduce: `npm run bench:soak` (full counts; `-- --quick` divides every count by 100, `-- --scale N` by N).",
    ""
  ].join("\n")
}

const summaryRows = (r: Report): Array<SummaryRow> => {
  const f = heapFit(r)
  const total = r.samples.at(-1)!.requests
  const base = r.samples[0]!.counters
  const notBack = differing(r.settled.counters, base)
  const notEmpty = differing(r.teardown.counters, r.empty)
  return [
    {
      bench: "soak",
      figure: `server heap slope after warm-up, ${int(total)} mixed requests${SCALE === 1 ? "" : ` (counts ÷ ${SCALE})`}`,
      measured: `${perK(f.heap.slope)} B / 1,000 requests`,
      reference: `standard error ${perK(f.heap.slopeSe)}; heap ${mib(f.fitted[0]!.heap.heapUsed)} → ${mib(f.fitted.at(-1)!.heap.heapUsed)} MiB`,
      ratio: null,
      target: "flat within noise (|slope| ≤ 2 SE or < 1 MiB per run)",
      met: heapFlat(f.heap, total)
    },
    {
      bench: "soak",
      figure: "server RSS slope after warm-up",
      measured: `${perK(f.rss.slope)} B / 1,000 requests`,
      reference: `RSS ${mib(f.fitted[0]!.rss)} → ${mib(f.fitted.at(-1)!.rss)} MiB`,
      ratio: null,
      target: "report",
      met: null
    },
    {
      bench: "soak",
      figure: "status counters back to baseline after the soak",
      measured: notBack.length === 0 && notEmpty.length === 0
        ? "all back"
        : [...notBack.map((c) => `${c} ${r.settled.counters[c]} (was ${base[c]})`), ...notEmpty.map((c) => `${c} ${r.teardown.counters[c]} after close`)].join(", "),
      reference: `${COUNTER_NAMES.length} counters${r.prepareTtl ? "" : "; no --prepare-ttl-seconds in this server"}`,
      ratio: null,
      target: "every counter at its baseline",
      met: notBack.length === 0 && notEmpty.length === 0
    }
  ]
}

// -------------------------------------------------------------------- main

const main = async (): Promise<void> => {
  const t0 = process.hrtime.bigint()
  const loadBefore = os.loadavg()
  const prepareTtl = await serveHelpLists("--prepare-ttl-seconds")
  if (!prepareTtl) log("note: `serve --help` lists no --prepare-ttl-seconds; the soak runs without it (TODO in the report)")
  const s = await startProbedServer(endpoint, [
    "--chunk-size",
    String(CHUNK_TOKENS),
    "--l1-size-gb",
    String(L1_SIZE_GB),
    "--no-l1-prefault",
    "--lookup-lock-ttl-seconds",
    String(LOCK_TTL_S),
    "--worker-disconnect-grace-seconds",
    String(DISCONNECT_GRACE_S),
    ...(prepareTtl ? ["--prepare-ttl-seconds", String(PREPARE_TTL_S)] : [])
  ], resources.children)
  const guard = <A>(p: Promise<A>): Promise<A> => Promise.race([p, s.exited])
  const reaps: Record<string, number> = {}
  const warningKinds = new Map<string, number>()
  s.child.onLine((line) => {
    const m = line.match(/reaped instance \d+: .*\(reason (\w+)\)/)
    if (m !== null) reaps[m[1]!] = (reaps[m[1]!] ?? 0) + 1
    const w = line.match(/^\{"message":"([^"]*)","level":"(WARN|WARNING|ERROR|FATAL)"/)
    // Grouped by message with the numbers taken out: one row per kind of warning.
    if (w !== null) {
      const kind = `${w[2]} ${w[1]!.replace(/\d+(\.\d+)?/g, "N").slice(0, 120)}`
      warningKinds.set(kind, (warningKinds.get(kind) ?? 0) + 1)
    }
  })
  log(`server up (${endpoint}, ${s.httpUrl}, pid ${s.pid}); counts: ${KINDS.map((k) => `${k} ${COUNTS[k]}`).join(", ")}`)
  const empty = countersOf(await s.status())

  const loads = new Map<SoakRole, SoakLoad>(LOAD_ROLES.map((role) => [role, startSoakLoad(role, endpoint, tag, resources.children)]))
  await guard(withDeadline(Promise.all([...loads.values()].map((l) => l.ready)), READY_TIMEOUT_MS, "the load processes' setup"))
  await sleep(1_000) // let the registrations' first heartbeats land before the baseline
  const samples: Array<Sample> = [await sample(s, 0, 0, secondsSince(t0))]
  log(`baseline: heap ${mib(samples[0]!.heap.heapUsed)} MiB, RSS ${mib(samples[0]!.rss)} MiB, ${JSON.stringify(samples[0]!.counters)}`)

  const totals = Object.fromEntries(KINDS.map((k) => [k, 0])) as Record<Kind, number>
  const kindSeconds = Object.fromEntries(KINDS.map((k) => [k, 0])) as Record<Kind, number>
  const tally: KillTally = { killed: 0, instanceIds: new Set() }
  let requests = 0
  let misses = 0
  let reserved = 0
  let pingFirst: RunDone["ping"]
  let pingLast: RunDone["ping"]
  for (let step = 1; step <= STEPS; step++) {
    const stepT0 = process.hrtime.bigint()
    const runs = LOAD_ROLES.map(async (role) => {
      const n = share(COUNTS[role], step)
      const done = n === 0 ? undefined : await loads.get(role)!.run(n)
      totals[role] += n
      kindSeconds[role] += done?.seconds ?? 0
      misses += done?.misses ?? 0
      reserved += done?.reserved ?? 0
      if (role === "ping" && done?.ping !== undefined) {
        pingFirst ??= done.ping
        pingLast = done.ping
      }
    })
    const kills = (async () => {
      const n = share(COUNTS.kill, step)
      const k0 = process.hrtime.bigint()
      await killWorkers(n, tally)
      totals.kill += n
      kindSeconds.kill += secondsSince(k0)
    })()
    const failedLoad = Promise.race([...loads.values()].map((l) => l.failed))
    await guard(withDeadline(Promise.race([Promise.all([...runs, kills]), failedLoad]), STEP_TIMEOUT_MS, `step ${step}`))
    requests = KINDS.reduce((n, k) => n + totals[k] * REQUESTS_PER_OP[k], 0)
    const smp = await guard(sample(s, step, requests, secondsSince(t0)))
    samples.push(smp)
    log(
      `${step * 10} %: ${int(requests)} requests, step ${secondsSince(stepT0).toFixed(1)} s; heap ${mib(smp.heap.heapUsed)} MiB, ` +
        `RSS ${mib(smp.rss)} MiB; ${COUNTER_NAMES.map((c) => `${c} ${smp.counters[c]}`).join(", ")}`
    )
  }

  // The load is idle; the TTLs, the lock sweeper and the reaper bring everything back.
  const base = samples[0]!.counters
  const settledCounters = await guard(settle(s, (c) => differing(c, base).length === 0, SETTLE_TIMEOUT_MS))
  const settledHeap = await guard(s.heap())
  const settled = { ...settledCounters, heap: settledHeap, rss: s.rss().rss }
  log(`settled after ${settled.seconds.toFixed(1)} s: ${JSON.stringify(settled.counters)}; heap ${mib(settledHeap.heapUsed)} MiB`)

  await Promise.all([...loads.values()].map((l) => l.stop(STOP_TIMEOUT_MS)))
  const teardown = await guard(settle(s, (c) => differing(c, empty).length === 0, DISCONNECT_GRACE_S * 1000 + 10_000))
  const teardownHeap = await guard(s.heap())
  log(`after the load processes closed (${teardown.seconds.toFixed(1)} s): ${JSON.stringify(teardown.counters)}; heap ${mib(teardownHeap.heapUsed)} MiB`)

  const report: Report = {
    prepareTtl,
    samples,
    settled,
    empty,
    teardown: { ...teardown, heap: teardownHeap },
    totals,
    misses,
    reserved,
    pingFirst,
    pingLast,
    kindSeconds,
    reaps,
    warnings: { count: s.warnings.count, kinds: [...warningKinds].sort((a, b) => b[1] - a[1]).slice(0, 5) },
    seconds: secondsSince(t0),
    loadBefore,
    loadAfter: os.loadavg()
  }
  if (s.warnings.count > 0) log(`the server logged ${s.warnings.count} WARN/ERROR line(s); first:\n${s.warnings.first.join("\n")}`)
  await resources.cleanup()
  process.exitCode = finishBench(args, { heading: HEADING, body: section(report), rows: summaryRows(report) })
}

await runBench("bench:soak", main, resources)
