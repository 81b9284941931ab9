/**
 * The three handler pools of DESIGN §3.1, each a set of worker fibers fed by
 * bounded queues. The receive loop only ever offers a job (never waits), so
 * a slow handler delays its own pool and nothing else:
 *
 * - SYNC: one lane, jobs one at a time in arrival order (upstream runs SYNC
 *   inline in its main loop, where a slow REGISTER stalls everything);
 * - NORMAL: one FIFO queue served by `normalWorkers` fibers;
 * - AFFINITY: `affinityLanes` queues with one fiber each; a peer is pinned to
 *   a lane on first sight (round robin) until it disconnects, so one
 *   worker's transfers run in order (upstream AffinityThreadPool).
 *
 * Each pool counts the jobs it holds (queued or running), so the MQ server's
 * fast path (issue 16) answers a pure op inline only where the pooled path
 * would start it at once: SYNC idle, NORMAL with a free worker. A PING
 * therefore still waits behind a saturated NORMAL pool.
 */
import { Cause, Duration, Effect, Fiber, Queue, Scope } from "effect"
import type { Pool } from "./Handler.ts"

/** A self-contained unit of work: decodes, runs the handler, replies. It never fails. */
export type Job = Effect.Effect<void>

/** Sizes of the pools. */
export interface DispatchOptions {
  /** Concurrent NORMAL handlers (`--max-cpu-workers`), ≥ 1. */
  readonly normalWorkers: number
  /** AFFINITY lanes (`--max-gpu-workers`), ≥ 1. */
  readonly affinityLanes: number
  /** Jobs a pool (or one AFFINITY lane) may hold waiting before requests get `overloaded`. */
  readonly queueCapacity: number
}

/** Queue depths per pool, for status. */
export interface DispatchStats {
  readonly sync: { readonly queued: number }
  readonly normal: { readonly workers: number; readonly queued: number }
  readonly affinity: { readonly lanes: number; readonly queued: ReadonlyArray<number>; readonly pinnedPeers: number }
}

/** The dispatcher the MQ server feeds. */
export interface Dispatcher {
  /** Queues `job` on `pool` (AFFINITY: on `peer`'s lane). False when that queue is full or draining. */
  readonly submit: (pool: Pool, peer: string, job: Job) => boolean
  /** Forgets `peer`'s AFFINITY lane (its connection is gone). */
  readonly releasePeer: (peer: string) => void
  /**
   * Whether a job submitted to `pool` now would start at once: SYNC holds no
   * job, NORMAL holds fewer than its workers; always false for AFFINITY
   * (lanes are per peer) and once draining.
   */
  readonly hasFreeSlot: (pool: Pool) => boolean
  readonly stats: () => DispatchStats
  /**
   * Stops taking jobs, lets every queued and running job finish, and waits
   * at most `timeout` for that; what is still running then is interrupted.
   */
  readonly drain: (timeout: Duration.Input) => Effect.Effect<void>
}

/** Shutdown marker for the queues. */
type JobQueue = Queue.Queue<Job, Cause.Done>

const worker = (queue: JobQueue, done: () => void): Effect.Effect<void> => {
  const finished = Effect.sync(done)
  return Queue.take(queue).pipe(
    Effect.flatMap((job) => Effect.ensuring(job, finished)),
    Effect.forever,
    Effect.catch(() => Effect.void)
  )
}

/**
 * Starts the pools' fibers in the current Scope (closing it interrupts any
 * still running; `drain` is the graceful way).
 */
export const makeDispatcher = (options: DispatchOptions): Effect.Effect<Dispatcher, never, Scope.Scope> =>
  Effect.gen(function*() {
    const syncQueue: JobQueue = yield* Queue.bounded<Job, Cause.Done>(options.queueCapacity)
    const normalQueue: JobQueue = yield* Queue.bounded<Job, Cause.Done>(options.queueCapacity)
    const lanes: Array<JobQueue> = []
    for (let i = 0; i < options.affinityLanes; i++) {
      lanes.push(yield* Queue.bounded<Job, Cause.Done>(options.queueCapacity))
    }
    // Jobs held (queued or running) by SYNC and NORMAL, for `hasFreeSlot`.
    let syncHeld = 0
    let normalHeld = 0
    let draining = false
    const syncDone = () => {
      syncHeld--
    }
    const normalDone = () => {
      normalHeld--
    }
    const fibers: Array<Fiber.Fiber<void>> = []
    fibers.push(yield* Effect.forkScoped(worker(syncQueue, syncDone)))
    for (let i = 0; i < options.normalWorkers; i++) fibers.push(yield* Effect.forkScoped(worker(normalQueue, normalDone)))
    for (const lane of lanes) fibers.push(yield* Effect.forkScoped(worker(lane, () => {})))

    const pinned = new Map<string, number>()
    let nextLane = 0
    const laneOf = (peer: string): JobQueue => {
      let idx = pinned.get(peer)
      if (idx === undefined) {
        idx = nextLane
        nextLane = (nextLane + 1) % lanes.length
        pinned.set(peer, idx)
      }
      return lanes[idx]!
    }

    const submit = (pool: Pool, peer: string, job: Job): boolean => {
      const queue = pool === "SYNC" ? syncQueue : pool === "NORMAL" ? normalQueue : laneOf(peer)
      const accepted = Queue.offerUnsafe(queue, job)
      if (accepted && pool === "SYNC") syncHeld++
      else if (accepted && pool === "NORMAL") normalHeld++
      return accepted
    }

    const hasFreeSlot = (pool: Pool): boolean =>
      !draining && (pool === "SYNC" ? syncHeld === 0 : pool === "NORMAL" && normalHeld < options.normalWorkers)

    const drain = (timeout: Duration.Input): Effect.Effect<void> =>
      Effect.gen(function*() {
        draining = true
        for (const q of [syncQueue, normalQueue, ...lanes]) yield* Queue.end(q)
        const all = Fiber.joinAll(fibers)
        yield* all.pipe(
          Effect.timeoutOrElse({
            duration: timeout,
            orElse: () =>
              Effect.logWarning("in-flight requests did not finish in time; interrupting them").pipe(
                Effect.andThen(Fiber.interruptAll(fibers))
              )
          }),
          Effect.asVoid
        )
      })

    return {
      submit,
      releasePeer: (peer) => {
        pinned.delete(peer)
      },
      hasFreeSlot,
      stats: () => ({
        sync: { queued: Queue.sizeUnsafe(syncQueue) },
        normal: { workers: options.normalWorkers, queued: Queue.sizeUnsafe(normalQueue) },
        affinity: { lanes: lanes.length, queued: lanes.map((l) => Queue.sizeUnsafe(l)), pinnedPeers: pinned.size }
      }),
      drain
    }
  })
