/**
 * The scheduler adapter (client side; upstream `LMCacheMPSchedulerAdapter`,
 * reference §3.6): what the engine's scheduler uses to ask how much of a
 * request's prefix the server holds, and to release what it will not read.
 *
 * `lookup` sends LOOKUP (worker_id nil: every rank must hold a chunk for it
 * to count) and polls QUERY_PREFETCH_STATUS until the prefetch answers; the
 * hit prefix stays read-locked on the server until the workers retrieve it,
 * `freeLookupLocks` releases a range, or `endSession`.
 */
import { Context, Duration, Effect, Layer, Schedule } from "effect"
import type { CacheKey } from "../schema/CacheKey.ts"
import { EndSession, FreeLookupLocks, GetChunkSize, Lookup, QueryPrefetchStatus } from "../schema/Op.ts"
import { makeMqClient, RequestTimeout, type RequestError } from "./MqClient.ts"

export interface SchedulerAdapterOptions {
  readonly endpoint: string
  readonly modelName: string
  readonly worldSize: number
  readonly cacheSalt?: string
  /** Per-request timeout in ms. Default 30,000. */
  readonly requestTimeoutMs?: number
  /** Delay between QUERY_PREFETCH_STATUS polls while a prefetch is pending. Default 1 ms. */
  readonly pollIntervalMs?: number
}

export interface SchedulerAdapterShape {
  /** The server's chunk size in tokens. */
  readonly chunkSizeTokens: number
  /** Hit tokens for the request's prefix (a multiple of the chunk size); the hit chunks stay locked. */
  readonly lookup: (requestId: string, tokenIds: ReadonlyArray<number>) => Effect.Effect<number, RequestError>
  /** Releases the locks the lookup took on chunks within [start, end) tokens. */
  readonly freeLookupLocks: (requestId: string, tokenIds: ReadonlyArray<number>, start: number, end: number) => Effect.Effect<void, RequestError>
  /** Ends the request's session: every lock it still holds is released. */
  readonly endSession: (requestId: string) => Effect.Effect<void, RequestError>
}

export class SchedulerAdapter extends Context.Service<SchedulerAdapter, SchedulerAdapterShape>()("mpcache/services/SchedulerAdapter") {
  static readonly layer = (options: SchedulerAdapterOptions) => Layer.effect(this, makeSchedulerAdapter(options))
}

/** Builds an adapter in the current Scope (connects and asks the chunk size). */
export const makeSchedulerAdapter = (options: SchedulerAdapterOptions) =>
  Effect.gen(function*() {
    const timeoutMs = options.requestTimeoutMs ?? 30_000
    const client = yield* makeMqClient({ endpoint: options.endpoint, requestTimeoutMs: timeoutMs })
    const chunkSizeTokens = yield* client.request(GetChunkSize, [])

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

    const lookup = (requestId: string, tokenIds: ReadonlyArray<number>) =>
      Effect.gen(function*() {
        const end = Math.floor(tokenIds.length / chunkSizeTokens) * chunkSizeTokens
        yield* client.request(Lookup, [keyOf(requestId, tokenIds, 0, end), options.worldSize])
        const chunks = yield* client.request(QueryPrefetchStatus, [requestId]).pipe(
          Effect.repeat({
            schedule: Schedule.spaced(Duration.millis(options.pollIntervalMs ?? 1)),
            while: (n) => n === null
          }),
          Effect.timeoutOrElse({
            duration: Duration.millis(timeoutMs),
            orElse: () => Effect.fail(new RequestTimeout({ op: "query_prefetch_status", endpoint: options.endpoint, timeoutMs }))
          })
        )
        return (chunks ?? 0) * chunkSizeTokens
      })

    return {
      chunkSizeTokens,
      lookup,
      freeLookupLocks: (requestId, tokenIds, start, end) =>
        client.request(FreeLookupLocks, [keyOf(requestId, tokenIds, start, end), options.worldSize]),
      endSession: (requestId) => client.request(EndSession, [requestId])
    } satisfies SchedulerAdapterShape
  })
