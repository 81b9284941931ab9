/**
 * The worker adapter (client side; upstream `LMCacheMPWorkerAdapter`, DESIGN
 * §6): what an engine worker process (one GPU rank) uses to talk to the
 * server. It registers the worker's KV cache, stores and retrieves chunks by
 * block ids, and reports finished requests to the engine (`getFinished`).
 *
 * The instance id is 63 random bits from a v4 UUID, logged at INFO at
 * construction. Closing the adapter's Scope unregisters, then closes the
 * socket with a bounded linger.
 */
import { Context, Effect, Exit, type Fiber, Layer } from "effect"
import type { CacheKey } from "../schema/CacheKey.ts"
import { formatInstanceId, type InstanceId } from "../schema/InstanceId.ts"
import { GetChunkSize, RegisterKvCache, Retrieve, Store, UnregisterKvCache } from "../schema/Op.ts"
import type { LayoutHints } from "../schema/Registration.ts"
import type { TensorDescriptor } from "../schema/TensorDescriptor.ts"
import { InvalidArgument } from "../schema/WireError.ts"
import { newInstanceId } from "./InstanceIdGen.ts"
import { makeMqClient, type RequestError } from "./MqClient.ts"

export interface WorkerAdapterOptions {
  /** Server endpoint, e.g. `tcp://127.0.0.1:5555`. */
  readonly endpoint: string
  readonly modelName: string
  /** KV world size: how many shards a chunk is split into. */
  readonly worldSize: number
  /** The shard (kv rank) this worker owns. */
  readonly kvRank: number
  /** Engine name sent at registration. Default "vllm". */
  readonly engineType?: string
  /** Per-request timeout in ms (upstream `lmcache.mp.mq_timeout`). Default 30,000. */
  readonly requestTimeoutMs?: number
  /** Fixed instance id (tests); default a fresh random one. */
  readonly instanceId?: InstanceId
  /** Salt for per-tenant isolation of every key. Default "". */
  readonly cacheSalt?: string
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
  /** Stores that completed for requests the engine has reported finished. */
  readonly finishedStores: ReadonlyArray<string>
  /** Retrieves that completed (successfully or not). */
  readonly finishedRetrieves: ReadonlyArray<string>
  /** Retrieves that failed: the engine recomputes their blocks. */
  readonly failedRetrieves: ReadonlyArray<string>
}

export interface WorkerAdapterShape {
  readonly instanceId: InstanceId
  /** The server's chunk size in tokens (asked at construction). */
  readonly chunkSizeTokens: number
  /**
   * REGISTER_KV_CACHE for this instance. Fails with InvalidArgument when the
   * block size does not divide the chunk size (checked before sending), or
   * as the server answers.
   */
  readonly registerKvCaches: (kvCaches: ReadonlyArray<TensorDescriptor>, layoutHints?: LayoutHints) => Effect.Effect<void, RequestError>
  /** STORE and wait: true when the server stored every chunk it could. */
  readonly store: (request: TransferRequest) => Effect.Effect<boolean, RequestError>
  /** RETRIEVE and wait, leaving the first `skipFirstNTokens` of the range untouched. */
  readonly retrieve: (request: TransferRequest, skipFirstNTokens?: number) => Effect.Effect<boolean, RequestError>
  /** Starts a store in the background; its completion shows in `getFinished`. */
  readonly submitStore: (request: TransferRequest) => Effect.Effect<void>
  /** Starts a retrieve in the background; its completion shows in `getFinished` exactly once. */
  readonly submitRetrieve: (request: TransferRequest, skipFirstNTokens?: number) => Effect.Effect<void>
  /** The engine's per-step poll: `finishedRequestIds` are the requests it finished this step. */
  readonly getFinished: (finishedRequestIds: ReadonlyArray<string>) => Effect.Effect<FinishedTransfers>
}

export class WorkerAdapter extends Context.Service<WorkerAdapter, WorkerAdapterShape>()("mpcache/services/WorkerAdapter") {
  static readonly layer = (options: WorkerAdapterOptions) => Layer.effect(this, makeWorkerAdapter(options))
}

interface Pending {
  readonly kind: "store" | "retrieve"
  readonly fiber: Fiber.Fiber<boolean, RequestError>
}

/**
 * Builds an adapter in the current Scope: connects, asks the chunk size
 * (fails with RequestTimeout when the server does not answer). Closing the
 * Scope sends UNREGISTER (a timeout only logs) and closes the socket.
 */
export const makeWorkerAdapter = (options: WorkerAdapterOptions) =>
  Effect.gen(function*() {
    const instanceId = options.instanceId ?? (yield* newInstanceId)
    const client = yield* makeMqClient({ endpoint: options.endpoint, requestTimeoutMs: options.requestTimeoutMs ?? 30_000 })
    const chunkSizeTokens = yield* client.request(GetChunkSize, [])
    yield* Effect.logInfo(`mpcache worker adapter created with instance_id=${formatInstanceId(instanceId)}`)
    let registered = false
    const pending = new Map<string, Array<Pending>>()
    const finishedRequests = new Set<string>()
    const scope = yield* Effect.scope

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
        yield* client.request(RegisterKvCache, [
          instanceId,
          kvCaches,
          options.modelName,
          options.worldSize,
          options.engineType ?? "vllm",
          layoutHints,
          []
        ])
        registered = true
      })

    const store = (r: TransferRequest) =>
      client.request(Store, [keyOf(r), instanceId, [r.blockIds], new Uint8Array(0)]).pipe(Effect.map(([, ok]) => ok))
    const retrieve = (r: TransferRequest, skip = 0) =>
      client.request(Retrieve, [keyOf(r), instanceId, [r.blockIds], new Uint8Array(0), skip]).pipe(Effect.map(([, ok]) => ok))

    const track = (requestId: string, kind: Pending["kind"], run: Effect.Effect<boolean, RequestError>) =>
      Effect.gen(function*() {
        const fiber = yield* Effect.forkIn(run, scope)
        const list = pending.get(requestId) ?? []
        list.push({ kind, fiber })
        pending.set(requestId, list)
      })

    const getFinished = (finishedRequestIds: ReadonlyArray<string>) =>
      Effect.sync(() => {
        for (const id of finishedRequestIds) finishedRequests.add(id)
        const finishedStores: Array<string> = []
        const finishedRetrieves: Array<string> = []
        const failedRetrieves: Array<string> = []
        for (const [requestId, list] of pending) {
          const remaining = list.filter((p) => {
            const exit = p.fiber.pollUnsafe()
            if (exit === undefined) return true
            if (p.kind === "retrieve") {
              finishedRetrieves.push(requestId)
              if (Exit.isFailure(exit) || !exit.value) failedRetrieves.push(requestId)
              return false
            }
            if (!finishedRequests.has(requestId)) return true
            finishedStores.push(requestId)
            return false
          })
          if (remaining.length === 0) {
            pending.delete(requestId)
            if (!list.some((p) => p.kind === "store")) continue
            finishedRequests.delete(requestId)
          } else pending.set(requestId, remaining)
        }
        return { finishedStores: [...new Set(finishedStores)], finishedRetrieves: [...new Set(finishedRetrieves)], failedRetrieves }
      })

    yield* Effect.addFinalizer(() =>
      registered
        ? client.request(UnregisterKvCache, [instanceId], { timeoutMs: 5_000 }).pipe(
          Effect.catch((e) => Effect.logWarning(`unregister of instance ${formatInstanceId(instanceId)} failed: ${e.message}`))
        )
        : Effect.void
    )

    return {
      instanceId,
      chunkSizeTokens,
      registerKvCaches,
      store,
      retrieve,
      submitStore: (r) => track(r.requestId, "store", store(r)),
      submitRetrieve: (r, skip) => track(r.requestId, "retrieve", retrieve(r, skip)),
      getFinished
    } satisfies WorkerAdapterShape
  })

