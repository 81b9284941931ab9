/**
 * The worker adapter (client side; upstream `LMCacheMPWorkerAdapter`, DESIGN
 * §6, reference §6.3): what an engine worker process (one GPU rank) uses to
 * talk to the server. It registers the worker's KV cache, stores and
 * retrieves chunks by block ids, reports finished requests to the engine
 * (`getFinished`), and keeps the server aware that it is alive.
 *
 * Liveness (DESIGN §6):
 * - The instance id is 63 random bits from a v4 UUID, logged at INFO at
 *   construction (upstream #3631; never the PID).
 * - A heartbeat (src/services/Heartbeat.ts) starts after a successful
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
 * - Shutdown (the Scope closing): stop the heartbeat, then UNREGISTER (a
 *   failure only logs a WARNING), then the socket closes with a bounded
 *   linger (the client's own finalizer, when `makeWorkerAdapter` made it).
 *   Nothing re-registers once shutdown has begun.
 */
import { Clock, Context, Effect, Exit, Fiber, Layer, Ref, type Scope, Semaphore } from "effect"
import type { CacheKey } from "../../schema/CacheKey.ts"
import { formatInstanceId, type InstanceId } from "../../schema/InstanceId.ts"
import { GetChunkSize, Ping, PingRegistered, RegisterKvCache, Retrieve, Store, UnregisterKvCache } from "../../schema/Op.ts"
import type { LayoutHints } from "../../schema/Registration.ts"
import type { TensorDescriptor } from "../../schema/TensorDescriptor.ts"
import { InvalidArgument } from "../../schema/WireError.ts"
import {
  appendEvent,
  causeText,
  type HeartbeatEvent,
  heartbeatTimes,
  makeHeartbeat,
  pingFailureReason,
  PingResult,
  type RecoverTrigger
} from "./Heartbeat.ts"
import { newInstanceId } from "./InstanceIdGen.ts"
import { makeMqClient, type MqClientShape, type RequestError } from "./MqClient.ts"
import type { ZmqSockets } from "../zmq/Sockets.ts"

/** The server's smallest non-zero `--worker-reap-timeout-seconds`, in ms (DESIGN §5). */
export const MIN_SERVER_REAP_TIMEOUT_MS = 30_000

/**
 * Warns at construction when 3 × the heartbeat interval exceeds the server's
 * minimum reap timeout (DESIGN §6; upstream's adapter warning): a worker that
 * misses a couple of pings could then be reaped while alive.
 */
export const warnIfHeartbeatTooSlow = (heartbeatIntervalMs: number): Effect.Effect<void> =>
  3 * heartbeatIntervalMs > MIN_SERVER_REAP_TIMEOUT_MS
    ? Effect.logWarning(
      `heartbeat interval ${heartbeatIntervalMs / 1000} s: 3 × interval = ${(3 * heartbeatIntervalMs) / 1000} s exceeds ` +
        `the server's minimum reap timeout (${MIN_SERVER_REAP_TIMEOUT_MS / 1000} s); run the server with ` +
        `--worker-reap-timeout-seconds of at least ${Math.ceil((3 * heartbeatIntervalMs) / 1000)} or this live worker may be reaped`
    )
    : Effect.void

/** How long shutdown waits for the UNREGISTER reply, ms; a timeout only logs (upstream `shutdown()`). */
export const UNREGISTER_TIMEOUT_MS = 5_000

/** Adapter settings that do not depend on how the client is made. Times in ms. */
export interface WorkerAdapterSettings {
  /** Model name in every key and in REGISTER. */
  readonly modelName: string
  /** KV world size: how many shards a chunk is split into. */
  readonly worldSize: number
  /** The shard (kv rank) this worker owns. */
  readonly kvRank: number
  /** Engine name sent at registration. Default "vllm". */
  readonly engineType?: string
  /** Per-request timeout in ms for REGISTER and transfers (upstream `lmcache.mp.mq_timeout`). Default 30,000. */
  readonly requestTimeoutMs?: number
  /** Fixed instance id (tests, replay); default a fresh random one. */
  readonly instanceId?: InstanceId
  /** Salt for per-tenant isolation of every key. Default "". */
  readonly cacheSalt?: string
  /** Time between heartbeat pings, ms (DESIGN §6). Default 10,000. Must be > 0. */
  readonly heartbeatIntervalMs?: number
  /** How long one heartbeat ping may take before it counts as failed, ms (upstream #4593). Default = the interval. */
  readonly heartbeatTimeoutMs?: number
}

/** Settings plus the server endpoint, for {@link makeWorkerAdapter}. */
export interface WorkerAdapterOptions extends WorkerAdapterSettings {
  /** Server endpoint, e.g. `tcp://127.0.0.1:5555`. */
  readonly endpoint: string
}

/** A token range of one request and the worker blocks that hold it. */
export interface TransferRequest {
  readonly requestId: string
  /** The request's full token prefix. */
  readonly tokenIds: ReadonlyArray<number>
  /** Chunk-aligned start of the range, tokens. */
  readonly start: number
  /** End of the range, tokens (a trailing partial chunk is ignored). */
  readonly end: number
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
 * Why the adapter sent REGISTER: `initial` (registerKvCaches), `recover`
 * (the unhealthy→healthy edge), `missing` (PING_REGISTERED said the server
 * does not hold it), `not_registered` (a transfer was answered so).
 */
export type RegistrationReason = "initial" | "recover" | "missing" | "not_registered"

/**
 * The adapter's event log, for tests and replay: heartbeat events plus
 * registration outcomes. `atMs` is Effect Clock time, ms.
 */
export type WorkerAdapterEvent =
  | HeartbeatEvent
  | { readonly _tag: "Registered"; readonly atMs: number; readonly reason: RegistrationReason }
  | { readonly _tag: "RegisterFailed"; readonly atMs: number; readonly reason: RegistrationReason; readonly message: string }
  | { readonly _tag: "Unregistered"; readonly atMs: number; readonly ok: boolean }

/** The adapter's interface; `WorkerAdapter` is the service, `makeWorkerAdapter(With)` builds one. */
export interface WorkerAdapterShape {
  /** This worker's 63-bit id (DESIGN §6), sent with every REGISTER, PING and transfer. */
  readonly instanceId: InstanceId
  /** The server's chunk size in tokens (asked at construction). */
  readonly chunkSizeTokens: number
  /**
   * REGISTER_KV_CACHE for this instance, then starts the heartbeat. Fails
   * with InvalidArgument when the block size does not divide the chunk size
   * (checked before sending), or as the server answers; a failure starts
   * no heartbeat. The descriptors and hints are kept for re-registration.
   */
  readonly registerKvCaches: (kvCaches: ReadonlyArray<TensorDescriptor>, layoutHints?: LayoutHints) => Effect.Effect<void, RequestError>
  /** STORE and wait: true when the server stored every chunk it could; false at once (nothing sent) in degraded mode. */
  readonly store: (request: TransferRequest) => Effect.Effect<boolean, RequestError>
  /** RETRIEVE and wait, leaving the first `skipFirstNTokens` untouched; false at once (nothing sent) in degraded mode. */
  readonly retrieve: (request: TransferRequest, skipFirstNTokens?: number) => Effect.Effect<boolean, RequestError>
  /** Starts a store in the background; its completion shows in `getFinished`. Degraded mode: not sent, reported as finished. */
  readonly submitStore: (request: TransferRequest) => Effect.Effect<void>
  /** Starts a retrieve in the background; its completion shows in `getFinished` exactly once. Degraded mode: not sent, reported failed once. */
  readonly submitRetrieve: (request: TransferRequest, skipFirstNTokens?: number) => Effect.Effect<void>
  /** The engine's per-step poll: `finishedRequestIds` are the requests it finished this step. */
  readonly getFinished: (finishedRequestIds: ReadonlyArray<string>) => Effect.Effect<FinishedTransfers>
  /** False in degraded mode (the last ping failed and no successful ping and re-registration has followed). */
  readonly isHealthy: Effect.Effect<boolean>
  /** True while the heartbeat fiber runs (after registration or the first transfer, until shutdown). */
  readonly heartbeatRunning: Effect.Effect<boolean>
  /** The event log, oldest first (at most `MAX_EVENTS` of Heartbeat.ts). */
  readonly events: Effect.Effect<ReadonlyArray<WorkerAdapterEvent>>
  /** REGISTERs that succeeded after the initial one (every reason but `initial`). */
  readonly reregistrations: Effect.Effect<number>
}

/** The worker adapter as a service (one per worker process and server). */
export class WorkerAdapter extends Context.Service<WorkerAdapter, WorkerAdapterShape>()("mpcache/services/WorkerAdapter") {
  /** An adapter with its own client for the life of the layer. */
  static readonly layer = (options: WorkerAdapterOptions) => Layer.effect(this, makeWorkerAdapter(options))
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
    const [heartbeatIntervalMs, heartbeatTimeoutMs] = yield* heartbeatTimes(options)
    const requestTimeoutMs = options.requestTimeoutMs ?? 30_000
    const instanceId = options.instanceId ?? (yield* newInstanceId)
    const idText = formatInstanceId(instanceId)
    const chunkSizeTokens = yield* client.request(GetChunkSize, [], { timeoutMs: requestTimeoutMs })
    yield* Effect.logInfo(`mpcache worker adapter created with instance_id=${idText}`)
    yield* warnIfHeartbeatTooSlow(heartbeatIntervalMs)

    const scope = yield* Effect.scope
    const label = `mpcache server ${client.endpoint} (instance_id=${idText})`
    let registration: Registration | undefined
    /** Set when shutdown begins: nothing registers again after it. */
    let closing = false
    /** The server answered PING_REGISTERED with unknown_op: use PING [id] until the next recovery. */
    let legacyPing = false
    const registerLock = yield* Semaphore.make(1)
    const eventLog = yield* Ref.make<ReadonlyArray<WorkerAdapterEvent>>([])
    const reregistrations = yield* Ref.make(0)
    const pending = new Map<string, Array<Pending>>()
    const finishedRequests = new Set<string>()
    let droppedRetrieves: Array<string> = []

    const record = (event: WorkerAdapterEvent) => Ref.update(eventLog, (log) => appendEvent(log, event))
    const now = Clock.currentTimeMillis

    const sendRegister = (reg: Registration) =>
      client.request(RegisterKvCache, [
        instanceId,
        reg.kvCaches,
        options.modelName,
        options.worldSize,
        options.engineType ?? "vllm",
        reg.layoutHints,
        []
      ], { timeoutMs: requestTimeoutMs })

    /**
     * Re-sends REGISTER with the saved descriptors and the same id (upstream
     * `_reregister_kv_caches_callback`): true when there is nothing to do or
     * the server acknowledged; false during shutdown or on any error.
     * Serialized with the first registration and with UNREGISTER.
     */
    const reregister = (reason: Exclude<RegistrationReason, "initial">): Effect.Effect<boolean> =>
      registerLock.withPermits(1)(Effect.gen(function*() {
        if (closing) return false
        const reg = registration
        if (reg === undefined) return true
        const result = yield* Effect.exit(sendRegister(reg))
        if (Exit.isSuccess(result)) {
          yield* Ref.update(reregistrations, (n) => n + 1)
          yield* record({ _tag: "Registered", atMs: yield* now, reason })
          yield* Effect.logWarning(`re-registered instance_id=${idText} with ${client.endpoint} (${reason})`)
          return true
        }
        const message = causeText(result.cause)
        yield* record({ _tag: "RegisterFailed", atMs: yield* now, reason, message })
        yield* Effect.logWarning(`re-registration of instance_id=${idText} with ${client.endpoint} (${reason}) failed: ${message}`)
        return false
      }))

    const recover = (trigger: RecoverTrigger) =>
      Effect.suspend(() => {
        if (trigger === "edge") legacyPing = false
        return reregister(trigger === "edge" ? "recover" : "missing")
      })

    const ping: Effect.Effect<PingResult> = Effect.gen(function*() {
      if (registration !== undefined && !legacyPing) {
        const answer = yield* Effect.result(
          client.request(PingRegistered, [instanceId, ["kv_cache"]], { timeoutMs: heartbeatTimeoutMs })
        )
        if (answer._tag === "Success") {
          const missing = answer.success
          return missing.length === 0
            ? PingResult.alive
            : PingResult.lost(
              `the server does not hold ${missing.join(", ")} for instance_id=${idText} ` +
                `(it restarted, or reaped this worker while it was paused)`
            )
        }
        if (answer.failure._tag !== "UnknownOp") return PingResult.failed(pingFailureReason("ping_registered", answer.failure))
        legacyPing = true
        yield* Effect.logWarning(
          `${label} answered ping_registered with unknown_op: it predates it; falling back to plain ping ` +
            `(a server restart is then noticed only through a not_registered reply to a transfer)`
        )
      }
      const answer = yield* Effect.result(client.request(Ping, [instanceId], { timeoutMs: heartbeatTimeoutMs }))
      return answer._tag === "Success" ? PingResult.alive : PingResult.failed(pingFailureReason("ping", answer.failure))
    })

    const heartbeat = yield* makeHeartbeat({
      label,
      intervalMs: heartbeatIntervalMs,
      timeoutMs: heartbeatTimeoutMs,
      ping,
      recover,
      onEvent: record
    })

    const keyOf = (r: TransferRequest): CacheKey => ({
      model_name: options.modelName,
      world_size: options.worldSize,
      worker_id: options.kvRank,
      token_ids: r.tokenIds,
      start: r.start,
      end: r.end,
      request_id: r.requestId,
      cache_salt: options.cacheSalt ?? ""
    })

    const registerKvCaches = (kvCaches: ReadonlyArray<TensorDescriptor>, layoutHints: LayoutHints = {}) =>
      Effect.gen(function*() {
        const blockSize = kvCaches[0]?.shape[2]
        if (blockSize !== undefined && chunkSizeTokens % blockSize !== 0) {
          return yield* new InvalidArgument({
            message: `the server's chunk size (${chunkSizeTokens} tokens) is not a multiple of the engine block size (${blockSize})`
          })
        }
        const reg: Registration = { kvCaches, layoutHints }
        yield* registerLock.withPermits(1)(sendRegister(reg))
        registration = reg
        yield* record({ _tag: "Registered", atMs: yield* now, reason: "initial" })
        yield* heartbeat.start
      })

    /** A `not_registered` reply means the server lost this worker: re-register (DESIGN §6), then fail as before. */
    const reregisterOnNotRegistered = <A>(transfer: Effect.Effect<A, RequestError>) =>
      transfer.pipe(Effect.tapError((e) => (e._tag === "NotRegistered" ? Effect.asVoid(reregister("not_registered")) : Effect.void)))

    const sendStore = (r: TransferRequest) =>
      reregisterOnNotRegistered(
        client.request(Store, [keyOf(r), instanceId, [r.blockIds], new Uint8Array(0)], { timeoutMs: requestTimeoutMs })
      ).pipe(Effect.map(([, ok]) => ok))
    const sendRetrieve = (r: TransferRequest, skip: number) =>
      reregisterOnNotRegistered(
        client.request(Retrieve, [keyOf(r), instanceId, [r.blockIds], new Uint8Array(0), skip], { timeoutMs: requestTimeoutMs })
      ).pipe(Effect.map(([, ok]) => ok))

    /** Defensive start (upstream's lazy start, kept as a fallback), then the health check. */
    const beforeTransfer = Effect.andThen(heartbeat.start, heartbeat.isHealthy)

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
        const healthy = yield* heartbeat.isHealthy
        for (const id of finishedRequestIds) finishedRequests.add(id)
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
          if (remaining.length === 0) {
            pending.delete(requestId)
            if (list.some((p) => p.kind === "store")) finishedRequests.delete(requestId)
          } else pending.set(requestId, remaining)
        }
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

    yield* Effect.addFinalizer(() =>
      Effect.gen(function*() {
        closing = true
        yield* heartbeat.stop
        if (registration === undefined) return
        const result = yield* Effect.exit(
          registerLock.withPermits(1)(client.request(UnregisterKvCache, [instanceId], { timeoutMs: UNREGISTER_TIMEOUT_MS }))
        )
        yield* record({ _tag: "Unregistered", atMs: yield* now, ok: Exit.isSuccess(result) })
        if (Exit.isFailure(result)) {
          yield* Effect.logWarning(`unregister of instance_id=${idText} failed: ${causeText(result.cause)}`)
        }
      })
    )

    return {
      instanceId,
      chunkSizeTokens,
      registerKvCaches,
      store,
      retrieve,
      submitStore,
      submitRetrieve,
      getFinished,
      isHealthy: heartbeat.isHealthy,
      heartbeatRunning: heartbeat.isRunning,
      events: Ref.get(eventLog),
      reregistrations: Ref.get(reregistrations)
    } satisfies WorkerAdapterShape
  })

/**
 * Builds an adapter with its own MQ client in the current Scope: connects,
 * then {@link makeWorkerAdapterWith}. On close the adapter's finalizer
 * (heartbeat stop, UNREGISTER) runs before the socket closes with its
 * bounded linger.
 */
export const makeWorkerAdapter = (options: WorkerAdapterOptions): Effect.Effect<WorkerAdapterShape, RequestError, Scope.Scope | ZmqSockets> =>
  Effect.gen(function*() {
    const client = yield* makeMqClient({ endpoint: options.endpoint, requestTimeoutMs: options.requestTimeoutMs ?? 30_000 })
    return yield* makeWorkerAdapterWith(client, options)
  })
