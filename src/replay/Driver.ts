/**
 * `mpcache replay`: runs a production trace through real worker processes
 * against a real server, with optional worker churn, and checks that every
 * retrieved byte is right and every dead worker's memory is freed.
 *
 * Per request, as an engine would: the scheduler LOOKUPs (and polls the
 * prefetch), a worker RETRIEVEs the hit prefix into its own KV blocks,
 * "computes" the rest, STOREs the new chunks, and the scheduler ends the
 * session. Requests go to idle workers in trace order.
 *
 * With `servers` N > 1 (issue 15 §8) the replay starts N servers, each with
 * its own L1, its own `workers` workers and its own scheduler, all given the
 * same `--l2-url` when one is set; each conversation's turns go round-robin
 * over the servers (Routing.ts), so a turn reuses its conversation's earlier
 * chunks only through the shared L2. The summary then splits the hits by tier
 * (L2 hits from each server's `/metrics`) and compares them with a perfect
 * LRU of the servers' combined capacity.
 */
import { planMemory, readMachineMemory, refusal, type ReplayShape } from "./MemoryPlan.ts"
import { decodeStatusDocument } from "../schema/Status.ts"
import { spawn, type ChildProcess } from "node:child_process"
import { randomUUID } from "node:crypto"
import { readdirSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { fileURLToPath } from "node:url"
import { Clock, Effect, Fiber, Queue, Random, Ref, Schema } from "effect"
import { dtypeBytes } from "../schema/Dtype.ts"
import { makeSchedulerAdapter } from "../services/client/SchedulerAdapter.ts"
import { perfectLruCumulative } from "./LruSim.ts"
import { l2HitChunks, redactUrl } from "./L2Split.ts"
import { ConversationRouter } from "./Routing.ts"
import { KeyFileInvalid, readClientKeys } from "../services/auth/Curve.ts"
import type { CurveKeyFiles, Done, RunRequest, TransferMode, WorkerSettings } from "./Messages.ts"
import { makeRunKeys, type RunKeys } from "./RunKeys.ts"
import { Samples, promCounters } from "./Stats.ts"
import type { ModelPreset } from "./Synth.ts"
import { tokensFor } from "./Synth.ts"
import { readTrace, type TraceIssue, type TraceRequest } from "./Trace.ts"
import { TimelineRecorder, type ReplayTimeline } from "./Timeline.ts"
import { spawnWorker, WorkerDied, type WorkerHandle } from "./WorkerPool.ts"

export interface ReplayOptions {
  readonly tracePath: string
  /** First N usable requests; all when undefined. */
  readonly requests: number | undefined
  /** Requests with more input tokens are skipped (and counted); undefined = none skipped. */
  readonly maxInputTokens: number | undefined
  /** Engine workers per server. */
  readonly workers: number
  /** Servers the replay starts (each its own L1 and workers); 1 without `--servers`. */
  readonly servers: number
  /** Given to every server the replay starts as `--l2-url` (issue 15); undefined: no L2. */
  readonly l2Url: string | undefined
  /** With `l2Url`: every server's `--l2-lookup-timeout-ms`; undefined: the server's default. */
  readonly l2LookupTimeoutMs: number | undefined
  /** How the workers move KV (`--transfer-mode`). */
  readonly transferMode: TransferMode
  /** `cuda`: LMCache-driven workers keep their KV cache in device memory (CUDA IPC); needs a GPU. */
  readonly device: "cpu" | "cuda"
  /** Trace time is divided by this (2 = twice as fast). */
  readonly rate: number
  /** Ignore timestamps: send each request as soon as a worker is free. */
  readonly maxRate: boolean
  readonly model: ModelPreset
  readonly l1SizeGb: number
  /** A running server's ZeroMQ endpoint; undefined = start our own. */
  readonly server: string | undefined
  /** Base URL of that server's HTTP frontend (status, metrics). */
  readonly httpUrl: string
  readonly killEverySeconds: number | undefined
  /** SIGKILL a worker after every this many completed requests (`--kill-every-requests`): chaos driven by the run's progress, so it happens on a fast machine as on a slow one. */
  readonly killEveryRequests?: number | undefined
  readonly pauseEverySeconds: number | undefined
  /** How long a paused worker stays stopped. */
  readonly pauseSeconds: number
  /** Our own server's `--worker-disconnect-grace-seconds`. */
  readonly disconnectGraceSeconds: number
  readonly chunkSizeTokens: number
  readonly blockSizeTokens: number
  readonly heartbeatIntervalMs: number
  /**
   * CURVE (docs/security.md): `"generate"` turns it on for the replay's own
   * server with per-run keys (RunKeys.ts); key files speak it to `server`
   * (a running CURVE server: `--curve-server-public-key-file`,
   * `--curve-secret-key-file`); undefined: off.
   */
  readonly curve: "generate" | CurveKeyFiles | undefined
  /** Progress output: a bar on a terminal, plain lines otherwise, nothing when false. */
  readonly progress: boolean
}

/** The replay could not run (server or workers failed to start). */
export class ReplayError extends Schema.TaggedError<ReplayError>()("ReplayError", { message: Schema.String }) {}

/** Everything `mpcache replay` reports (the `--json` document). */
export interface ReplaySummary {
  readonly trace: string
  readonly requests: number
  readonly failed_requests: number
  /** Why requests failed (first 20). */
  readonly failures: ReadonlyArray<{ readonly request: number; readonly message: string }>
  readonly retried_requests: number
  /** Workers per server. */
  readonly workers: number
  /** Servers the requests were spread over (issue 15 §8). */
  readonly servers: number
  /** The L2 every server shared, password removed; null: none. */
  readonly l2_url: string | null
  readonly transfer_mode: TransferMode
  readonly model: string
  readonly chunk_size: number
  readonly chunks: { readonly looked_up: number; readonly hit: number; readonly stored: number; readonly retrieved: number }
  readonly hit_ratio: number
  /**
   * Hit chunks by tier: `l2` is what the servers' LOOKUPs found in L2 past their L1 prefix (the delta of
   * `mpcache_l2_hits_total` over the run, summed over servers), `l1` the rest of `chunks.hit`.
   */
  readonly hits_by_tier: { readonly l1: number; readonly l2: number }
  /** `hits_by_tier` / `chunks.looked_up`. */
  readonly hit_ratio_l1: number
  readonly hit_ratio_l2: number
  /** A perfect LRU of one server's L1 capacity over the whole trace. */
  readonly perfect_lru_hit_ratio: number
  /** A perfect LRU of the servers' combined capacity (`servers` × `l1_capacity_chunks`) over the whole trace. */
  readonly perfect_lru_combined_hit_ratio: number
  /** Per server, in start order: its share of the requests and of the hits. */
  readonly per_server: ReadonlyArray<{
    readonly requests: number
    readonly looked_up: number
    readonly hit: number
    readonly l2_hit: number
  }>
  /** One server's L1 capacity. */
  readonly l1_capacity_chunks: number
  readonly gb_stored: number
  readonly gb_retrieved: number
  readonly duration_seconds: number
  readonly requests_per_second: number
  /** Per stage of a request (ms): median, 99th percentile and mean (the means tell where a request's time goes). */
  readonly latency_ms: Record<
    "lookup" | "retrieve" | "compute" | "store" | "request",
    { readonly p50: number; readonly p99: number; readonly mean: number }
  >
  readonly churn: { readonly killed: number; readonly paused: number; readonly replaced: number }
  readonly reaped: Record<string, number>
  readonly leaked_contexts: number
  readonly open_mappings_after_shutdown: number
  readonly data_mismatches: number
  readonly mismatch_details: ReadonlyArray<{ readonly request: number; readonly line: number; readonly chunks: ReadonlyArray<number> }>
  readonly trace_issues: ReadonlyArray<TraceIssue>
  /** Requests of the slice skipped because they are longer than `--max-input-tokens`. */
  readonly skipped_long_requests: { readonly count: number; readonly max_input_tokens: number | null }
}

/** A finished replay: the summary, and what happened over time (the data of `--report`, Timeline.ts). */
export interface ReplayRun {
  readonly summary: ReplaySummary
  readonly timeline: ReplayTimeline
}

const MAIN = fileURLToPath(new URL("../cli/main.ts", import.meta.url))

const getJson = (url: string) =>
  Effect.tryPromise({
    try: () => fetch(url).then((r) => r.json() as Promise<Record<string, unknown>>),
    catch: (e) => new ReplayError({ message: `GET ${url} failed: ${e instanceof Error ? e.message : String(e)}` })
  })
/** `/api/status`, decoded (a server of another version fails with the field that does not fit). */
const getStatus = (httpUrl: string) =>
  getJson(`${httpUrl}/api/status`).pipe(
    Effect.flatMap((doc) =>
      Effect.mapError(decodeStatusDocument(doc), (e) => new ReplayError({ message: `${httpUrl}/api/status: ${e.message}` }))
    )
  )
const getText = (url: string) =>
  Effect.tryPromise({
    try: () => fetch(url).then((r) => r.text()),
    catch: (e) => new ReplayError({ message: `GET ${url} failed: ${e instanceof Error ? e.message : String(e)}` })
  })

/** Starts `mpcache serve` as a child process for the life of the scope; with `keys`, CURVE on. */
const startOwnServer = (o: ReplayOptions, keys: RunKeys | undefined) =>
  Effect.acquireRelease(
    Effect.callback<{ readonly child: ChildProcess; readonly endpoint: string; readonly httpUrl: string }, ReplayError>((resume) => {
      const socket = join(tmpdir(), `mpcache-replay-${randomUUID()}.sock`)
      const endpoint = `ipc://${socket}`
      const child = spawn(process.execPath, [
        MAIN,
        "serve",
        "--endpoint",
        endpoint,
        "--http-port",
        "0",
        "--log-format",
        "json",
        "--chunk-size",
        String(o.chunkSizeTokens),
        "--l1-size-gb",
        String(o.l1SizeGb),
        "--worker-disconnect-grace-seconds",
        String(o.disconnectGraceSeconds),
        ...(o.l2Url === undefined ? [] : ["--l2-url", o.l2Url]),
        ...(o.l2Url === undefined || o.l2LookupTimeoutMs === undefined ? [] : ["--l2-lookup-timeout-ms", String(o.l2LookupTimeoutMs)]),
        ...(keys === undefined ? [] : ["--curve-secret-key-file", keys.serverSecretFile, "--curve-authorized-keys", keys.authorizedKeysFile])
      ], { stdio: ["ignore", "ignore", "pipe"] })
      let stderr = ""
      let httpUrl: string | undefined
      let listening = false
      child.stderr!.on("data", (d: Buffer) => {
        stderr = (stderr + d.toString()).slice(-50_000)
        httpUrl ??= stderr.match(/HTTP frontend listening on (http:\/\/[^\s"]+)/)?.[1]
        listening ||= stderr.includes("MQ server listening on")
        if (httpUrl !== undefined && listening) resume(Effect.succeed({ child, endpoint, httpUrl }))
      })
      child.on("exit", (code) =>
        resume(Effect.fail(new ReplayError({ message: `the replay's server exited (code ${code}) before it was ready: ${stderr.slice(-2000)}` })))
      )
    }),
    ({ child, endpoint }) =>
      Effect.gen(function*() {
        const exited = Effect.callback<void>((resume) => {
          if (child.exitCode !== null || child.signalCode !== null) return resume(Effect.void)
          child.once("exit", () => resume(Effect.void))
        })
        child.kill("SIGTERM")
        // The server's own shutdown may take its drain (10 s), its reply flush (5 s) and its linger (1 s): a server
        // still inside that budget is waited for, not killed. Past it, SIGKILL, and its exit is awaited too.
        yield* exited.pipe(
          Effect.timeoutOrElse({ duration: SERVER_STOP_TIMEOUT, orElse: () =>
              Effect.logWarning(`the replay's server did not stop within ${SERVER_STOP_TIMEOUT} of SIGTERM: SIGKILL`).pipe(
                Effect.andThen(Effect.sync(() => void child.kill("SIGKILL"))),
                Effect.andThen(exited)
              ) })
        )
      }).pipe(
        Effect.andThen(Effect.sync(() => rmSync(endpoint.slice("ipc://".length), { force: true })))
      )
  )

/** How long the replay's own server may take to stop after SIGTERM before it is SIGKILLed (its shutdown budget is 16 s). */
const SERVER_STOP_TIMEOUT = "30 seconds"

/** Unlinks /dev/shm/<prefix>-L* (a dead worker's KV cache). */
const removeSegments = (prefix: string): void => {
  try {
    for (const name of readdirSync("/dev/shm")) if (name.startsWith(`${prefix}-L`)) rmSync(`/dev/shm/${name}`, { force: true })
  } catch {
    // Nothing to clean where /dev/shm cannot be listed.
  }
}

const round = (x: number, digits = 3) => Math.round(x * 10 ** digits) / 10 ** digits

/**
 * Runs the replay; returns its summary and timeline. Fails with ReplayError
 * when the trace has nothing usable,
 * or the server or the first workers cannot start; everything that goes
 * wrong later is counted in the summary.
 */
export const runReplay = (o: ReplayOptions, onProgress: (line: string, final: boolean) => void) =>
  Effect.gen(function*() {
    const { requests: slice, issues } = yield* Effect.mapError(readTrace(o.tracePath, o.requests), (e) => new ReplayError({ message: e.message }))
    const limit = o.maxInputTokens
    const requests = limit === undefined ? slice : slice.filter((r) => r.inputLength <= limit)
    if (requests.length === 0) {
      return yield* new ReplayError({
        message: `every one of the ${slice.length} request(s) is longer than --max-input-tokens ${limit}; nothing to replay`
      })
    }
    // Before anything starts: what the workers, the L1 pool and the processes will take, against the machine.
    const checkMemory = (chunk: number, l1Bytes: number) => {
      const shape: ReplayShape = {
        workers: o.workers * o.servers + (o.killEverySeconds === undefined && o.killEveryRequests === undefined ? 0 : 1),
        servers: o.servers,
        transferMode: o.transferMode,
        device: o.device,
        kvBytesPerToken: 2 * o.model.numLayers * o.model.numHeads * o.model.headSize * dtypeBytes(o.model.dtype),
        maxTokens: Math.max(...requests.map((r) => Math.floor(r.inputLength / chunk) * chunk)),
        blockSizeTokens: o.blockSizeTokens,
        l1Bytes
      }
      const refused = refusal(shape, planMemory(shape), readMachineMemory())
      return refused === undefined ? Effect.void : Effect.fail(new ReplayError({ message: refused }))
    }
    if (o.server !== undefined && o.servers > 1) {
      return yield* new ReplayError({ message: `--server uses one running server; --servers ${o.servers} starts its own (use one or the other)` })
    }
    if (o.server === undefined) yield* checkMemory(o.chunkSizeTokens, o.servers * Math.floor(o.l1SizeGb * 2 ** 30))
    const runKeys = o.curve === "generate" && o.server === undefined ? yield* makeRunKeys : undefined
    const keyFiles = o.curve === "generate" ? runKeys?.client : o.curve
    // The scheduler's keys now; the workers read the same files (never keys in their argv).
    const clientCurve = keyFiles === undefined ? undefined : yield* Effect.try({
      try: () => readClientKeys(keyFiles.serverPublicKeyFile, keyFiles.secretKeyFile),
      catch: (e) => new ReplayError({ message: e instanceof KeyFileInvalid ? e.message : String(e) })
    })
    const places = o.server === undefined
      ? yield* Effect.forEach(Array.from({ length: o.servers }), () => startOwnServer(o, runKeys), { concurrency: "unbounded" })
      : [{ endpoint: o.server, httpUrl: o.httpUrl }]
    if (runKeys !== undefined) onProgress(`the replay's server${places.length > 1 ? "s speak" : " speaks"} CURVE with per-run keys in ${runKeys.dir}`, true)
    const httpUrl = places[0]!.httpUrl
    const status0 = yield* getStatus(httpUrl)
    const chunk = status0.chunk_size
    if (o.server !== undefined) yield* checkMemory(chunk, 0)
    const l1 = status0.l1
    const tokenBytes = o.model.numHeads * o.model.headSize * dtypeBytes(o.model.dtype)
    const chunkBytes = 2 * o.model.numLayers * chunk * tokenBytes
    const capacityChunks = Math.floor(l1.capacity_bytes / chunkBytes)
    const maxTokens = Math.max(...requests.map((r) => Math.floor(r.inputLength / chunk) * chunk))
    const settings = (slot: number, endpoint: string): WorkerSettings => ({
      endpoint,
      transferMode: o.transferMode,
      device: o.device,
      modelName: o.model.name,
      numLayers: o.model.numLayers,
      numHeads: o.model.numHeads,
      headSize: o.model.headSize,
      dtype: o.model.dtype as WorkerSettings["dtype"],
      blockSizeTokens: o.blockSizeTokens,
      numBlocks: Math.ceil(maxTokens / o.blockSizeTokens) + 1,
      heartbeatIntervalMs: o.heartbeatIntervalMs,
      namePrefix: `mpcache-replay-${process.pid}-${slot}-${randomUUID().slice(0, 8)}`,
      ...(keyFiles === undefined ? {} : { curve: keyFiles })
    })

    // Per server: its scheduler, every worker ever started on it, its idle ones and its share of the figures.
    const nodes = yield* Effect.forEach(places, (place, index) =>
      Effect.gen(function*() {
        const scheduler = yield* makeSchedulerAdapter({
          endpoint: place.endpoint,
          modelName: o.model.name,
          worldSize: 1,
          requestTimeoutMs: 30_000,
          ...(clientCurve === undefined ? {} : { curve: clientCurve })
        }).pipe(
          Effect.mapError((e) => new ReplayError({ message: `scheduler could not reach ${place.endpoint}: ${e.message}` }))
        )
        const idle = yield* Queue.unbounded<WorkerHandle>()
        return { index, ...place, scheduler, idle, workers: [] as Array<WorkerHandle>, requests: 0, lookedUp: 0, hit: 0 }
      }))
    type Node = (typeof nodes)[number]

    // Workers: every one ever started (on any server), and the server each one serves.
    const all: Array<WorkerHandle> = []
    const nodeOf = new Map<WorkerHandle, Node>()
    let nextSlot = 1
    const start = (node: Node) =>
      Effect.gen(function*() {
        const slot = nextSlot++
        const w = yield* spawnWorker(slot, settings(slot, node.endpoint))
        all.push(w)
        node.workers.push(w)
        nodeOf.set(w, node)
        yield* Queue.offer(node.idle, w)
        return w
      })
    yield* Effect.addFinalizer(() => Effect.forEach(all, (w) => w.shutdown(10_000), { concurrency: "unbounded", discard: true }))
    yield* Effect.forEach(nodes.flatMap((n) => Array.from({ length: o.workers }, () => n)), start, { concurrency: "unbounded", discard: true }).pipe(
      Effect.mapError((e) => new ReplayError({ message: `a worker failed to start: ${e.message}` }))
    )
    // SIGKILLed workers count as dead from the kill on: their exit event comes a moment later, and a sample
    // taken in between (the kill's own) would otherwise show them alive.
    const killedWorkers = new Set<WorkerHandle>()
    const alive = () => all.filter((w) => w.isAlive() && !killedWorkers.has(w))

    // Counters.
    let done = 0
    // One tick per --kill-every-requests completed requests (never after the last): the killer takes them.
    const killTicks = yield* Queue.unbounded<void>()
    let failed = 0
    let retried = 0
    let lookedUp = 0
    let hit = 0
    let stored = 0
    let retrieved = 0
    let bytesStored = 0
    let bytesRetrieved = 0
    let killed = 0
    let paused = 0
    let replaced = 0
    const mismatches: Array<{ request: number; line: number; chunks: ReadonlyArray<number> }> = []
    const failures: Array<{ request: number; message: string }> = []
    const lat = { lookup: new Samples(), retrieve: new Samples(), compute: new Samples(), store: new Samples(), request: new Samples() }
    const reapsSeen = yield* Ref.make<Record<string, number>>({})

    const takeWorker = (node: Node): Effect.Effect<WorkerHandle> =>
      Effect.flatMap(Queue.take(node.idle), (w) => (w.isAlive() ? Effect.succeed(w) : takeWorker(node)))

    /** One request on one worker of `node`; another of its workers if that one dies. */
    const serve = (r: TraceRequest, node: Node, first: WorkerHandle): Effect.Effect<void> =>
      Effect.gen(function*() {
        const scheduler = node.scheduler
        let worker = first
        const t0 = performance.now()
        const requestId = `req-${r.index}-${randomUUID().slice(0, 8)}`
        const tokenIds = tokensFor(r.hashIds, r.inputLength)
        while (true) {
          const l0 = performance.now()
          const hitTokens = yield* scheduler.lookup(requestId, tokenIds).pipe(Effect.orElseSucceed(() => 0))
          lat.lookup.add(performance.now() - l0)
          const run: RunRequest = { _tag: "Run", index: r.index, requestId, hashIds: r.hashIds, inputLength: r.inputLength, hitTokens }
          const result = yield* Effect.result(worker.run(run))
          if (result._tag === "Failure") {
            retried++
            yield* scheduler.endSession(requestId).pipe(Effect.ignore)
            worker = yield* takeWorker(node)
            continue
          }
          yield* Queue.offer(node.idle, worker)
          yield* scheduler.endSession(requestId).pipe(Effect.ignore)
          const m = result.success
          const full = Math.floor(r.inputLength / chunk)
          lookedUp += full
          hit += hitTokens / chunk
          node.requests++
          node.lookedUp += full
          node.hit += hitTokens / chunk
          done++
          if (o.killEveryRequests !== undefined && done % o.killEveryRequests === 0 && done < requests.length) {
            Queue.offerUnsafe(killTicks, undefined)
          }
          const atMs = yield* Clock.currentTimeMillis
          if (m._tag === "Failed") {
            failed++
            if (failures.length < 20) failures.push({ request: r.index, message: m.message })
            timeline.complete({ atMs, latencyMs: undefined, lookedUpChunks: full, hitChunks: hitTokens / chunk, bytesStored: 0, bytesRetrieved: 0 })
            return
          }
          record(r, m)
          const latencyMs = performance.now() - t0
          lat.request.add(latencyMs)
          timeline.complete({
            atMs,
            latencyMs,
            lookedUpChunks: full,
            hitChunks: hitTokens / chunk,
            bytesStored: m.storedBytes,
            bytesRetrieved: m.retrievedBytes
          })
          return
        }
      })

    const record = (r: TraceRequest, m: Done) => {
      stored += m.storedChunks
      retrieved += m.retrievedChunks
      bytesStored += m.storedBytes
      bytesRetrieved += m.retrievedBytes
      if (m.retrievedChunks > 0) lat.retrieve.add(m.retrieveMs)
      if (m.storedChunks > 0) lat.store.add(m.storeMs)
      lat.compute.add(m.computeMs)
      if (m.mismatchedChunks.length > 0) mismatches.push({ request: r.index, line: r.line, chunks: m.mismatchedChunks })
    }

    // Chaos.
    /** Kills a random live worker (and starts its replacement) each time `wait` completes. */
    const killer = (wait: Effect.Effect<void>) =>
      Effect.gen(function*() {
        while (true) {
          yield* wait
          const candidates = alive()
          if (candidates.length === 0) continue
          const victim = candidates[yield* Random.nextIntBetween(0, candidates.length - 1)]!
          // Uninterruptible: a replacement that registered must be known, so it is shut down at the end.
          yield* Effect.uninterruptible(Effect.gen(function*() {
            victim.child.kill("SIGKILL")
            killedWorkers.add(victim)
            killed++
            const killedAt = yield* Clock.currentTimeMillis
            timeline.event(killedAt, { kind: "kill", slot: victim.slot, instance_id: victim.instanceId })
            timeline.sampleAlive(killedAt, alive().length)
            // A killed worker cannot unlink its own segments; like an engine's supervisor, we do.
            // The server's mappings stay valid until it reaps the instance.
            removeSegments(victim.namePrefix)
            yield* start(nodeOf.get(victim)!).pipe(
              Effect.tap((w) =>
                Effect.map(Clock.currentTimeMillis, (at) => {
                  replaced++
                  timeline.event(at, { kind: "replace", slot: w.slot, instance_id: w.instanceId })
                  timeline.sampleAlive(at, alive().length)
                })
              ),
              Effect.catch((e) => Effect.logWarning(`replacement worker failed to start: ${e.message}`))
            )
          }))
        }
      })
    const pauser = (every: number) =>
      Effect.gen(function*() {
        while (true) {
          yield* Effect.sleep(`${every} seconds`)
          const candidates = alive()
          if (candidates.length === 0) continue
          const victim = candidates[yield* Random.nextIntBetween(0, candidates.length - 1)]!
          victim.child.kill("SIGSTOP")
          paused++
          timeline.event(yield* Clock.currentTimeMillis, { kind: "pause", slot: victim.slot, instance_id: victim.instanceId })
          yield* Effect.sleep(`${o.pauseSeconds} seconds`).pipe(
            Effect.ensuring(Effect.gen(function*() {
              victim.child.kill("SIGCONT")
              timeline.event(yield* Clock.currentTimeMillis, { kind: "resume", slot: victim.slot, instance_id: victim.instanceId })
            }))
          )
        }
      })

    // Reaps and L2 hits, summed over the servers.
    const metricsOf = (node: Node) => getText(`${node.httpUrl}/metrics`)
    const sumReaps = (texts: ReadonlyArray<string>) => {
      const out: Record<string, number> = {}
      for (const t of texts) for (const [k, v] of Object.entries(promCounters(t, "mpcache_reaps_total", "reason"))) out[k] = (out[k] ?? 0) + v
      return out
    }
    const reapsNow = Effect.map(Effect.forEach(nodes, metricsOf), sumReaps)
    const baseReaps = yield* reapsNow.pipe(Effect.orElseSucceed(() => ({} as Record<string, number>)))
    // With --l2-url every server must say it has an L2 (`l2` in /api/status), or the split would be made up.
    if (o.l2Url !== undefined) {
      yield* Effect.forEach(nodes, (node) =>
        Effect.flatMap(getJson(`${node.httpUrl}/api/status`), (doc) =>
          typeof doc["l2"] === "object" && doc["l2"] !== null
            ? Effect.void
            : Effect.fail(new ReplayError({ message: `${node.httpUrl}/api/status has no l2: this server has no L2 tier, so its L2 hits cannot be told apart` }))))
    }
    // Per server, the L2 hit counter now (absent until the first L2 hit, and on a server without L2: 0).
    const l2HitsNow = Effect.forEach(nodes, (node) => Effect.map(metricsOf(node), (text) => l2HitChunks(text) ?? 0))
    const baseL2Hits = yield* l2HitsNow

    const progressLine = Effect.gen(function*() {
      const reaps = yield* reapsNow.pipe(Effect.orElseSucceed(() => ({} as Record<string, number>)))
      yield* Ref.set(reapsSeen, reaps)
      const reaped = Object.entries(reaps).reduce((n, [k, v]) => n + v - (baseReaps[k] ?? 0), 0)
      const pct = requests.length === 0 ? 0 : done / requests.length
      const width = 30
      const bar = "#".repeat(Math.round(pct * width)).padEnd(width, ".")
      return `[${bar}] ${done}/${requests.length} requests · hit ratio ${(lookedUp === 0 ? 0 : (100 * hit) / lookedUp).toFixed(1)}% · workers alive ${alive().length} · reaped ${reaped} · mismatches ${mismatches.length}`
    })

    const startedMs = yield* Clock.currentTimeMillis
    const timeline = new TimelineRecorder(startedMs)
    timeline.sampleAlive(startedMs, alive().length)
    /** The server's recent reaps into the timeline (its ring holds 50: read every second). */
    const recordReaps = (doc: { readonly recent_reaps: ReadonlyArray<{ instance_id: string; reason: string; reaped_at_ms: number }> }) =>
      doc.recent_reaps.forEach((r) => timeline.reap(r))
    // Workers alive every 250 ms, reaps every second: the report's timeline.
    const sampler = yield* Effect.forkChild(
      Effect.gen(function*() {
        for (let tick = 1;; tick++) {
          yield* Effect.sleep("250 millis")
          timeline.sampleAlive(yield* Clock.currentTimeMillis, alive().length)
          if (tick % 4 === 0) yield* Effect.forEach(nodes, (n) => getStatus(n.httpUrl).pipe(Effect.map(recordReaps), Effect.ignore))
        }
      })
    )
    const chaos: Array<Fiber.Fiber<unknown>> = [sampler]
    if (o.killEverySeconds !== undefined) chaos.push(yield* Effect.forkChild(killer(Effect.sleep(`${o.killEverySeconds} seconds`))))
    if (o.killEveryRequests !== undefined) chaos.push(yield* Effect.forkChild(killer(Queue.take(killTicks))))
    if (o.pauseEverySeconds !== undefined) chaos.push(yield* Effect.forkChild(pauser(o.pauseEverySeconds)))
    const progress = o.progress
      ? yield* Effect.forkChild(
        Effect.gen(function*() {
          while (true) {
            yield* Effect.sleep(process.stderr.isTTY ? "200 millis" : "5 seconds")
            onProgress(yield* progressLine, false)
          }
        })
      )
      : undefined

    // Dispatch in trace order: wait for the arrival time, then for an idle worker.
    const inflight: Array<Fiber.Fiber<void>> = []
    const router = new ConversationRouter(nodes.length)
    const t0 = requests[0]!.timestampMs
    for (const r of requests) {
      if (!o.maxRate) {
        const due = startedMs + (r.timestampMs - t0) / o.rate
        const now = yield* Clock.currentTimeMillis
        if (due > now) yield* Effect.sleep(`${due - now} millis`)
      }
      const node = nodes[router.route(r.hashIds)]!
      const w = yield* takeWorker(node)
      inflight.push(yield* Effect.forkChild(serve(r, node, w)))
    }
    yield* Fiber.joinAll(inflight)
    const durationSeconds = ((yield* Clock.currentTimeMillis) - startedMs) / 1000
    yield* Fiber.interruptAll(chaos)
    if (progress !== undefined) yield* Fiber.interrupt(progress)

    const l2Hits = (yield* l2HitsNow).map((n, i) => n - baseL2Hits[i]!)

    // Killed workers must be reaped: wait at most the grace plus one reaper scan (and a little slack).
    // Each server tracks only its own workers.
    const graceMs = (o.server === undefined ? o.disconnectGraceSeconds : 10) * 1000
    const waitUntil = (yield* Clock.currentTimeMillis) + graceMs * 1.5 + 1_500
    let leaked = 0
    for (const node of nodes) {
      const tracked = Effect.map(getStatus(node.httpUrl), (s) => s.worker_liveness.tracked_instances)
      const liveIds = node.workers.filter((w) => w.isAlive()).length
      let trackedNow = yield* tracked
      while (trackedNow > liveIds && (yield* Clock.currentTimeMillis) < waitUntil) {
        yield* Effect.sleep("100 millis")
        trackedNow = yield* tracked
      }
      leaked += Math.max(0, trackedNow - liveIds)
    }

    // Every live worker unregisters; then nothing may stay mapped.
    yield* Effect.forEach(all, (w) => w.shutdown(10_000), { concurrency: "unbounded", discard: true })
    const after = yield* Effect.forEach(nodes, (n) => getStatus(n.httpUrl))
    after.forEach(recordReaps)
    const endedMs = yield* Clock.currentTimeMillis
    const openMappings = after.reduce((n, s) => n + s.native.open_mappings, 0)
    const finalReaps = yield* reapsNow.pipe(Effect.catch(() => Ref.get(reapsSeen)))
    const reaped: Record<string, number> = {}
    for (const reason of ["timeout", "grace", "disconnect"]) reaped[reason] = (finalReaps[reason] ?? 0) - (baseReaps[reason] ?? 0)
    if (o.progress) onProgress(yield* progressLine.pipe(Effect.orElseSucceed(() => "")), true)

    const lruSteps = perfectLruCumulative(requests, chunk, capacityChunks)
    const [lruLookedUp, lruHits] = lruSteps[lruSteps.length - 1] ?? [0, 0]
    const lru = { hitRatio: lruLookedUp === 0 ? 0 : lruHits / lruLookedUp }
    const combinedSteps = nodes.length === 1 ? lruSteps : perfectLruCumulative(requests, chunk, nodes.length * capacityChunks)
    const [combinedLookedUp, combinedHits] = combinedSteps[combinedSteps.length - 1] ?? [0, 0]
    const l2Total = l2Hits.reduce((a, b) => a + b, 0)
    const ratio = (n: number) => round(lookedUp === 0 ? 0 : n / lookedUp, 4)
    const q = (s: Samples) => ({ p50: round(s.quantile(0.5)), p99: round(s.quantile(0.99)), mean: round(s.mean()) })
    const summary: ReplaySummary = {
      trace: o.tracePath,
      requests: requests.length,
      failed_requests: failed,
      failures,
      retried_requests: retried,
      workers: o.workers,
      servers: nodes.length,
      l2_url: o.l2Url === undefined ? null : redactUrl(o.l2Url),
      transfer_mode: o.transferMode,
      model: o.model.name,
      chunk_size: chunk,
      chunks: { looked_up: lookedUp, hit, stored, retrieved },
      hit_ratio: ratio(hit),
      hits_by_tier: { l1: hit - l2Total, l2: l2Total },
      hit_ratio_l1: ratio(hit - l2Total),
      hit_ratio_l2: ratio(l2Total),
      perfect_lru_hit_ratio: round(lru.hitRatio, 4),
      perfect_lru_combined_hit_ratio: round(combinedLookedUp === 0 ? 0 : combinedHits / combinedLookedUp, 4),
      per_server: nodes.map((n, i) => ({ requests: n.requests, looked_up: n.lookedUp, hit: n.hit, l2_hit: l2Hits[i]! })),
      l1_capacity_chunks: capacityChunks,
      gb_stored: round(bytesStored / 1e9, 4),
      gb_retrieved: round(bytesRetrieved / 1e9, 4),
      duration_seconds: round(durationSeconds, 2),
      requests_per_second: round(requests.length / Math.max(durationSeconds, 1e-9), 2),
      latency_ms: { lookup: q(lat.lookup), retrieve: q(lat.retrieve), compute: q(lat.compute), store: q(lat.store), request: q(lat.request) },
      churn: { killed, paused, replaced },
      reaped,
      leaked_contexts: leaked,
      open_mappings_after_shutdown: openMappings,
      data_mismatches: mismatches.reduce((n, m) => n + m.chunks.length, 0),
      mismatch_details: mismatches,
      trace_issues: issues,
      skipped_long_requests: { count: slice.length - requests.length, max_input_tokens: limit ?? null }
    }
    const run: ReplayRun = { summary, timeline: timeline.build(endedMs, lruSteps) }
    return run
  })
