/**
 * The scheduler adapter (client side; upstream `LMCacheMPSchedulerAdapter`,
 * reference §3.6 and §6.3): what the engine's scheduler uses to ask how much
 * of a request's prefix the server holds, and to release what it will not
 * read.
 *
 * `lookup` sends LOOKUP (worker_id nil: every rank must hold a chunk for it
 * to count) and polls QUERY_PREFETCH_STATUS until the prefetch answers; the
 * hit prefix stays read-locked on the server until the workers retrieve it,
 * `freeLookupLocks` releases a range, or `endSession`.
 *
 * Liveness (DESIGN §6; reference §6.3, upstream #5233): the adapter talks to
 * one server and has one heartbeat for it, pinging with PING [nil] (never
 * tracked, never reapable), started with the first lookup and really
 * running (upstream's never started: #4764, #4963). While the server is
 * unhealthy, lookups answer 0 hit tokens at once without sending anything,
 * and FREE_LOOKUP_LOCKS and END_SESSION are skipped (the server's lock TTL
 * releases what they would have). A LOOKUP or QUERY_PREFETCH_STATUS that
 * times out makes the server unhealthy until a ping succeeds, and that
 * lookup answers 0. A server that answers PING [nil] with `bad_request`
 * predates the current PING payload: the adapter stays unhealthy and its
 * WARNING names the server's answer.
 */
import { Context, Duration, Effect, Layer, Ref, Schedule, type Scope } from "effect"
import type { CacheKey } from "../../schema/CacheKey.ts"
import { EndSession, FreeLookupLocks, GetChunkSize, Lookup, Ping, QueryPrefetchStatus } from "../../schema/Op.ts"
import { appendEvent, type HeartbeatEvent, heartbeatTimes, makeHeartbeat, pingFailureReason, PingResult } from "./Heartbeat.ts"
import { makeMqClient, type MqClientShape, RequestTimeout, type RequestError } from "./MqClient.ts"
import type { DealerCurve, ZmqSockets } from "../zmq/Sockets.ts"

/** Adapter settings that do not depend on how the client is made. Times in ms. */
export interface SchedulerAdapterSettings {
  /** Model name in every key. */
  readonly modelName: string
  /** KV world size (also sent as tp_size): every rank must hold a chunk for it to count as a hit. */
  readonly worldSize: number
  /** Salt for per-tenant isolation of every key. Default "". */
  readonly cacheSalt?: string
  /** Per-request timeout in ms; also bounds a lookup's whole prefetch poll. Default 30,000. */
  readonly requestTimeoutMs?: number
  /**
   * Longest delay between QUERY_PREFETCH_STATUS polls while a prefetch is pending, ms: the polls
   * start 1 ms apart and the delay doubles up to this. Default 8. An L2 prefetch takes tens to
   * hundreds of ms; polling every 1 ms through all of it made each waiting lookup ~1,000 requests/s
   * on the server that is receiving the prefetch.
   */
  readonly pollIntervalMs?: number
  /** Time between heartbeat pings, ms (DESIGN §6). Default 10,000. Must be > 0. */
  readonly heartbeatIntervalMs?: number
  /** How long one heartbeat ping may take before it counts as failed, ms. Default = the interval. */
  readonly heartbeatTimeoutMs?: number
}

/** Settings plus the server endpoint, for {@link makeSchedulerAdapter}. */
export interface SchedulerAdapterOptions extends SchedulerAdapterSettings {
  /** Server endpoint, e.g. `tcp://127.0.0.1:5555`. */
  readonly endpoint: string
  /** CURVE keys (MqClientOptions.curve); absent: no CURVE. */
  readonly curve?: DealerCurve
}

/** The adapter's interface; `SchedulerAdapter` is the service, `makeSchedulerAdapter(With)` builds one. */
export interface SchedulerAdapterShape {
  /** The server's chunk size in tokens. */
  readonly chunkSizeTokens: number
  /**
   * Hit tokens for the request's prefix (a multiple of the chunk size); the
   * hit chunks stay locked. Starts the heartbeat (idempotent). Answers 0 at
   * once, sending nothing, while the server is unhealthy; answers 0 and
   * marks the server unhealthy when LOOKUP or the status poll times out.
   * Fails with the server's other errors.
   */
  readonly lookup: (requestId: string, tokenIds: ReadonlyArray<number>) => Effect.Effect<number, RequestError>
  /** Releases the locks the lookup took on chunks within [start, end) tokens. Skipped while unhealthy. */
  readonly freeLookupLocks: (requestId: string, tokenIds: ReadonlyArray<number>, start: number, end: number) => Effect.Effect<void, RequestError>
  /** Ends the request's session: every lock it still holds is released. Skipped while unhealthy. */
  readonly endSession: (requestId: string) => Effect.Effect<void, RequestError>
  /** False while the server is unhealthy. Starts true. */
  readonly isHealthy: Effect.Effect<boolean>
  /** True while the heartbeat fiber runs (from the first lookup until shutdown). */
  readonly heartbeatRunning: Effect.Effect<boolean>
  /** Heartbeat events, oldest first (at most `MAX_EVENTS`). */
  readonly events: Effect.Effect<ReadonlyArray<HeartbeatEvent>>
}

/** The scheduler adapter as a service (one per server the scheduler talks to). */
export class SchedulerAdapter extends Context.Service<SchedulerAdapter, SchedulerAdapterShape>()("mpcache/services/SchedulerAdapter") {
  /** An adapter with its own client for the life of the layer. */
  static readonly layer = (options: SchedulerAdapterOptions) => Layer.effect(this, makeSchedulerAdapter(options))
  /**
   * For tests: the real adapter over `client` instead of its own socket
   * (the scripted fake of test/support/FakeMqClient.ts records and answers
   * every request).
   */
  static readonly layerTest = (client: MqClientShape, settings: SchedulerAdapterSettings) =>
    Layer.effect(this, makeSchedulerAdapterWith(client, settings))
}

/** The default longest delay between QUERY_PREFETCH_STATUS polls, ms. */
const DEFAULT_POLL_MAX_MS = 8

/** QUERY_PREFETCH_STATUS polls: 1 ms, then each delay doubled, none longer than `maxMs`. */
const pollSchedule = (maxMs: number) =>
  Schedule.exponential(Duration.millis(1), 2).pipe(
    Schedule.modifyDelay(({ duration }) => Effect.succeed(Duration.min(duration, Duration.millis(maxMs))))
  )

/**
 * Builds an adapter on `client` in the current Scope (asks the chunk size;
 * fails with InvalidArgument on a heartbeat interval or timeout that is not
 * a positive number). Closing the Scope stops the heartbeat; closing
 * `client` is its owner's business.
 */
export const makeSchedulerAdapterWith = (
  client: MqClientShape,
  options: SchedulerAdapterSettings
): Effect.Effect<SchedulerAdapterShape, RequestError, Scope.Scope> =>
  Effect.gen(function*() {
    const [heartbeatIntervalMs, heartbeatTimeoutMs] = yield* heartbeatTimes(options)
    const timeoutMs = options.requestTimeoutMs ?? 30_000
    const chunkSizeTokens = yield* client.request(GetChunkSize, [], { timeoutMs })
    const eventLog = yield* Ref.make<ReadonlyArray<HeartbeatEvent>>([])

    const heartbeat = yield* makeHeartbeat({
      label: `mpcache server ${client.endpoint} (scheduler)`,
      intervalMs: heartbeatIntervalMs,
      timeoutMs: heartbeatTimeoutMs,
      ping: Effect.map(
        Effect.result(client.request(Ping, [null], { timeoutMs: heartbeatTimeoutMs })),
        (answer) => answer._tag === "Success" ? PingResult.alive : PingResult.failed(pingFailureReason("ping", answer.failure))
      ),
      onEvent: (event) => Ref.update(eventLog, (log) => appendEvent(log, event))
    })

    const keyOf = (requestId: string, tokenIds: ReadonlyArray<number>, start: number, end: number): CacheKey => ({
      model_name: options.modelName,
      world_size: options.worldSize,
      worker_id: null,
      token_ids: tokenIds,
      start,
      end,
      request_id: requestId,
      cache_salt: options.cacheSalt ?? ""
    })

    const sendLookup = (requestId: string, tokenIds: ReadonlyArray<number>) =>
      Effect.gen(function*() {
        const end = Math.floor(tokenIds.length / chunkSizeTokens) * chunkSizeTokens
        yield* client.request(Lookup, [keyOf(requestId, tokenIds, 0, end), options.worldSize], { timeoutMs })
        const chunks = yield* client.request(QueryPrefetchStatus, [requestId], { timeoutMs }).pipe(
          Effect.repeat({
            schedule: pollSchedule(options.pollIntervalMs ?? DEFAULT_POLL_MAX_MS),
            while: (n) => n === null
          }),
          Effect.timeoutOrElse({
            duration: Duration.millis(timeoutMs),
            orElse: () => Effect.fail(new RequestTimeout({ op: "query_prefetch_status", endpoint: client.endpoint, timeoutMs }))
          })
        )
        return (chunks ?? 0) * chunkSizeTokens
      })

    const lookup = (requestId: string, tokenIds: ReadonlyArray<number>) =>
      Effect.gen(function*() {
        yield* heartbeat.start
        if (!(yield* heartbeat.isHealthy)) {
          yield* Effect.logDebug(`degraded mode: lookup for ${requestId} answers 0 without asking ${client.endpoint}`)
          return 0
        }
        return yield* sendLookup(requestId, tokenIds).pipe(
          Effect.catchTag("RequestTimeout", (e) =>
            Effect.as(heartbeat.markUnhealthy(`${e.op} for ${requestId} timed out (${e.timeoutMs} ms)`), 0))
        )
      })

    /** Runs `send` only while healthy (upstream skips these ops in degraded mode). */
    const unlessDegraded = (what: string, send: Effect.Effect<void, RequestError>) =>
      Effect.gen(function*() {
        if (yield* heartbeat.isHealthy) return yield* send
        yield* Effect.logDebug(`degraded mode: ${what} to ${client.endpoint} skipped`)
      })

    return {
      chunkSizeTokens,
      lookup,
      freeLookupLocks: (requestId, tokenIds, start, end) =>
        unlessDegraded(
          `free_lookup_locks for ${requestId}`,
          client.request(FreeLookupLocks, [keyOf(requestId, tokenIds, start, end), options.worldSize], { timeoutMs })
        ),
      endSession: (requestId) =>
        unlessDegraded(`end_session for ${requestId}`, client.request(EndSession, [requestId], { timeoutMs })),
      isHealthy: heartbeat.isHealthy,
      heartbeatRunning: heartbeat.isRunning,
      events: Ref.get(eventLog)
    } satisfies SchedulerAdapterShape
  })

/** Builds an adapter with its own MQ client in the current Scope (connects, then {@link makeSchedulerAdapterWith}). */
export const makeSchedulerAdapter = (options: SchedulerAdapterOptions): Effect.Effect<SchedulerAdapterShape, RequestError, Scope.Scope | ZmqSockets> =>
  Effect.gen(function*() {
    const client = yield* makeMqClient({
      endpoint: options.endpoint,
      requestTimeoutMs: options.requestTimeoutMs ?? 30_000,
      ...(options.curve === undefined ? {} : { curve: options.curve })
    })
    return yield* makeSchedulerAdapterWith(client, options)
  })
