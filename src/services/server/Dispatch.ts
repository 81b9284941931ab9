/**
 * The three handler pools of DESIGN §3.1, each a set of worker fibers fed by
 * bounded queues. The receive loop only ever offers a job (never waits), so
 * a slow handler delays its own pool and nothing else:
 *
 * - SYNC: one lane, jobs one at a time (upstream runs SYNC inline in its main
 *   loop, where a slow REGISTER stalls everything);
 * - NORMAL: one queue served by `normalWorkers` fibers;
 * - AFFINITY: `affinityLanes` queues with one fiber each; a peer is pinned to
 *   a lane on first sight (round robin) until it disconnects, so one
 *   worker's transfers run in order (upstream AffinityThreadPool).
 *
 * Every queue is fair between peers (issue 27 item 1; internal/PeerQueues.ts):
 * one FIFO per peer, served peers in turn, so a peer's jobs run in the order
 * it sent them and another peer's job waits behind at most one of its own;
 * each peer may hold at most {@link POOL_SHARE_PER_PEER} waiting jobs of a
 * queue (or the queue's whole capacity, when smaller), so one peer's flood of
 * LOOKUPs can neither fill a pool nor keep a heartbeat behind thousands of
 * its jobs.
 *
 * Each pool counts the jobs it holds (queued or running), so the MQ server's
 * fast path (issue 16) answers a pure op inline only where the pooled path
 * would start it at once: SYNC idle, NORMAL with a free worker. A PING
 * therefore still waits behind a saturated NORMAL pool.
 */
import { Cause, Duration, Effect, Fiber, Queue, Scope } from "effect"
import type { Pool } from "./Handler.ts"
import { makePeerQueues, type PeerQueues } from "./internal/PeerQueues.ts"

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
  /**
   * Queues `job` for `peer` (routing id, hex) on `pool` (AFFINITY: on `peer`'s lane). False when draining, when
   * that queue holds its capacity, or when `peer` holds its share of it ({@link POOL_SHARE_PER_PEER}).
   */
  readonly submit: (pool: Pool, peer: string, job: Job) => boolean
  /** Why a job of `peer` would be refused by `pool` now (undefined: it would be queued); words the `overloaded` reply. */
  readonly refusal: (pool: Pool, peer: string) => Refusal | undefined
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

/** Waiting jobs one peer may hold in one queue (a pool, an AFFINITY lane); the queue's capacity when smaller. */
export const POOL_SHARE_PER_PEER = 1_024

/** A peer's share of a queue of `capacity` waiting jobs: {@link POOL_SHARE_PER_PEER}, or the capacity when smaller. */
export const poolSharePerPeer = (capacity: number): number => Math.max(1, Math.min(capacity, POOL_SHARE_PER_PEER))

/** Why a job was not queued: the dispatcher drains, its queue holds its capacity, or its peer its share. */
export type Refusal = "draining" | "pool_full" | "peer_full"

/** One pool queue: a FIFO per peer (PeerQueues) and a ticket per waiting job for the workers to take. */
interface FairQueue {
  readonly jobs: PeerQueues<Job>
  /** Ended by `drain`: takes go on until it is empty, then fail with Done. */
  readonly tickets: Queue.Queue<void, Cause.Done>
}

const makeFairQueue = (capacity: number): Effect.Effect<FairQueue> =>
  Effect.map(Queue.unbounded<void, Cause.Done>(), (tickets) => ({
    jobs: makePeerQueues<Job>({ messages: poolSharePerPeer(capacity), bytes: Number.POSITIVE_INFINITY }),
    tickets
  }))

const worker = (queue: FairQueue, done: () => void): Effect.Effect<void> => {
  const finished = Effect.sync(done)
  return Queue.take(queue.tickets).pipe(
    Effect.flatMap(() => {
      const next = queue.jobs.next()
      if (next === undefined) return Effect.void
      return Effect.ensuring(next.item, Effect.andThen(Effect.sync(() => queue.jobs.done(next.key)), finished))
    }),
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
    const syncQueue = yield* makeFairQueue(options.queueCapacity)
    const normalQueue = yield* makeFairQueue(options.queueCapacity)
    const lanes: Array<FairQueue> = []
    for (let i = 0; i < options.affinityLanes; i++) lanes.push(yield* makeFairQueue(options.queueCapacity))
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
    const laneOf = (peer: string): FairQueue => {
      let idx = pinned.get(peer)
      if (idx === undefined) {
        idx = nextLane
        nextLane = (nextLane + 1) % lanes.length
        pinned.set(peer, idx)
      }
      return lanes[idx]!
    }
    const queueOf = (pool: Pool, peer: string): FairQueue => pool === "SYNC" ? syncQueue : pool === "NORMAL" ? normalQueue : laneOf(peer)

    const share = poolSharePerPeer(options.queueCapacity)
    const isFull = (q: FairQueue): boolean => q.jobs.size() >= options.queueCapacity

    const refusal = (pool: Pool, peer: string): Refusal | undefined => {
      if (draining) return "draining"
      const q = queueOf(pool, peer)
      if (isFull(q)) return "pool_full"
      return q.jobs.waiting(peer) >= share ? "peer_full" : undefined
    }

    const submit = (pool: Pool, peer: string, job: Job): boolean => {
      if (draining) return false
      const q = queueOf(pool, peer)
      // The peer's share is the queue's own bound (`push` refuses past it).
      if (isFull(q) || !q.jobs.push(peer, job, 1)) return false
      Queue.offerUnsafe(q.tickets, undefined)
      if (pool === "SYNC") syncHeld++
      else if (pool === "NORMAL") normalHeld++
      return true
    }

    const hasFreeSlot = (pool: Pool): boolean =>
      !draining && (pool === "SYNC" ? syncHeld === 0 : pool === "NORMAL" && normalHeld < options.normalWorkers)

    const drain = (timeout: Duration.Input): Effect.Effect<void> =>
      Effect.gen(function*() {
        draining = true
        for (const q of [syncQueue, normalQueue, ...lanes]) yield* Queue.end(q.tickets)
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
      refusal,
      stats: () => ({
        sync: { queued: syncQueue.jobs.size() },
        normal: { workers: options.normalWorkers, queued: normalQueue.jobs.size() },
        affinity: { lanes: lanes.length, queued: lanes.map((l) => l.jobs.size()), pinnedPeers: pinned.size }
      }),
      drain
    }
  })
