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
 *
 * With `router` kv-aware (issue 28 item 6) each server also publishes its KV
 * events and each request goes where KvRouter.ts says the longest prefix is;
 * the run ends with the index audit of every server. With
 * `restartServerEveryRequests` a server is restarted (rolling: drained, then
 * taken back once its workers re-registered) after every N completed requests;
 * its counters from before are carried over.
 *
 * This module runs the steps in order; the parts are in internal/ (issue 25
 * item 5): the own server (OwnServer.ts), the servers and workers
 * (Fleet.ts), one request (Serve.ts), chaos (Chaos.ts), the counters
 * (Tally.ts, ServerCounters.ts) and the summary (Summary.ts).
 */
import { randomUUID } from "node:crypto"
import { Clock, Effect, Fiber, Latch, Queue, Ref } from "effect"
import { dtypeBytes } from "../schema/Dtype.ts"
import { KeyFileInvalid, readClientKeys } from "../services/auth/Curve.ts"
import { killer, pauser } from "./internal/Chaos.ts"
import { makeFleet } from "./internal/Fleet.ts"
import { startOwnServer } from "./internal/OwnServer.ts"
import { serveRequest } from "./internal/Serve.ts"
import { checkL2, l2HitsNow, reapsNow as reapsOf } from "./internal/ServerCounters.ts"
import { getStatus } from "./internal/ServerHttp.ts"
import { summarize } from "./internal/Summary.ts"
import { Tally } from "./internal/Tally.ts"
import type { WorkerSettings } from "./Messages.ts"
import { planMemory, readMachineMemory, refusal, type ReplayShape } from "./MemoryPlan.ts"
import { ReplayError, type ReplayOptions } from "./ReplayOptions.ts"
import type { ReplayRun } from "./ReplaySummary.ts"
import { makeKvRouter } from "./KvRouter.ts"
import { ConversationRouter } from "./Routing.ts"
import { makeRunKeys } from "./RunKeys.ts"
import { TimelineRecorder } from "./Timeline.ts"
import { readTrace } from "./Trace.ts"

export { ReplayError, type ReplayOptions } from "./ReplayOptions.ts"
export type { ReplayRun, ReplaySummary } from "./ReplaySummary.ts"

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
    if (o.server !== undefined && (o.router === "kv-aware" || o.restartServerEveryRequests !== undefined)) {
      return yield* new ReplayError({ message: "--router kv-aware and --restart-server-every-requests need the replay's own servers, not --server" })
    }
    const own = o.server === undefined
      ? yield* Effect.forEach(Array.from({ length: o.servers }), () => startOwnServer(o, runKeys), { concurrency: "unbounded" })
      : []
    const places = o.server === undefined
      ? own.map((s) => ({ endpoint: s.endpoint, httpUrl: s.httpUrl(), httpToken: runKeys?.httpToken }))
      : [{ endpoint: o.server, httpUrl: o.httpUrl, httpToken: undefined }]
    if (runKeys !== undefined) onProgress(`the replay's server${places.length > 1 ? "s speak" : " speaks"} CURVE with per-run keys in ${runKeys.dir}`, true)
    const httpUrl = places[0]!.httpUrl
    const status0 = yield* getStatus(httpUrl, places[0]!.httpToken)
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
    const fleet = yield* makeFleet({ places, modelName: o.model.name, clientCurve, workersPerNode: o.workers, settings })
    const nodes = fleet.nodes
    const tally = new Tally()
    // One tick per --kill-every-requests completed requests (never after the last): the killer takes them.
    const killTicks = yield* Queue.unbounded<void>()
    // One tick per --restart-server-every-requests completed requests: the restarter takes them.
    const restartTicks = yield* Queue.unbounded<void>()
    const reapsSeen = yield* Ref.make<Record<string, number>>({})

    // Reaps and L2 hits, summed over the servers.
    const reapsNow = reapsOf(nodes)
    const baseReaps = yield* reapsNow.pipe(Effect.orElseSucceed(() => ({} as Record<string, number>)))
    if (o.l2Url !== undefined) yield* checkL2(nodes)
    const baseL2Hits = yield* l2HitsNow(nodes)

    // Counters of a server from before its restarts (a new process counts from 0).
    const carried = nodes.map(() => ({ reaps: {} as Record<string, number>, l2Hits: 0 }))
    const progressLine = Effect.gen(function*() {
      const reaps = yield* reapsNow.pipe(Effect.orElseSucceed(() => ({} as Record<string, number>)))
      yield* Ref.set(reapsSeen, reaps)
      const reaped = Object.entries(reaps).reduce((n, [k, v]) => n + v - (baseReaps[k] ?? 0), 0) +
        carried.reduce((n, c) => n + Object.values(c.reaps).reduce((a, b) => a + b, 0), 0)
      const pct = requests.length === 0 ? 0 : tally.done / requests.length
      const width = 30
      const bar = "#".repeat(Math.round(pct * width)).padEnd(width, ".")
      return `[${bar}] ${tally.done}/${requests.length} requests · hit ratio ${(tally.lookedUp === 0 ? 0 : (100 * tally.hit) / tally.lookedUp).toFixed(1)}% · workers alive ${fleet.alive().length} · reaped ${reaped} · mismatches ${tally.mismatches.length}`
    })

    const startedMs = yield* Clock.currentTimeMillis
    const timeline = new TimelineRecorder(startedMs)
    timeline.sampleAlive(startedMs, fleet.alive().length)
    /** The server's recent reaps into the timeline (its ring holds 50: read every second). */
    const recordReaps = (doc: { readonly recent_reaps: ReadonlyArray<{ instance_id: string; reason: string; reaped_at_ms: number }> }) =>
      doc.recent_reaps.forEach((r) => timeline.reap(r))
    // Workers alive every 250 ms, reaps every second: the report's timeline.
    const sampler = yield* Effect.forkChild(
      Effect.gen(function*() {
        for (let tick = 1;; tick++) {
          yield* Effect.sleep("250 millis")
          timeline.sampleAlive(yield* Clock.currentTimeMillis, fleet.alive().length)
          if (tick % 4 === 0) yield* Effect.forEach(nodes, (n) => getStatus(n.httpUrl, n.httpToken).pipe(Effect.map(recordReaps), Effect.ignore))
        }
      })
    )
    const chaos: Array<Fiber.Fiber<unknown>> = [sampler]
    if (o.killEverySeconds !== undefined) chaos.push(yield* Effect.forkChild(killer(fleet, tally, timeline, Effect.sleep(`${o.killEverySeconds} seconds`))))
    if (o.killEveryRequests !== undefined) chaos.push(yield* Effect.forkChild(killer(fleet, tally, timeline, Queue.take(killTicks))))
    // Its dispatch gate, closed while it restarts.
    const up = yield* Effect.forEach(nodes, () => Latch.make(true))
    let restarts = 0 // done
    let turn = 0 // taken
    // A server that could not be started again ends the run (its requests would only time out).
    let restartFailed: string | undefined
    if (o.restartServerEveryRequests !== undefined) {
      // Each restart runs whole (uninterruptible: the run's end waits for one under way, so no server is left
      // half-restarted); the waits inside are bounded.
      const restartOne = Effect.uninterruptible(Effect.gen(function*() {
        const i = turn++ % nodes.length
        const node = nodes[i]!
        // A rolling restart: nothing new goes to it, what it serves finishes, then SIGTERM and a fresh start on
        // the same sockets; it takes requests again once its live workers have re-registered (their heartbeat's
        // PING_REGISTERED hears they are missing and registers them at once), bounded by 15 s.
        yield* up[i]!.close
        while (node.inflight > 0) yield* Effect.sleep("10 millis")
        const before = yield* Effect.all([reapsOf([node]), l2HitsNow([node])])
        for (const [k, v] of Object.entries(before[0])) carried[i]!.reaps[k] = (carried[i]!.reaps[k] ?? 0) + v
        carried[i]!.l2Hits += before[1][0]!
        node.httpUrl = yield* own[i]!.restart
        const back = (yield* Clock.currentTimeMillis) + 15_000
        while ((yield* getStatus(node.httpUrl, node.httpToken)).worker_liveness.tracked_instances < node.workers.filter((w) => w.isAlive()).length) {
          if ((yield* Clock.currentTimeMillis) > back) break
          yield* Effect.sleep("50 millis")
        }
        restarts++
        onProgress(`restarted server ${i + 1} (now ${node.httpUrl})`, true)
        yield* up[i]!.open
      }).pipe(Effect.catch((e) =>
        Effect.sync(() => {
          restartFailed = e.message
          up.forEach((l) => l.openUnsafe())
        })
      )))
      chaos.push(yield* Effect.forkChild(Effect.forever(Queue.take(restartTicks).pipe(Effect.andThen(restartOne)))))
    }
    if (o.pauseEverySeconds !== undefined) chaos.push(yield* Effect.forkChild(pauser(fleet, tally, timeline, o.pauseEverySeconds, o.pauseSeconds)))
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
    const serving = {
      fleet,
      tally,
      timeline,
      chunk,
      total: requests.length,
      killEveryRequests: o.killEveryRequests,
      killTicks,
      restartEveryRequests: o.restartServerEveryRequests,
      restartTicks
    }
    const inflight: Array<Fiber.Fiber<void>> = []
    const conversations = new ConversationRouter(nodes.length)
    // The kv-aware router hears every server's KV event stream from now on (CURVE: the scheduler's admin keys).
    const kvRouter = o.router === "kv-aware" ? yield* makeKvRouter(own.map((s) => s.kvEvents!), chunk, clientCurve) : undefined
    const t0 = requests[0]!.timestampMs
    for (const r of requests) {
      if (!o.maxRate) {
        const due = startedMs + (r.timestampMs - t0) / o.rate
        const now = yield* Clock.currentTimeMillis
        if (due > now) yield* Effect.sleep(`${due - now} millis`)
      }
      if (restartFailed !== undefined) return yield* new ReplayError({ message: `a server could not be restarted: ${restartFailed}` })
      const node = nodes[kvRouter === undefined ? conversations.route(r.hashIds) : kvRouter.route(r, nodes.map((n) => n.inflight))]!
      yield* up[node.index]!.await
      const w = yield* fleet.takeWorker(node)
      node.inflight++
      inflight.push(yield* Effect.forkChild(serveRequest(serving, r, node, w).pipe(Effect.ensuring(Effect.sync(() => void node.inflight--)))))
    }
    yield* Fiber.joinAll(inflight)
    const durationSeconds = ((yield* Clock.currentTimeMillis) - startedMs) / 1000
    yield* Fiber.interruptAll(chaos)
    if (progress !== undefined) yield* Fiber.interrupt(progress)

    const l2Hits = (yield* l2HitsNow(nodes)).map((n, i) => n + carried[i]!.l2Hits - baseL2Hits[i]!)

    // Killed workers must be reaped: wait at most the grace plus one reaper scan (and a little slack).
    // Each server tracks only its own workers.
    const graceMs = (o.server === undefined ? o.disconnectGraceSeconds : 10) * 1000
    const waitUntil = (yield* Clock.currentTimeMillis) + graceMs * 1.5 + 1_500
    let leaked = 0
    for (const node of nodes) {
      const tracked = Effect.map(getStatus(node.httpUrl, node.httpToken), (s) => s.worker_liveness.tracked_instances)
      const liveIds = node.workers.filter((w) => w.isAlive()).length
      let trackedNow = yield* tracked
      while (trackedNow > liveIds && (yield* Clock.currentTimeMillis) < waitUntil) {
        yield* Effect.sleep("100 millis")
        trackedNow = yield* tracked
      }
      leaked += Math.max(0, trackedNow - liveIds)
    }

    // Every live worker unregisters; then nothing may stay mapped.
    yield* Effect.forEach(fleet.all, (w) => w.shutdown(10_000), { concurrency: "unbounded", discard: true })
    const after = yield* Effect.forEach(nodes, (n) => getStatus(n.httpUrl, n.httpToken))
    after.forEach(recordReaps)
    const endedMs = yield* Clock.currentTimeMillis
    const openMappings = after.reduce((n, s) => n + s.native.open_mappings, 0)
    const finalReaps = { ...(yield* reapsNow.pipe(Effect.catch(() => Ref.get(reapsSeen)))) }
    for (const c of carried) for (const [k, v] of Object.entries(c.reaps)) finalReaps[k] = (finalReaps[k] ?? 0) + v
    // The index audit: after the run, each server's L1 against what the router heard of it.
    const audit = kvRouter === undefined ? null : yield* Effect.forEach(nodes, (n, i) => kvRouter.audit(i, n.httpUrl, n.httpToken, o.model.name))
    const reaped: Record<string, number> = {}
    for (const reason of ["timeout", "grace", "disconnect"]) reaped[reason] = (finalReaps[reason] ?? 0) - (baseReaps[reason] ?? 0)
    if (o.progress) onProgress(yield* progressLine.pipe(Effect.orElseSucceed(() => "")), true)

    const { lruSteps, summary } = summarize(tally, {
      options: o,
      requests,
      sliceLength: slice.length,
      issues,
      nodes,
      chunk,
      capacityChunks,
      l2Hits,
      durationSeconds,
      reaped,
      leaked,
      openMappings,
      router: { policy: o.router, audit, server_restarts: restarts }
    })
    const run: ReplayRun = { summary, timeline: timeline.build(endedMs, lruSteps) }
    return run
  })
