/**
 * One trace request as an engine serves it: the scheduler LOOKUPs, a worker
 * RETRIEVEs the hit prefix, computes, STOREs, and the scheduler ends the
 * session; if the worker dies, another of the same server's workers retries.
 *
 * @internal
 */
import { randomUUID } from "node:crypto"
import { Clock, Effect, Queue } from "effect"
import type { RunRequest } from "../Messages.ts"
import { tokensFor } from "../Synth.ts"
import type { TimelineRecorder } from "../Timeline.ts"
import type { TraceRequest } from "../Trace.ts"
import type { WorkerHandle } from "../WorkerPool.ts"
import type { Fleet, Node } from "./Fleet.ts"
import type { Tally } from "./Tally.ts"

/** What serving a request reads and counts into. */
export interface ServeContext {
  readonly fleet: Fleet
  readonly tally: Tally
  readonly timeline: TimelineRecorder
  /** The server's chunk size in tokens. */
  readonly chunk: number
  /** Requests in the run (no kill tick after the last). */
  readonly total: number
  /** `--kill-every-requests`: a tick into `killTicks` after every this many completed requests. */
  readonly killEveryRequests: number | undefined
  readonly killTicks: Queue.Queue<void>
  /** `--restart-server-every-requests`: a tick into `restartTicks` after every this many completed requests. */
  readonly restartEveryRequests: number | undefined
  readonly restartTicks: Queue.Queue<void>
}

/** Serves `r` on `first` (an idle worker of `node`); never fails: a failure is counted. */
export const serveRequest = (c: ServeContext, r: TraceRequest, node: Node, first: WorkerHandle): Effect.Effect<void> =>
  Effect.gen(function*() {
    const { chunk, tally, timeline } = c
    const lat = tally.lat
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
        tally.retried++
        yield* scheduler.endSession(requestId).pipe(Effect.ignore)
        worker = yield* c.fleet.takeWorker(node)
        continue
      }
      yield* Queue.offer(node.idle, worker)
      yield* scheduler.endSession(requestId).pipe(Effect.ignore)
      const m = result.success
      const full = Math.floor(r.inputLength / chunk)
      tally.lookedUp += full
      tally.hit += hitTokens / chunk
      node.requests++
      node.lookedUp += full
      node.hit += hitTokens / chunk
      tally.done++
      if (c.killEveryRequests !== undefined && tally.done % c.killEveryRequests === 0 && tally.done < c.total) {
        Queue.offerUnsafe(c.killTicks, undefined)
      }
      if (c.restartEveryRequests !== undefined && tally.done % c.restartEveryRequests === 0 && tally.done < c.total) {
        Queue.offerUnsafe(c.restartTicks, undefined)
      }
      const atMs = yield* Clock.currentTimeMillis
      if (m._tag === "Failed") {
        tally.failed++
        if (tally.failures.length < 20) tally.failures.push({ request: r.index, message: m.message })
        timeline.complete({ atMs, latencyMs: undefined, lookedUpChunks: full, hitChunks: hitTokens / chunk, bytesStored: 0, bytesRetrieved: 0 })
        return
      }
      tally.record(r, m)
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
