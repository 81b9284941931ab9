/**
 * bench:transfer's report: the table of every window, the fault guard's
 * table, the section of docs/benchmarks.md and the summary rows with their
 * targets (GB/s ≥ 0.6 × memcpy and PING p99 under transfers ≤ 2 × the bare
 * echo, issue 16; the fault guard under 5 %, issue 13).
 */
import { int as intOf, orNa } from "../lib/format.ts"
import {
  BLOCK_BYTES,
  BLOCK_TOKENS,
  BLOCKS_PER_CHUNK,
  CHUNK_BYTES,
  CHUNK_TOKENS,
  DTYPE,
  ELEMENT_BYTES,
  HEAD_SIZE,
  NUM_HEADS,
  NUM_LAYERS
} from "../lib/kvChunks.ts"
import { measuredDate, nodeAndCpu } from "../lib/machine.ts"
import type { SummaryRow } from "../lib/summary.ts"
import type { GuardCost } from "./guardCost.ts"
import { type Measured, type Phase, stagesText, type Window } from "./measure.ts"
import {
  type CacheKind,
  CHUNKS_PER_REQUEST,
  GUARD_TARGET,
  HEADING,
  L1_SIZE_GB,
  LAYER_BYTES,
  MAX_STRETCH,
  MEMCPY_TARGET,
  MEMCPY_WARMUP_COPIES,
  MIN_REQUESTS,
  NUM_BLOCKS,
  PING_INTERVAL_MS,
  REQUEST_BYTES,
  REQUEST_TOKENS,
  RETRIEVE_SET,
  STREAMS,
  WARMUP_S
} from "./shape.ts"

/** One descriptor kind's phases. */
export interface KindReport {
  readonly kind: CacheKind["kind"]
  readonly store: Measured
  readonly retrieve: Measured
}

export interface Report {
  readonly idle: Window
  readonly kinds: ReadonlyArray<KindReport>
  readonly guard: GuardCost
  readonly serverMemory: { rss: number; peak: number }
  readonly serverWarnings: number
}

/** The run's window lengths and how long it waited for the L1 prefault, as the method text states them. */
export interface RunTiming {
  readonly durationS: number
  readonly idleS: number
  readonly prefaultSeconds: number
}

export const f2 = orNa((n) => n.toFixed(2))
export const f3 = orNa((n) => n.toFixed(3))
export const f1 = orNa((n) => n.toFixed(1))
export const int = orNa(intOf)

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

/** The section of docs/benchmarks.md: method, table, details and the guard's cost. */
export const section = (r: Report, t: RunTiming): string => {
  const count = (p: Phase) => `${p.requests} requests (${f2(p.bytes / 2 ** 30)} GiB) in a ${f1(p.seconds)} s window`
  return [
    HEADING,
    "",
    `Measured ${measuredDate()} · ${nodeAndCpu()} · transport ipc · ` +
    `${WARMUP_S} s warm-up then ${t.durationS} s per transfer phase; ${t.idleS} s idle PING.`,
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
    `The bench starts measuring once the server's background L1 prefault is done (waited ${f1(t.prefaultSeconds)} s here),`,
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

/** The rows of the bench summary, each against its target. */
export const summaryRows = (r: Report): Array<SummaryRow> => {
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
