/**
 * The worker adapter (client side; upstream `LMCacheMPWorkerAdapter`, DESIGN
 * §6, reference §6.3): what an engine worker process (one GPU rank) uses to
 * talk to the server. It registers the worker's KV cache, stores and
 * retrieves chunks by block ids, reports finished requests to the engine
 * (`getFinished`), and keeps the server aware that it is alive.
 *
 * Liveness (DESIGN §6) is the session core's (Session.ts), which this
 * adapter shares with the engine-driven one; this file keeps the transfers:
 * - The instance id is 63 random bits from a v4 UUID, logged at INFO at
 *   construction (upstream #3631; never the PID).
 * - A heartbeat (Heartbeat.ts) starts after a successful
 *   registration, and defensively on the first store or retrieve; starting
 *   twice is a no-op, a failed registration starts nothing. Once registered,
 *   each cycle sends PING_REGISTERED (id, ["kv_cache"]), which the server
 *   counts as the liveness ping; when the server reports the kind missing
 *   (it restarted, or reaped this worker while it was paused) the adapter
 *   re-registers at once with the same id. A server that answers
 *   PING_REGISTERED with `unknown_op` predates it: the adapter falls back to
 *   PING [id] until the next unhealthy→healthy edge. A transfer answered
 *   `not_registered` re-registers too.
 * - Degraded mode while unhealthy: stores are not sent (reported as finished
 *   stores), retrieves are not sent and `getFinished` reports them failed
 *   exactly once, and `getFinished` reports every pending transfer, so the
 *   engine never waits for ever. On the unhealthy→healthy edge the adapter
 *   re-registers before health is set; a failed re-registration keeps it
 *   unhealthy until the next successful ping.
 * - Bookkeeping (issue 18 item 1): a request is tracked only while it has a
 *   transfer not yet reported, and a finished id only while a store of it is
 *   pending; `tracking` shows the counts (for tests and status).
 * - Shutdown (the Scope closing): stop the heartbeat, then UNREGISTER (a
 *   failure only logs a WARNING), then the socket closes with a bounded
 *   linger (the client's own finalizer, when `makeWorkerAdapter` made it).
 *   Nothing re-registers once shutdown has begun.
 */
import { Context, Effect, Exit, Fiber, Layer, type Scope } from "effect"
import { handOverMemfds, withFdToken } from "./MemfdHandOver.ts"
import { type PayloadOf, RegisterKvCache, Retrieve, Store, UnregisterKvCache } from "../../schema/Op.ts"
import type { LayoutHints } from "../../schema/Registration.ts"
import type { TensorDescriptor } from "../../schema/TensorDescriptor.ts"
import { InvalidArgument } from "../../schema/WireError.ts"
import type { MqClientShape, RequestError } from "./MqClient.ts"
import {
  makeSession,
  openSession,
  type RequestRange,
  type SessionEvent,
  type SessionSettings,
  type SessionView,
  withOwnClient
} from "./Session.ts"
import type { DealerCurve, ZmqSockets } from "../zmq/Sockets.ts"

export {
  MIN_SERVER_REAP_TIMEOUT_MS,
  type RegistrationReason,
  UNREGISTER_TIMEOUT_MS,
  warnIfHeartbeatTooSlow
} from "./Session.ts"

/** Adapter settings that do not depend on how the client is made (the session's, plus the engine name). Times in ms. */
export interface WorkerAdapterSettings extends SessionSettings {
  /** Engine name sent at registration. Default "vllm". */
  readonly engineType?: string
}

/** Settings plus the server endpoint, for {@link makeWorkerAdapter}. */
export interface WorkerAdapterOptions extends WorkerAdapterSettings {
  /** Server endpoint, e.g. `tcp://127.0.0.1:5555`. */
  readonly endpoint: string
  /** CURVE keys (MqClientOptions.curve); absent: no CURVE. */
  readonly curve?: DealerCurve
}

/** A token range of one request and the worker blocks that hold it. */
export interface TransferRequest extends RequestRange {
  /** One block id per `block_size` tokens of [start, end). */
  readonly blockIds: ReadonlyArray<number>
}

/** What `getFinished` reports to the engine each step. */
export interface FinishedTransfers {
  /** Stores that completed (or were skipped in degraded mode) for requests the engine has reported finished. */
  readonly finishedStores: ReadonlyArray<string>
  /** Retrieves that completed (successfully or not), including those dropped in degraded mode. */
  readonly finishedRetrieves: ReadonlyArray<string>
  /** Retrieves that failed or were dropped: the engine recomputes their blocks. */
  readonly failedRetrieves: ReadonlyArray<string>
}

/**
 * The adapter's per-request bookkeeping, for tests and status (issue 18
 * item 1). Every count is bounded by the requests in flight and is 0 once
 * `getFinished` has reported every transfer.
 */
export interface RequestTracking {
  /** Requests with a transfer submitted and not yet reported by `getFinished`. */
  readonly pendingRequests: number
  /** Of those, the ones the engine reported finished whose stores are still awaited. */
  readonly finishedAwaitingStores: number
  /** Retrieves dropped in degraded mode, reported failed by the next `getFinished`. */
  readonly droppedRetrieves: number
}

/**
 * The adapter's event log, for tests and replay: heartbeat events plus
 * registration outcomes (the session's, Session.ts). `atMs` is Effect Clock time, ms.
 */
export type WorkerAdapterEvent = SessionEvent

/** The adapter's interface; `WorkerAdapter` is the service, `makeWorkerAdapter(With)` builds one. */
export interface WorkerAdapterShape extends SessionView {
  /**
   * REGISTER_KV_CACHE for this instance, then starts the heartbeat. Fails
   * with InvalidArgument when the block size does not divide the chunk size
   * (checked before sending), or as the server answers; a failure starts
   * no heartbeat. The descriptors and hints are kept for re-registration.
   */
  readonly registerKvCaches: (kvCaches: ReadonlyArray<TensorDescriptor>, layoutHints?: LayoutHints) => Effect.Effect<void, RequestError>
  /**
   * REGISTER_KV_CACHE of a paged KV cache (PagedKvCache.ts), as
   * `registerKvCaches`: cpu_shm descriptors as they are; cpu_memfd (the
   * default backing) hands the cache's memfds over before every REGISTER,
   * re-registrations included, and sends the descriptors with the fresh
   * token (MemfdHandOver.ts; issue 13 item 2). Also fails as the handover
   * does (the server takes no memfd, refuses an unsealed one …).
   */
  readonly registerPagedKvCache: (
    cache: { readonly descriptors: ReadonlyArray<TensorDescriptor>; readonly memfds: ReadonlyArray<number> },
    layoutHints?: LayoutHints
  ) => Effect.Effect<void, RequestError>
  /** STORE and wait: true when the server stored every chunk it could; false at once (nothing sent) in degraded mode. */
  readonly store: (request: TransferRequest) => Effect.Effect<boolean, RequestError>
  /** RETRIEVE and wait, leaving the first `skipFirstNTokens` untouched; false at once (nothing sent) in degraded mode. */
  readonly retrieve: (request: TransferRequest, skipFirstNTokens?: number) => Effect.Effect<boolean, RequestError>
  /** Starts a store in the background; its completion shows in `getFinished`. Degraded mode: not sent, reported as finished. */
  readonly submitStore: (request: TransferRequest) => Effect.Effect<void>
  /** Starts a retrieve in the background; its completion shows in `getFinished` exactly once. Degraded mode: not sent, reported failed once. */
  readonly submitRetrieve: (request: TransferRequest, skipFirstNTokens?: number) => Effect.Effect<void>
  /**
   * The engine's per-step poll: `finishedRequestIds` are the requests it
   * finished this step. A finished report covers the stores submitted for
   * the request before it (upstream `previously_finished`); an id with no
   * store pending is not kept, so the bookkeeping stays bounded by the
   * requests in flight (issue 18 item 1; see `tracking`).
   */
  readonly getFinished: (finishedRequestIds: ReadonlyArray<string>) => Effect.Effect<FinishedTransfers>
  /** The per-request bookkeeping now, for tests and status (read-only). */
  readonly tracking: Effect.Effect<RequestTracking>
}

/** The worker adapter as a service (one per worker process and server). */
export class WorkerAdapter extends Context.Service<WorkerAdapter, WorkerAdapterShape>()("mpcache/services/WorkerAdapter") {
  /** An adapter with its own client for the life of the layer. */
  static readonly layer = (options: WorkerAdapterOptions) => Layer.effect(this, makeWorkerAdapter(options))
  /**
   * For tests: the real adapter over `client` instead of its own socket
   * (the scripted fake of test/support/FakeMqClient.ts records and answers
   * every request); closing the layer runs its shutdown (UNREGISTER) on it.
   */
  static readonly layerTest = (client: MqClientShape, settings: WorkerAdapterSettings) =>
    Layer.effect(this, makeWorkerAdapterWith(client, settings))
}

interface Pending {
  readonly kind: "store" | "retrieve"
  /** The transfer's outcome once known; undefined while in flight. */
  readonly poll: () => Exit.Exit<boolean, RequestError> | undefined
  /** The fiber sending it; absent for a store skipped in degraded mode. */
  readonly fiber?: Fiber.Fiber<boolean, RequestError>
}

interface Registration {
  readonly kvCaches: ReadonlyArray<TensorDescriptor>
  readonly layoutHints: LayoutHints
  /** cpu_memfd: the descriptors to hand over before each REGISTER; empty otherwise. */
  readonly memfds: ReadonlyArray<number>
}

/**
 * Builds an adapter on `client` in the current Scope: asks the chunk size
 * (fails with the client's error, e.g. RequestTimeout, when the server does
 * not answer), logs the instance id at INFO, and warns when 3 × the heartbeat
 * interval exceeds the server's 30 s minimum reap timeout. Fails with
 * InvalidArgument on a heartbeat interval or timeout that is not a positive
 * number. Closing the Scope stops the heartbeat, then sends UNREGISTER;
 * closing `client` is its owner's business (after this Scope's finalizer).
 */
export const makeWorkerAdapterWith = (
  client: MqClientShape,
  options: WorkerAdapterSettings
): Effect.Effect<WorkerAdapterShape, RequestError, Scope.Scope> =>
  Effect.gen(function*() {
    const opening = yield* openSession(client, options)
    const session = yield* makeSession(opening, {
      kind: "kv_cache",
      registerOp: RegisterKvCache,
      registerPayload: (reg: Registration): PayloadOf<typeof RegisterKvCache> => [
        opening.instanceId,
        reg.kvCaches,
        options.modelName,
        options.worldSize,
        options.engineType ?? "vllm",
        reg.layoutHints,
        []
      ],
      prepare: (reg: Registration) =>
        reg.memfds.length === 0
          ? Effect.succeed(reg)
          : Effect.map(
            handOverMemfds(client, opening.instanceId, reg.memfds, opening.requestTimeoutMs),
            (token) => ({ ...reg, kvCaches: withFdToken(reg.kvCaches, token) })
          ),
      unregisterOp: UnregisterKvCache,
      legacyPingNote: "(a server restart is then noticed only through a not_registered reply to a transfer)"
    })
    const { beforeTransfer, chunkSizeTokens, instanceId, keyOf, transfer } = session
    const scope = yield* Effect.scope
    const pending = new Map<string, Array<Pending>>()
    /**
     * Requests the engine reported finished whose stores are still pending
     * (upstream `previously_finished`). Only ids with a pending store are
     * kept, so it never outgrows `pending` (issue 18 item 1).
     */
    const finishedRequests = new Set<string>()
    const hasPendingStore = (requestId: string) => pending.get(requestId)?.some((p) => p.kind === "store") ?? false
    let droppedRetrieves: Array<string> = []

    const registerKvCaches = (kvCaches: ReadonlyArray<TensorDescriptor>, layoutHints: LayoutHints = {}, memfds: ReadonlyArray<number> = []) =>
      Effect.gen(function*() {
        const blockSize = kvCaches[0]?.shape[2]
        if (blockSize !== undefined && chunkSizeTokens % blockSize !== 0) {
          return yield* new InvalidArgument({
            message: `the server's chunk size (${chunkSizeTokens} tokens) is not a multiple of the engine block size (${blockSize})`
          })
        }
        const untokened = kvCaches.findIndex((d) => d.kind === "cpu_memfd" && d.fd_token === undefined)
        if (untokened >= 0 && memfds.length === 0) {
          return yield* new InvalidArgument({
            field: `kv_caches[${untokened}].fd_token`,
            message: `kv_caches[${untokened}] is a cpu_memfd descriptor without a token: register a memfd cache with registerPagedKvCache (it hands the descriptors over)`
          })
        }
        yield* session.register({ kvCaches, layoutHints, memfds })
      })

    const sendStore = (r: TransferRequest) =>
      transfer(Store, [keyOf(r), instanceId, [r.blockIds], new Uint8Array(0)]).pipe(Effect.map(([, ok]) => ok))
    const sendRetrieve = (r: TransferRequest, skip: number) =>
      transfer(Retrieve, [keyOf(r), instanceId, [r.blockIds], new Uint8Array(0), skip]).pipe(Effect.map(([, ok]) => ok))

    const store = (r: TransferRequest) =>
      Effect.gen(function*() {
        if (!(yield* beforeTransfer)) return false
        return yield* sendStore(r)
      })
    const retrieve = (r: TransferRequest, skip = 0) =>
      Effect.gen(function*() {
        if (!(yield* beforeTransfer)) return false
        return yield* sendRetrieve(r, skip)
      })

    const addPending = (requestId: string, entry: Pending) => {
      const list = pending.get(requestId) ?? []
      list.push(entry)
      pending.set(requestId, list)
    }

    const track = (requestId: string, kind: Pending["kind"], run: Effect.Effect<boolean, RequestError>) =>
      Effect.gen(function*() {
        const fiber = yield* Effect.forkIn(run, scope)
        addPending(requestId, { kind, fiber, poll: () => fiber.pollUnsafe() })
      })

    const submitStore = (r: TransferRequest) =>
      Effect.gen(function*() {
        if (yield* beforeTransfer) return yield* track(r.requestId, "store", sendStore(r))
        const skipped = Exit.succeed(false)
        addPending(r.requestId, { kind: "store", poll: () => skipped })
        yield* Effect.logDebug(`degraded mode: store for ${r.requestId} not sent`)
      })

    const submitRetrieve = (r: TransferRequest, skip = 0) =>
      Effect.gen(function*() {
        if (yield* beforeTransfer) return yield* track(r.requestId, "retrieve", sendRetrieve(r, skip))
        droppedRetrieves.push(r.requestId)
        yield* Effect.logDebug(`degraded mode: retrieve for ${r.requestId} not sent; reported failed`)
      })

    const getFinished = (finishedRequestIds: ReadonlyArray<string>) =>
      Effect.gen(function*() {
        const healthy = yield* session.view.isHealthy
        // A finished report covers the stores submitted before it (the engine submits them in the same step).
        for (const id of finishedRequestIds) if (hasPendingStore(id)) finishedRequests.add(id)
        const finishedStores: Array<string> = []
        const finishedRetrieves: Array<string> = []
        const failedRetrieves: Array<string> = []
        const abandoned: Array<Fiber.Fiber<boolean, RequestError>> = []
        for (const [requestId, list] of pending) {
          const remaining = list.filter((p) => {
            const exit = p.poll()
            if (exit === undefined && healthy) return true
            // Degraded mode drains every pending transfer (upstream get_finished while unhealthy).
            if (exit === undefined && p.fiber !== undefined) abandoned.push(p.fiber)
            if (p.kind === "retrieve") {
              finishedRetrieves.push(requestId)
              if (exit === undefined || Exit.isFailure(exit) || !exit.value) failedRetrieves.push(requestId)
              return false
            }
            if (healthy && !finishedRequests.has(requestId)) return true
            finishedStores.push(requestId)
            return false
          })
          if (remaining.length === 0) pending.delete(requestId)
          else pending.set(requestId, remaining)
        }
        // Whatever store drained above (a retrieve of the same request may still be in flight) frees its id.
        for (const id of finishedRequests) if (!hasPendingStore(id)) finishedRequests.delete(id)
        // Swap-drain: each dropped retrieve is reported exactly once (upstream `_dropped_retrieves`).
        const dropped = droppedRetrieves
        droppedRetrieves = []
        finishedRetrieves.push(...dropped)
        failedRetrieves.push(...dropped)
        if (abandoned.length > 0) yield* Effect.forkIn(Fiber.interruptAll(abandoned), scope)
        return {
          finishedStores: [...new Set(finishedStores)],
          finishedRetrieves: [...new Set(finishedRetrieves)],
          failedRetrieves: [...new Set(failedRetrieves)]
        }
      })

    return {
      ...session.view,
      registerKvCaches: (kvCaches, layoutHints) => registerKvCaches(kvCaches, layoutHints),
      registerPagedKvCache: (cache, layoutHints) => registerKvCaches(cache.descriptors, layoutHints, cache.memfds),
      store,
      retrieve,
      submitStore,
      submitRetrieve,
      getFinished,
      tracking: Effect.sync((): RequestTracking => ({
        pendingRequests: pending.size,
        finishedAwaitingStores: finishedRequests.size,
        droppedRetrieves: droppedRetrieves.length
      }))
    } satisfies WorkerAdapterShape
  })

/**
 * Builds an adapter with its own MQ client in the current Scope: connects,
 * then {@link makeWorkerAdapterWith}. On close the adapter's finalizer
 * (heartbeat stop, UNREGISTER) runs before the socket closes with its
 * bounded linger.
 */
export const makeWorkerAdapter = (options: WorkerAdapterOptions): Effect.Effect<WorkerAdapterShape, RequestError, Scope.Scope | ZmqSockets> =>
  withOwnClient(options, (client) => makeWorkerAdapterWith(client, options))
