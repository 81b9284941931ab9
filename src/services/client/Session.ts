/**
 * The worker session core (client side; DESIGN §6, reference §6.3): the
 * liveness machinery that the LMCache-driven worker adapter
 * (WorkerAdapter.ts) and the engine-driven one (EngineDrivenWorkerAdapter.ts)
 * share. An adapter opens a session, registers through it, sends its
 * transfers through it, and keeps only its own transfer logic.
 *
 * What a session holds:
 * - The identity: a 63-bit random instance id (never the PID; upstream
 *   #3631), the server's chunk size (GET_CHUNK_SIZE at construction), the
 *   INFO construction log, and the warning when 3 × the heartbeat interval
 *   exceeds the server's minimum reap timeout.
 * - Registration: the initial REGISTER (serialized with re-registration and
 *   UNREGISTER by one lock), then the heartbeat starts; the request is kept
 *   so that `reregister(reason)` re-sends it with the same id. A REGISTER
 *   answer goes to the adapter's `onRegistered` (the engine-driven pool).
 * - The heartbeat (Heartbeat.ts): once registered each cycle sends
 *   PING_REGISTERED (id, [kind]); a kind reported missing re-registers at
 *   once; a server that answers `unknown_op` predates it, and the session
 *   falls back to PING [id] until the next unhealthy→healthy edge, where
 *   `recover` re-registers before health is set.
 * - Transfers: a `not_registered` answer re-registers, then fails as before;
 *   `beforeTransfer` starts the heartbeat defensively and says whether the
 *   session is healthy (degraded mode otherwise).
 * - The event log and the re-registration counter.
 * - Shutdown (the Scope closing): set the closing flag (nothing registers
 *   again), stop the heartbeat, UNREGISTER with a bounded timeout (a failure
 *   only logs a WARNING); the socket closes after, by its owner.
 *
 * Construction is two steps because an adapter checks its own layout
 * against the chunk size before it announces itself: `openSession` (id,
 * heartbeat times, GET_CHUNK_SIZE), then `makeSession` (the log lines, the
 * heartbeat, the finalizer).
 */
import { Clock, Effect, Exit, Ref, type Scope, Semaphore } from "effect"
import type { CacheKey } from "../../schema/CacheKey.ts"
import { formatInstanceId, type InstanceId } from "../../schema/InstanceId.ts"
import {
  GetChunkSize,
  type Op,
  type PayloadOf,
  Ping,
  PingRegistered,
  type ResponseOf,
  type UnregisterKvCache,
  type UnregisterKvCacheEngineDrivenContext
} from "../../schema/Op.ts"
import type { RegistrationKind } from "../../schema/Registration.ts"
import type { DealerCurve, ZmqSockets } from "../zmq/Sockets.ts"
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

/** Default per-request timeout of a worker session, ms (upstream `lmcache.mp.mq_timeout`). */
export const DEFAULT_REQUEST_TIMEOUT_MS = 30_000

/** Settings every worker session has; both adapters' settings extend them. Times in ms. */
export interface SessionSettings {
  /** Model name in every key and in REGISTER. */
  readonly modelName: string
  /** KV world size: how many shards a chunk is split into. */
  readonly worldSize: number
  /** The shard (kv rank) this worker owns. */
  readonly kvRank: number
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

/** A token range of one request: what a cache key is made of. */
export interface RequestRange {
  readonly requestId: string
  /** The request's full token prefix. */
  readonly tokenIds: ReadonlyArray<number>
  /** Chunk-aligned start of the range, tokens. */
  readonly start: number
  /** End of the range, tokens (a trailing partial chunk is ignored). */
  readonly end: number
}

/**
 * Why the adapter sent REGISTER: `initial` (the adapter's register call),
 * `recover` (the unhealthy→healthy edge), `missing` (PING_REGISTERED said
 * the server does not hold it), `not_registered` (a transfer was answered so).
 */
export type RegistrationReason = "initial" | "recover" | "missing" | "not_registered"

/**
 * A session's event log, for tests and replay: heartbeat events plus
 * registration outcomes. `atMs` is Effect Clock time, ms.
 */
export type SessionEvent =
  | HeartbeatEvent
  | { readonly _tag: "Registered"; readonly atMs: number; readonly reason: RegistrationReason }
  | { readonly _tag: "RegisterFailed"; readonly atMs: number; readonly reason: RegistrationReason; readonly message: string }
  | { readonly _tag: "Unregistered"; readonly atMs: number; readonly ok: boolean }

/** What both adapters' shapes expose of their session. */
export interface SessionView {
  /** This worker's 63-bit id (DESIGN §6), sent with every REGISTER, PING and transfer. */
  readonly instanceId: InstanceId
  /** The server's chunk size in tokens (asked at construction). */
  readonly chunkSizeTokens: number
  /** False in degraded mode (the last ping failed and no successful ping and re-registration has followed). */
  readonly isHealthy: Effect.Effect<boolean>
  /** True while the heartbeat fiber runs (after registration or the first transfer, until shutdown). */
  readonly heartbeatRunning: Effect.Effect<boolean>
  /** The event log, oldest first (at most `MAX_EVENTS` of Heartbeat.ts). */
  readonly events: Effect.Effect<ReadonlyArray<SessionEvent>>
  /** REGISTERs that succeeded after the initial one (every reason but `initial`). */
  readonly reregistrations: Effect.Effect<number>
}

/** What {@link openSession} found out: the session before it announces itself. Times in ms. */
export interface SessionOpening {
  readonly client: MqClientShape
  readonly settings: SessionSettings
  readonly instanceId: InstanceId
  /** The server's chunk size in tokens. */
  readonly chunkSizeTokens: number
  /** Per-request timeout for REGISTER and transfers. */
  readonly requestTimeoutMs: number
  readonly heartbeatIntervalMs: number
  readonly heartbeatTimeoutMs: number
  /** Names the server and this worker in log lines: `mpcache server <endpoint> (instance_id=<id>)`. */
  readonly label: string
}

/**
 * The first step of a session: resolves the heartbeat times (InvalidArgument
 * on one that is not a positive number of ms), draws the instance id unless
 * the settings fix one, and asks the server's chunk size (fails with the
 * client's error, e.g. RequestTimeout, when the server does not answer).
 */
export const openSession = (
  client: MqClientShape,
  settings: SessionSettings
): Effect.Effect<SessionOpening, RequestError> =>
  Effect.gen(function*() {
    const [heartbeatIntervalMs, heartbeatTimeoutMs] = yield* heartbeatTimes(settings)
    const requestTimeoutMs = settings.requestTimeoutMs ?? DEFAULT_REQUEST_TIMEOUT_MS
    const instanceId = settings.instanceId ?? (yield* newInstanceId)
    const chunkSizeTokens = yield* client.request(GetChunkSize, [], { timeoutMs: requestTimeoutMs })
    const label = `mpcache server ${client.endpoint} (instance_id=${formatInstanceId(instanceId)})`
    return { client, settings, instanceId, chunkSizeTokens, requestTimeoutMs, heartbeatIntervalMs, heartbeatTimeoutMs, label }
  })

/** The UNREGISTER ops: payload `[instance_id]`, no response. */
export type UnregisterOp = typeof UnregisterKvCache | typeof UnregisterKvCacheEngineDrivenContext

/**
 * What differs between the adapters' sessions. `Reg` is what the adapter
 * registers (kept for re-registration), `O` its REGISTER op, `E` what
 * `onRegistered` can fail with.
 */
export interface SessionSpec<Reg extends object, O extends Op, E> {
  /** The adapter's flavour in its log lines (`engine-driven`); none for the LMCache-driven adapter. */
  readonly qualifier?: string
  /** The registration PING_REGISTERED asks the server about. */
  readonly kind: RegistrationKind
  /** REGISTER: the op and its payload for `Reg` (sent with the session's request timeout). */
  readonly registerOp: O
  readonly registerPayload: (reg: Reg) => PayloadOf<O>
  /**
   * Runs before every REGISTER (initial and re-registrations), inside the
   * register lock, and gives the registration actually sent (the kept one is
   * unchanged): cpu_memfd hands its descriptors over for a fresh one-time
   * token each time (MemfdHandOver.ts). Default: the registration as is.
   */
  readonly prepare?: (reg: Reg) => Effect.Effect<Reg, RequestError>
  /**
   * Runs on every acknowledged REGISTER (initial or not), inside the
   * register lock; its failure fails that registration. Default: nothing.
   */
  readonly onRegistered?: (answer: ResponseOf<O>) => Effect.Effect<void, E>
  /** UNREGISTER at shutdown, `[instance_id]`, bounded by {@link UNREGISTER_TIMEOUT_MS}. */
  readonly unregisterOp: UnregisterOp
  /** Appended to the WARNING logged when the server answers PING_REGISTERED with `unknown_op`. */
  readonly legacyPingNote?: string
}

/** A session, built by {@link makeSession}; the adapter's transfers go through it. */
export interface Session<Reg, Answer, E> extends SessionOpening {
  /** The members both adapters' shapes expose. */
  readonly view: SessionView
  /**
   * The initial REGISTER (reason `initial`), under the register lock; on
   * success the request is kept for re-registration and the heartbeat
   * starts. Fails as the server answers or as `onRegistered` fails; a
   * failure starts no heartbeat.
   */
  readonly register: (reg: Reg) => Effect.Effect<Answer, RequestError | E>
  /**
   * Sends a transfer request with the session's request timeout. A
   * `not_registered` answer means the server lost this worker: it
   * re-registers (DESIGN §6), then fails as before.
   */
  readonly transfer: <T extends Op>(op: T, payload: PayloadOf<T>) => Effect.Effect<ResponseOf<T>, RequestError>
  /** Defensive heartbeat start (upstream's lazy start, kept as a fallback), then whether the session is healthy. */
  readonly beforeTransfer: Effect.Effect<boolean>
  /** The cache key of a request range under this session's model, world size, rank and salt. */
  readonly keyOf: (r: RequestRange) => CacheKey
}

/**
 * The second step of a session, in the current Scope: logs the instance id
 * at INFO, warns on a heartbeat too slow for the server's reap timeout, and
 * builds the heartbeat (not started). Closing the Scope sets the closing
 * flag, stops the heartbeat, then sends `unregisterOp` when registered
 * (bounded by {@link UNREGISTER_TIMEOUT_MS}; a failure logs a WARNING).
 * A finalizer the adapter added before this call runs after that.
 */
export const makeSession = <Reg extends object, O extends Op, E = never>(
  opening: SessionOpening,
  spec: SessionSpec<Reg, O, E>
): Effect.Effect<Session<Reg, ResponseOf<O>, E>, never, Scope.Scope> =>
  Effect.gen(function*() {
    const { chunkSizeTokens, client, instanceId, label, requestTimeoutMs, settings } = opening
    const { heartbeatIntervalMs, heartbeatTimeoutMs } = opening
    const flavour = spec.qualifier === undefined ? "" : `${spec.qualifier} `
    const idText = formatInstanceId(instanceId)
    const who = `${flavour}instance_id=${idText}`
    yield* Effect.logInfo(`mpcache ${flavour}worker adapter created with instance_id=${idText}`)
    yield* warnIfHeartbeatTooSlow(heartbeatIntervalMs)

    let registration: Reg | undefined
    /** Set when shutdown begins: nothing registers again after it. */
    let closing = false
    /** The server answered PING_REGISTERED with unknown_op: use PING [id] until the next recovery. */
    let legacyPing = false
    const registerLock = yield* Semaphore.make(1)
    const eventLog = yield* Ref.make<ReadonlyArray<SessionEvent>>([])
    const reregistrations = yield* Ref.make(0)
    const record = (event: SessionEvent) => Ref.update(eventLog, (log) => appendEvent(log, event))
    const now = Clock.currentTimeMillis
    const onRegistered = spec.onRegistered ?? (() => Effect.void)

    const prepare = spec.prepare ?? Effect.succeed
    const sendRegister = (reg: Reg): Effect.Effect<ResponseOf<O>, RequestError | E> =>
      prepare(reg).pipe(
        Effect.flatMap((sent) => client.request(spec.registerOp, spec.registerPayload(sent), { timeoutMs: requestTimeoutMs })),
        Effect.flatMap((answer) => Effect.as(onRegistered(answer), answer))
      )

    /**
     * Re-sends REGISTER with the kept request and the same id (upstream
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
          yield* Effect.logWarning(`re-registered ${who} with ${client.endpoint} (${reason})`)
          return true
        }
        const message = causeText(result.cause)
        yield* record({ _tag: "RegisterFailed", atMs: yield* now, reason, message })
        yield* Effect.logWarning(`re-registration of ${who} with ${client.endpoint} (${reason}) failed: ${message}`)
        return false
      }))

    const recover = (trigger: RecoverTrigger) =>
      Effect.suspend(() => {
        if (trigger === "edge") legacyPing = false
        return reregister(trigger === "edge" ? "recover" : "missing")
      })

    const legacyPingNote = spec.legacyPingNote === undefined ? "" : ` ${spec.legacyPingNote}`
    const ping: Effect.Effect<PingResult> = Effect.gen(function*() {
      if (registration !== undefined && !legacyPing) {
        const answer = yield* Effect.result(
          client.request(PingRegistered, [instanceId, [spec.kind]], { timeoutMs: heartbeatTimeoutMs })
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
          `${label} answered ping_registered with unknown_op: it predates it; falling back to plain ping${legacyPingNote}`
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

    const register = (reg: Reg) =>
      Effect.gen(function*() {
        const answer = yield* registerLock.withPermits(1)(sendRegister(reg))
        registration = reg
        yield* record({ _tag: "Registered", atMs: yield* now, reason: "initial" })
        yield* heartbeat.start
        return answer
      })

    const transfer = <T extends Op>(op: T, payload: PayloadOf<T>): Effect.Effect<ResponseOf<T>, RequestError> =>
      client.request(op, payload, { timeoutMs: requestTimeoutMs }).pipe(
        Effect.tapError((e) => (e._tag === "NotRegistered" ? Effect.asVoid(reregister("not_registered")) : Effect.void))
      )

    const keyOf = (r: RequestRange): CacheKey => ({
      model_name: settings.modelName,
      world_size: settings.worldSize,
      worker_id: settings.kvRank,
      token_ids: r.tokenIds,
      start: r.start,
      end: r.end,
      request_id: r.requestId,
      cache_salt: settings.cacheSalt ?? ""
    })

    yield* Effect.addFinalizer(() =>
      Effect.gen(function*() {
        closing = true
        yield* heartbeat.stop
        if (registration === undefined) return
        const result = yield* Effect.exit(
          registerLock.withPermits(1)(client.request(spec.unregisterOp, [instanceId], { timeoutMs: UNREGISTER_TIMEOUT_MS }))
        )
        yield* record({ _tag: "Unregistered", atMs: yield* now, ok: Exit.isSuccess(result) })
        if (Exit.isFailure(result)) {
          yield* Effect.logWarning(`unregister of ${who} failed: ${causeText(result.cause)}`)
        }
      })
    )

    const view: SessionView = {
      instanceId,
      chunkSizeTokens,
      isHealthy: heartbeat.isHealthy,
      heartbeatRunning: heartbeat.isRunning,
      events: Ref.get(eventLog),
      reregistrations: Ref.get(reregistrations)
    }
    return {
      ...opening,
      view,
      register,
      transfer,
      beforeTransfer: Effect.andThen(heartbeat.start, heartbeat.isHealthy),
      keyOf
    }
  })

/**
 * Builds an adapter on its own MQ client in the current Scope: connects to
 * `options.endpoint` with the session's request timeout, then `make`. The
 * client's finalizer was added first, so on close the adapter's (heartbeat
 * stop, UNREGISTER, …) runs before the socket closes with its bounded linger.
 */
export const withOwnClient = <A, E, R>(
  options: SessionSettings & { readonly endpoint: string; readonly curve?: DealerCurve | undefined },
  make: (client: MqClientShape) => Effect.Effect<A, E, R>
): Effect.Effect<A, E | RequestError, R | Scope.Scope | ZmqSockets> =>
  Effect.flatMap(
    makeMqClient({
      endpoint: options.endpoint,
      requestTimeoutMs: options.requestTimeoutMs ?? DEFAULT_REQUEST_TIMEOUT_MS,
      ...(options.curve === undefined ? {} : { curve: options.curve })
    }),
    make
  )
