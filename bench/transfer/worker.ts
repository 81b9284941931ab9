/**
 * bench:transfer's worker, in the bench process: a filled PagedKvCache of
 * one kind registered through the WorkerAdapter, a scheduler adapter and an
 * admin client (CLEAR), all in one scope that `stop` closes (UNREGISTER,
 * sockets closed, segments unmapped and unlinked); and the byte check of one
 * RETRIEVE.
 */
import { Effect, Exit, Layer, ManagedRuntime, References, Scope } from "effect"
import { ClientLive } from "../../src/layers/Client.ts"
import { loggerLayer } from "../../src/layers/Logging.ts"
import type { NativeMemory } from "../../src/native/Native.ts"
import { Clear } from "../../src/schema/Op.ts"
import { makeMqClient } from "../../src/services/client/MqClient.ts"
import type { PagedKvCache } from "../../src/services/client/PagedKvCache.ts"
import { makeSchedulerAdapter, type SchedulerAdapterShape } from "../../src/services/client/SchedulerAdapter.ts"
import { makeWorkerAdapter, type TransferRequest, type WorkerAdapterShape } from "../../src/services/client/WorkerAdapter.ts"
import type { ZmqSockets } from "../../src/services/zmq/Sockets.ts"
import { BLOCK_BYTES, makeFilledCache, NUM_LAYERS } from "../lib/kvChunks.ts"
import {
  BLOCKS_PER_REQUEST,
  type CacheKind,
  destBlocks,
  MODEL,
  NUM_BLOCKS,
  REQUEST_TIMEOUT_MS,
  REQUEST_TOKENS,
  SET_BASE,
  sourceBlocks,
  STREAMS,
  tokensFor
} from "./shape.ts"

export interface Worker {
  readonly cache: PagedKvCache
  readonly adapter: WorkerAdapterShape
  readonly scheduler: SchedulerAdapterShape
  readonly clear: () => Promise<void>
}

/** The runtime the worker's effects run on, and at most one worker's scope at a time. */
export interface WorkerHost {
  /** Runs `effect` in the worker's scope: its sockets and segments live until `stop`. */
  readonly run: <A, E>(effect: Effect.Effect<A, E, NativeMemory | ZmqSockets | Scope.Scope>) => Promise<A>
  /** A worker of `kind` on `endpoint`, cache segments named after `tag`. */
  readonly start: (kind: CacheKind) => Promise<Worker>
  /** UNREGISTER, sockets closed, segments unmapped and unlinked (nothing when no worker runs). */
  readonly stop: () => Promise<void>
  readonly dispose: () => Promise<void>
}

export const makeWorkerHost = (endpoint: string, tag: string): WorkerHost => {
  const runtime = ManagedRuntime.make(
    Layer.mergeAll(ClientLive, loggerLayer("pretty"), Layer.succeed(References.MinimumLogLevel, "Warn"))
  )
  let workerScope: Scope.Closeable | undefined

  const run = <A, E>(effect: Effect.Effect<A, E, NativeMemory | ZmqSockets | Scope.Scope>): Promise<A> =>
    workerScope === undefined
      ? Promise.reject(new Error("the worker is not started"))
      : runtime.runPromise(Scope.provide(workerScope)(effect))

  const start = async (kind: CacheKind): Promise<Worker> => {
    workerScope = await runtime.runPromise(Scope.make())
    const cache = await run(makeFilledCache(tag, NUM_BLOCKS, kind.makeCache))
    const adapter = await run(makeWorkerAdapter({ endpoint, modelName: MODEL, worldSize: 1, kvRank: 0, requestTimeoutMs: REQUEST_TIMEOUT_MS }))
    await run(kind.register(adapter, cache))
    const scheduler = await run(makeSchedulerAdapter({ endpoint, modelName: MODEL, worldSize: 1, requestTimeoutMs: REQUEST_TIMEOUT_MS }))
    const admin = await run(makeMqClient({ endpoint, requestTimeoutMs: REQUEST_TIMEOUT_MS }))
    return { cache, adapter, scheduler, clear: () => run(admin.request(Clear, [false])) }
  }

  const stop = async (): Promise<void> => {
    const scope = workerScope
    workerScope = undefined
    if (scope !== undefined) await runtime.runPromise(Scope.close(scope, Exit.void))
  }

  return { run, start, stop, dispose: () => runtime.dispose() }
}

/** One RETRIEVE of set request `r` into stream `stream`'s blocks, checked against the source blocks. */
export const verify = async (host: WorkerHost, w: Worker, r: number, stream: number): Promise<void> => {
  const run = host.run
  const src = sourceBlocks(r % STREAMS)
  const dst = destBlocks(stream)
  const zero = Buffer.alloc(BLOCK_BYTES)
  const layers = [0, NUM_LAYERS >> 1, NUM_LAYERS - 1]
  // Scribble over the destinations first, so that only this RETRIEVE can make them match.
  for (const l of layers) for (const kv of [0, 1] as const) for (const b of dst) await run(w.cache.writeBlock(l, kv, b, zero))
  const request: TransferRequest = { requestId: `verify-${r}`, tokenIds: tokensFor(SET_BASE + r), start: 0, end: REQUEST_TOKENS, blockIds: dst }
  if (!(await run(w.adapter.retrieve(request)))) throw new Error("the verification RETRIEVE answered ok = false")
  for (const l of layers) {
    for (const kv of [0, 1] as const) {
      for (let j = 0; j < BLOCKS_PER_REQUEST; j++) {
        const expected = await run(w.cache.readBlock(l, kv, src[j]!))
        const actual = await run(w.cache.readBlock(l, kv, dst[j]!))
        if (!expected.equals(actual)) {
          throw new Error(`RETRIEVE wrote wrong bytes: layer ${l}, kv ${kv}, block ${dst[j]} (stored from block ${src[j]})`)
        }
      }
    }
  }
}
