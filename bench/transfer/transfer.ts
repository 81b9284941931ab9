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
 * Prints a table; `--write-docs` rewrites the section "## STORE and RETRIEVE
 * throughput (bench:transfer)" of docs/benchmarks.md. A benchmark, never a
 * test: exits 0 on success (1 with `--check` when a target was missed), 1 on
 * failure, and always stops the server, removes the ipc
 * socket file and unlinks every shared-memory segment it created.
 *
 * Parts (each benchmark a folder, issue 25 item 5): shape.ts (constants),
 * server.ts (the server and echo children), worker.ts (the worker in this
 * process), measure.ts (windows, phases, memcpy), report.ts (table, section,
 * summary rows), guardCost.ts; this file runs them in order.
 */
import type { ChildProcess } from "node:child_process"
import path from "node:path"
import { type AddonMapping, loadNativeAddon } from "../../src/native/Native.ts"
import type { PagedKvCache } from "../../src/services/client/PagedKvCache.ts"
import { validateKvCaches } from "../../src/services/kv/KvCacheLayout.ts"
import { chunkRanges, segmentPlan } from "../../src/services/server/internal/CopyPlan.ts"
import { parseBenchArgs, positiveSeconds } from "../lib/args.ts"
import { BLOCKS_PER_CHUNK, CHUNK_BYTES, CHUNK_TOKENS, NUM_LAYERS, segmentNamesOf, unlinkSegments } from "../lib/kvChunks.ts"
import { stopChild } from "../lib/children.ts"
import { orNa } from "../lib/format.ts"
import { awaitL1Prefault } from "../lib/l1Prefault.ts"
import { freeGiB, memAvailableGiB, processMemoryGiB } from "../lib/machine.ts"
import { finishBench } from "../lib/outcome.ts"
import { makeResources } from "../lib/resources.ts"
import { type GuardCost, measureGuardCost } from "./guardCost.ts"
import { makeMeasurements, timed, type Window, withMemcpy } from "./measure.ts"
import { type KindReport, type Report, section, summaryRows } from "./report.ts"
import { type Server, startEcho, startServer } from "./server.ts"
import {
  type CacheKind,
  destBlocks,
  FULL_PHASE_S,
  GUARD_ROUNDS_FULL,
  GUARD_ROUNDS_QUICK,
  HEADING,
  KINDS,
  L1_SIZE_GB,
  LAYER_BYTES,
  PREFAULT_TIMEOUT_MS,
  QUICK_IDLE_S,
  QUICK_PHASE_S,
  REQUEST_BYTES,
  REQUEST_TOKENS,
  RETRIEVE_SET,
  SET_BASE,
  sourceBlocks,
  STOP_TIMEOUT_MS,
  STREAMS,
  tokensFor
} from "./shape.ts"
import { makeWorkerHost, verify, type Worker, type WorkerHost } from "./worker.ts"

type Measurements = ReturnType<typeof makeMeasurements>

const f1 = orNa((n) => n.toFixed(1))
const f2 = orNa((n) => n.toFixed(2))
const f3 = orNa((n) => n.toFixed(3))

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
const host = makeWorkerHost(endpoint, tag)
const measurements = makeMeasurements({ endpoint, echoEndpoint, durationS, idleS, log })

/** SIGTERM (graceful: the server unmaps and writes its CPU profile), SIGKILL if it hangs. */
const stopServer = (): Promise<void> => serverChild === undefined ? Promise.resolve() : stopChild(serverChild, STOP_TIMEOUT_MS)

// ------------------------------------------------------------------ measurements

/**
 * The fault guard's cost on the cpu_shm cache: the server's copy job of one chunk (stream 0's first 16
 * source blocks, the server's copy plan over every layer's segment) with and without the guard.
 */
const guardCost = async (cache: PagedKvCache, rounds: number): Promise<GuardCost> => {
  const validated = validateKvCaches(cache.descriptors, CHUNK_TOKENS)
  if ("error" in validated) throw new Error(`the bench's KV cache does not validate: ${validated.error}`)
  const segments = segmentPlan(validated.layers)
  const ranges = chunkRanges(validated.geometry, validated.layers, CHUNK_TOKENS, sourceBlocks(0).slice(0, BLOCKS_PER_CHUNK), 0, segments)
  const addon = loadNativeAddon()
  const mappings: Array<AddonMapping> = []
  try {
    for (const name of segments.names) mappings.push(addon.openMapping(name, LAYER_BYTES))
    const job = { mappings, ranges, buffer: Buffer.alloc(CHUNK_BYTES) }
    return await measureGuardCost(addon, job, rounds)
  } finally {
    await Promise.all(mappings.map((m) => m.close()))
  }
}

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

/** One kind's phases with a worker of its own: STORE, CLEAR + the RETRIEVE set, RETRIEVE, the byte check. */
const measureKind = async (
  m: Measurements,
  host: WorkerHost,
  serial: { next: number },
  s: Server,
  w: Worker,
  kind: CacheKind["kind"]
): Promise<KindReport> => {
  const run = host.run
  const guard = <A>(p: Promise<A>): Promise<A> => Promise.race([p, s.exited])
  await guard(w.clear())
  log(`STORE (${kind}) …`)
  const storePhase = await m.phase(s, `STORE (${kind})`, async (stream, _i, stages) => {
    const n = serial.next++
    const request = { requestId: `store-${n}`, tokenIds: tokensFor(n), start: 0, end: REQUEST_TOKENS, blockIds: sourceBlocks(stream) }
    const ok = await timed(stages, "STORE", () => run(w.adapter.store(request)))
    if (!ok) throw new Error(`STORE ${n} answered ok = false; server output:\n${s.tail()}`)
    return REQUEST_BYTES
  })
  const store = withMemcpy(storePhase, log)

  log(`CLEAR, then STORE the RETRIEVE set (${RETRIEVE_SET} requests) …`)
  await guard(w.clear())
  for (let r = 0; r < RETRIEVE_SET; r++) {
    const request = { requestId: `set-${r}`, tokenIds: tokensFor(SET_BASE + r), start: 0, end: REQUEST_TOKENS, blockIds: sourceBlocks(r % STREAMS) }
    if (!(await guard(run(w.adapter.store(request))))) throw new Error(`STORE of set request ${r} answered ok = false`)
  }

  log(`RETRIEVE (${kind}) …`)
  const retrievePhase = await m.phase(s, `RETRIEVE (${kind})`, async (stream, i, stages) => {
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
  const retrieve = withMemcpy(retrievePhase, log)
  await guard(verify(host, w, 3, 0))
  log("  one RETRIEVE verified byte for byte")

  for (const [p, counter] of [[store, "mpcache_stored_bytes_total"], [retrieve, "mpcache_retrieved_bytes_total"]] as const) {
    const counted = p.counters[counter]!
    if (Math.abs(counted - p.bytes) > STREAMS * REQUEST_BYTES) log(`  note: the server counted ${counted} bytes (${counter}), the bench ${p.bytes}`)
  }
  return { kind, store, retrieve }
}

const main = async (): Promise<void> => {
  checkRoom()
  await startEcho(echoEndpoint, resources)
  const s = await startServer(endpoint, serverProfDir, resources, (child) => (serverChild = child))
  log(`server up (${endpoint}, ${s.httpUrl}, pid ${s.pid}); ${durationS} s per phase`)
  const prefaultSeconds = await Promise.race([awaitL1Prefault(s.httpUrl, PREFAULT_TIMEOUT_MS, 200), s.exited])
  log(`L1 prefaulted (waited ${f1(prefaultSeconds)} s)`)

  const serial = { next: 0 }
  let idleWindow: Window | undefined
  let guardCostOf: GuardCost | undefined
  const kinds: Array<KindReport> = []
  for (const kind of KINDS) {
    const w = await Promise.race([host.start(kind), s.exited])
    log(`worker registered (${kind.kind}): ${NUM_LAYERS} segments of ${f2(LAYER_BYTES / 2 ** 20)} MiB, filled`)
    if (idleWindow === undefined) {
      log(`PING idle (${idleS} s) …`)
      idleWindow = await measurements.idle(s)
    }
    kinds.push(await measureKind(measurements, host, serial, s, w, kind.kind))
    if (kind.kind === "cpu_shm") {
      log("fault guard: one chunk's copy job with and without the guard …")
      guardCostOf = await guardCost(w.cache, args.full ? GUARD_ROUNDS_FULL : GUARD_ROUNDS_QUICK)
      log(
        `  gather ${f2(guardCostOf.gather.guardedGbps)} GB/s guarded, ${f2(guardCostOf.gather.unguardedGbps)} unguarded (×${f3(guardCostOf.gather.timeRatio)} time); ` +
          `scatter ${f2(guardCostOf.scatter.guardedGbps)} / ${f2(guardCostOf.scatter.unguardedGbps)} (×${f3(guardCostOf.scatter.timeRatio)})`
      )
    }
    await host.stop()
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

  await host.dispose()
  await stopServer()
  process.exitCode = finishBench(args, { heading: HEADING, body: section(report, { durationS, idleS, prefaultSeconds }), rows: summaryRows(report) })
}

try {
  await main()
} catch (error) {
  process.stderr.write(`bench:transfer failed: ${error instanceof Error ? error.stack ?? error.message : String(error)}\n`)
  process.exitCode = 1
  await host.stop().catch(() => {})
  await host.dispose().catch(() => {})
  await stopServer()
} finally {
  resources.cleanupSync()
}
