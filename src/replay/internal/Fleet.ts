/**
 * The replay's servers and workers: per server ("node") its scheduler, every
 * worker ever started on it and a queue of its idle ones; every worker
 * shut down when the scope closes.
 *
 * @internal
 */
import { Effect, Queue, type Scope } from "effect"
import { makeSchedulerAdapter, type SchedulerAdapterShape } from "../../services/client/SchedulerAdapter.ts"
import type { ClientCurveKeys } from "../../services/auth/Curve.ts"
import type { ZmqSockets } from "../../services/zmq/Sockets.ts"
import type { WorkerSettings } from "../Messages.ts"
import { ReplayError } from "../ReplayOptions.ts"
import { spawnWorker, type WorkerDied, type WorkerHandle } from "../WorkerPool.ts"

/** One server of the replay and its share of the figures. */
export interface Node {
  readonly index: number
  readonly endpoint: string
  /** Its HTTP frontend (a restarted server listens on a new port). */
  httpUrl: string
  /** Its frontend's bearer token (the replay's own CURVE servers), else undefined. */
  readonly httpToken: string | undefined
  readonly scheduler: SchedulerAdapterShape
  readonly idle: Queue.Queue<WorkerHandle>
  readonly workers: Array<WorkerHandle>
  requests: number
  lookedUp: number
  hit: number
  /** Requests dispatched to it and not yet done (the kv-aware router's tie-break). */
  inflight: number
}

/** The servers and every worker ever started on them. */
export interface Fleet {
  readonly nodes: ReadonlyArray<Node>
  /** Every worker ever started (on any server). */
  readonly all: ReadonlyArray<WorkerHandle>
  /** The server `w` serves. */
  readonly nodeOf: (w: WorkerHandle) => Node
  /** Starts a worker on `node` (idle at once). */
  readonly start: (node: Node) => Effect.Effect<WorkerHandle, WorkerDied>
  /** Marks `w` dead from now on (SIGKILLed: its exit event comes a moment later). */
  readonly markKilled: (w: WorkerHandle) => void
  /** The live workers. */
  readonly alive: () => ReadonlyArray<WorkerHandle>
  /** An idle live worker of `node`, waiting for one. */
  readonly takeWorker: (node: Node) => Effect.Effect<WorkerHandle>
}

/**
 * A scheduler per place (ReplayError when one cannot reach its server) and
 * `workersPerNode` workers on each (ReplayError when one fails to start).
 */
export const makeFleet = (options: {
  readonly places: ReadonlyArray<{ readonly endpoint: string; readonly httpUrl: string; readonly httpToken: string | undefined }>
  readonly modelName: string
  readonly clientCurve: ClientCurveKeys | undefined
  readonly workersPerNode: number
  readonly settings: (slot: number, endpoint: string) => WorkerSettings
}): Effect.Effect<Fleet, ReplayError, Scope.Scope | ZmqSockets> =>
  Effect.gen(function*() {
    const { clientCurve } = options
    const nodes: ReadonlyArray<Node> = yield* Effect.forEach(options.places, (place, index) =>
      Effect.gen(function*() {
        const scheduler = yield* makeSchedulerAdapter({
          endpoint: place.endpoint,
          modelName: options.modelName,
          worldSize: 1,
          requestTimeoutMs: 30_000,
          ...(clientCurve === undefined ? {} : { curve: clientCurve })
        }).pipe(
          Effect.mapError((e) => new ReplayError({ message: `scheduler could not reach ${place.endpoint}: ${e.message}` }))
        )
        const idle = yield* Queue.unbounded<WorkerHandle>()
        return { index, ...place, scheduler, idle, workers: [] as Array<WorkerHandle>, requests: 0, lookedUp: 0, hit: 0, inflight: 0 }
      }))

    const all: Array<WorkerHandle> = []
    const nodeOf = new Map<WorkerHandle, Node>()
    let nextSlot = 1
    const start = (node: Node) =>
      Effect.gen(function*() {
        const slot = nextSlot++
        const w = yield* spawnWorker(slot, options.settings(slot, node.endpoint))
        all.push(w)
        node.workers.push(w)
        nodeOf.set(w, node)
        yield* Queue.offer(node.idle, w)
        return w
      })
    yield* Effect.addFinalizer(() => Effect.forEach(all, (w) => w.shutdown(10_000), { concurrency: "unbounded", discard: true }))
    yield* Effect.forEach(nodes.flatMap((n) => Array.from({ length: options.workersPerNode }, () => n)), start, { concurrency: "unbounded", discard: true }).pipe(
      Effect.mapError((e) => new ReplayError({ message: `a worker failed to start: ${e.message}` }))
    )
    // SIGKILLed workers count as dead from the kill on: their exit event comes a moment later, and a sample
    // taken in between (the kill's own) would otherwise show them alive.
    const killedWorkers = new Set<WorkerHandle>()
    const takeWorker = (node: Node): Effect.Effect<WorkerHandle> =>
      Effect.flatMap(Queue.take(node.idle), (w) => (w.isAlive() ? Effect.succeed(w) : takeWorker(node)))
    return {
      nodes,
      all,
      nodeOf: (w) => nodeOf.get(w)!,
      start,
      markKilled: (w) => void killedWorkers.add(w),
      alive: () => all.filter((w) => w.isAlive() && !killedWorkers.has(w)),
      takeWorker
    }
  })
