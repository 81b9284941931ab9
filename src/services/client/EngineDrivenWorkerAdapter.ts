/**
 * The engine-driven worker adapter (client side; DESIGN §4 "Engine-driven",
 * §6; reference §4): what an engine worker that copies its own KV bytes uses
 * to talk to the server. It registers an engine-driven context
 * (REGISTER_KV_CACHE_ENGINE_DRIVEN_CONTEXT), maps the server's L1 pool when
 * the server answers one (`pool_size > 0`: the shm transport), and moves
 * chunks through PREPARE/COMMIT:
 *
 * - `store(request, chunkBytes)`: PREPARE_STORE names the chunks the server
 *   wants (those not already cached); for each, `chunkBytes(i)` supplies the
 *   chunk's L1 object (`[2, num_layers, chunk_size, hidden]`, or
 *   `[num_layers, chunk_size, hidden]` with MLA, `chunkBytes` bytes), which
 *   is copied into its slot of the mapped pool (native scatter, off the JS
 *   thread) and published by COMMIT_STORE with empty `cpu_data` — or, inline,
 *   sent concatenated in COMMIT_STORE's `cpu_data`. A local failure after
 *   PREPARE_STORE (slots that do not fit this layout, a chunk of the wrong
 *   length, a failed copy) first aborts it (COMMIT_STORE with a one-byte
 *   `cpu_data`, Op.ts; issue 18), so the server drops the reservations at
 *   once rather than after its prepare TTL.
 * - `retrieve(request)`: PREPARE_RETRIEVE read-locks the chunks (those
 *   LOOKUP's prefetch locked for the request); they are copied out of their
 *   slots (native gather) — or taken from the inline `data` — and
 *   COMMIT_RETRIEVE releases the locks. A retrieve whose locks were gone by
 *   its commit (`false`: the server released the context meanwhile) is
 *   reported failed, since the bytes may have changed under the copy.
 *
 * Chunk indices are within the request's range: 0 is the chunk at `start`.
 *
 * Liveness is the session core's (Session.ts), shared with the LMCache-driven
 * adapter (WorkerAdapter.ts): a 63-bit random id logged at construction; a heartbeat (Heartbeat.ts)
 * started after a successful registration (and defensively on the first
 * transfer) sending PING_REGISTERED (id, ["engine_driven"]), falling back
 * to PING [id] for a server that predates it; re-registration with the same
 * id at once when the server reports the kind missing, on a `not_registered`
 * transfer, and on the unhealthy→healthy edge; degraded mode while
 * unhealthy (stores are not sent and answer false, retrieves are not sent
 * and answer not ok). A re-registration answered with another pool (the
 * server restarted) maps the new pool and unmaps the old one, waiting for
 * copies in flight on it.
 *
 * Shutdown (the Scope closing): stop the heartbeat, UNREGISTER the context
 * (a failure only logs a WARNING), then unmap the pool.
 */
import { Cause, Effect, Exit, Scope } from "effect"
import { NativeMemory, type NativeError, type ShmMapping } from "../../native/Native.ts"
import type { CacheKey } from "../../schema/CacheKey.ts"
import type { Dtype } from "../../schema/Dtype.ts"
import type { EngineDrivenPool, RegisterEngineDrivenContext, Slot } from "../../schema/EngineDriven.ts"
import {
  CommitRetrieve,
  CommitStore,
  PrepareRetrieve,
  PrepareStore,
  RegisterKvCacheEngineDrivenContext,
  UnregisterKvCacheEngineDrivenContext
} from "../../schema/Op.ts"
import { InvalidArgument } from "../../schema/WireError.ts"
import { type EngineDrivenLayout, validateLayout } from "../kv/EngineDrivenLayout.ts"
import type { MqClientShape, RequestError } from "./MqClient.ts"
import { makeSession, openSession, type RequestRange, type SessionSettings, type SessionView, withOwnClient } from "./Session.ts"
import type { DealerCurve, ZmqSockets } from "../zmq/Sockets.ts"

/** Adapter settings that do not depend on how the client is made (the session's, plus the chunk layout). Times in ms. */
export interface EngineDrivenWorkerAdapterSettings extends SessionSettings {
  /** Tokens per engine block; must divide the server's chunk size. */
  readonly blockSizeTokens: number
  readonly numLayers: number
  /** num_heads × head_size (MLA: the latent width). */
  readonly hiddenDimSize: number
  readonly dtype: Dtype
  /** MLA layout `[num_layers, chunk, hidden]` instead of `[2, num_layers, chunk, hidden]`. Default false. */
  readonly useMla?: boolean
}

/** Settings plus the server endpoint, for {@link makeEngineDrivenWorkerAdapter}. */
export interface EngineDrivenWorkerAdapterOptions extends EngineDrivenWorkerAdapterSettings {
  /** Server endpoint, e.g. `tcp://127.0.0.1:5555`. */
  readonly endpoint: string
  /** CURVE keys (MqClientOptions.curve); absent: no CURVE. */
  readonly curve?: DealerCurve
}

/** A token range of one request. */
export type EngineDrivenRequest = RequestRange

/** What a retrieve got: `chunks[i]` is the L1 object of chunk i of the range (when `ok`). */
export interface EngineDrivenRetrieveResult {
  readonly ok: boolean
  readonly chunks: ReadonlyArray<Uint8Array>
}

/** Everything a transfer can fail with: the request's errors, a local mapping or copy failure. */
export type EngineDrivenTransferError = RequestError | NativeError

/** The adapter's interface; built by `makeEngineDrivenWorkerAdapter(With)`. */
export interface EngineDrivenWorkerAdapterShape extends SessionView {
  /** The L1 object of one chunk: shape, dtype and bytes (`chunkBytes`). */
  readonly layout: EngineDrivenLayout
  /**
   * REGISTER_KV_CACHE_ENGINE_DRIVEN_CONTEXT, maps the answered pool (shm),
   * then starts the heartbeat. Fails as the server answers or when the pool
   * cannot be mapped; a failure starts no heartbeat. Returns the answer.
   */
  readonly register: Effect.Effect<EngineDrivenPool, EngineDrivenTransferError>
  /** "shm" once registered with a pool, "inline" without; undefined before registration. */
  readonly transport: Effect.Effect<"shm" | "inline" | undefined>
  /**
   * Stores the request's chunks the server does not hold yet; `chunkBytes(i)`
   * gives chunk i of the range (called only for those). True when every
   * wanted chunk was published (or none was wanted); false at once, nothing
   * sent, in degraded mode. Fails with InvalidArgument when a chunk has the
   * wrong length or the server's slots do not fit this layout (the
   * PREPARE_STORE aborted first).
   */
  readonly store: (
    request: EngineDrivenRequest,
    chunkBytes: (chunkIndex: number) => Uint8Array
  ) => Effect.Effect<boolean, EngineDrivenTransferError>
  /** Retrieves every complete chunk of the range; not ok (nothing sent) in degraded mode. */
  readonly retrieve: (request: EngineDrivenRequest) => Effect.Effect<EngineDrivenRetrieveResult, EngineDrivenTransferError>
}

/** The mapped server pool. */
interface MappedPool {
  readonly name: string
  readonly sizeBytes: number
  readonly mapping: ShmMapping
  readonly scope: Scope.Closeable
}

const NOTHING: EngineDrivenRetrieveResult = { ok: false, chunks: [] }

/**
 * Builds an adapter on `client` in the current Scope: asks the chunk size,
 * checks the layout against it (InvalidArgument naming the field, e.g. a
 * block size that does not divide the chunk size), logs the instance id at
 * INFO, warns when 3 × the heartbeat interval exceeds the server's 30 s
 * minimum reap timeout. Closing the Scope stops the heartbeat, sends
 * UNREGISTER and unmaps the pool; closing `client` is its owner's business.
 */
export const makeEngineDrivenWorkerAdapterWith = (
  client: MqClientShape,
  options: EngineDrivenWorkerAdapterSettings
): Effect.Effect<EngineDrivenWorkerAdapterShape, RequestError, Scope.Scope | NativeMemory> =>
  Effect.gen(function*() {
    const native = yield* NativeMemory
    const opening = yield* openSession(client, options)
    const { chunkSizeTokens, instanceId, label } = opening
    const registration: RegisterEngineDrivenContext = {
      instance_id: instanceId,
      model_name: options.modelName,
      world_size: options.worldSize,
      block_size: options.blockSizeTokens,
      num_layers: options.numLayers,
      hidden_dim_size: options.hiddenDimSize,
      dtype_str: options.dtype,
      use_mla: options.useMla ?? false
    }
    const layout = validateLayout(registration, chunkSizeTokens)
    if ("error" in layout) return yield* new InvalidArgument({ message: `engine-driven worker adapter: ${layout.error}` })
    const { chunkBytes } = layout

    const scope = yield* Effect.scope
    let pool: MappedPool | undefined
    let transport: "shm" | "inline" | undefined

    /** Maps the answered pool (unless it is the one mapped already) and unmaps the old one; none for inline. */
    const adoptPool = (answer: EngineDrivenPool): Effect.Effect<void, EngineDrivenTransferError> =>
      Effect.gen(function*() {
        const shm = answer.pool_size > 0 && answer.shm_name !== ""
        if (shm && pool !== undefined && pool.name === answer.shm_name && pool.sizeBytes === answer.pool_size) {
          transport = "shm"
          return
        }
        const old = pool
        if (shm) {
          const child = yield* Scope.fork(scope)
          const mapping = yield* native.map(answer.shm_name, answer.pool_size).pipe(
            Scope.provide(child),
            Effect.onError(() => Scope.close(child, Exit.void))
          )
          pool = { name: answer.shm_name, sizeBytes: answer.pool_size, mapping, scope: child }
          yield* Effect.logInfo(`${label}: mapped the server's L1 pool ${answer.shm_name} (${answer.pool_size} bytes)`)
        } else pool = undefined
        transport = shm ? "shm" : "inline"
        if (old !== undefined) yield* Scope.close(old.scope, Exit.void)
      })

    // Added before the session's finalizer so that it runs after it (finalizers
    // run last-added first): the pool is unmapped once UNREGISTER is answered.
    yield* Effect.addFinalizer(() =>
      Effect.gen(function*() {
        if (pool !== undefined) yield* Scope.close(pool.scope, Exit.void)
        pool = undefined
      })
    )

    const session = yield* makeSession(opening, {
      qualifier: "engine-driven",
      kind: "engine_driven",
      registerOp: RegisterKvCacheEngineDrivenContext,
      registerPayload: (reg: RegisterEngineDrivenContext) => [reg] as const,
      onRegistered: adoptPool,
      unregisterOp: UnregisterKvCacheEngineDrivenContext
    })
    const { beforeTransfer, keyOf, transfer: request } = session
    const register = session.register(registration)

    const badSlots = (op: string, slots: ReadonlyArray<Slot>, indices: ReadonlyArray<number>, count: number) => {
      if (slots.length !== indices.length) return `${op}: ${slots.length} slot(s) for ${indices.length} chunk index(es)`
      for (let j = 0; j < slots.length; j++) {
        const s = slots[j]!
        if (s.length !== chunkBytes) {
          return `${op}: slot ${j} holds ${s.length} bytes; this worker's chunk objects [${layout.objectShape.join(", ")}] ${layout.dtype} take ${chunkBytes}`
        }
        if (!(indices[j]! < count)) return `${op}: chunk index ${indices[j]} is outside the request's ${count} chunk(s)`
      }
      return undefined
    }

    /** The pool for a slot copy; InvalidArgument when the server answered slots but no pool is mapped. */
    const mappedPool = (op: string) =>
      pool === undefined
        ? Effect.fail(new InvalidArgument({ message: `${op}: the server answered slots but this worker has no pool mapped (inline transport)` }))
        : Effect.succeed(pool)

    const chunkCount = (r: EngineDrivenRequest) => Math.max(0, Math.floor((r.end - r.start) / chunkSizeTokens))

    /**
     * COMMIT_STORE's abort (Op.ts CommitStore): one byte, shorter than any
     * chunk object; with one-byte objects, a length no store of `slots`
     * chunks has.
     */
    const abortData = (slots: number) => new Uint8Array(chunkBytes > 1 ? 1 : slots + 1)

    /**
     * Takes back a PREPARE_STORE this worker cannot complete: the server drops
     * the reservations now instead of holding them until its prepare TTL. Not
     * on a plain interruption (the worker is going away; UNREGISTER or the TTL
     * releases them), and a failed abort only logs a WARNING (the TTL remains).
     */
    const abortStore = (key: CacheKey, slots: number, cause: Cause.Cause<unknown>) =>
      Cause.hasInterruptsOnly(cause) ? Effect.void : request(CommitStore, [key, instanceId, abortData(slots)]).pipe(
        Effect.catchCause((c) =>
          Effect.logWarning(
            `${label}: store of request ${key.request_id}: the abort of its PREPARE_STORE failed (${Cause.pretty(c).split("\n")[0]}); the server releases the reservations after its prepare TTL`
          )
        )
      )

    /** Copies the wanted chunks into their slots (shm) → the COMMIT_STORE's cpu_data: empty, or the chunks (inline). */
    const fillSlots = (
      r: EngineDrivenRequest,
      slots: ReadonlyArray<Slot>,
      indices: ReadonlyArray<number>,
      chunkOf: (chunkIndex: number) => Uint8Array
    ) =>
      Effect.gen(function*() {
        const bad = badSlots("prepare_store", slots, indices, chunkCount(r))
        if (bad !== undefined) return yield* new InvalidArgument({ message: bad })
        const chunks = indices.map((i) => chunkOf(i))
        const wrong = chunks.findIndex((c) => c.length !== chunkBytes)
        if (wrong >= 0) {
          return yield* new InvalidArgument({
            message: `store: chunk ${indices[wrong]} has ${chunks[wrong]!.length} bytes; the layout [${layout.objectShape.join(", ")}] ${layout.dtype} takes ${chunkBytes}`
          })
        }
        if (transport === "shm") {
          const p = yield* mappedPool("store")
          yield* Effect.forEach(
            chunks,
            (c, j) => native.scatter(p.mapping, Float64Array.of(slots[j]!.offset, 0, chunkBytes), c),
            { concurrency: "unbounded", discard: true }
          )
          return new Uint8Array(0)
        }
        const data = Buffer.allocUnsafeSlow(chunks.length * chunkBytes)
        chunks.forEach((c, j) => data.set(c, j * chunkBytes))
        return data
      })

    const store = (r: EngineDrivenRequest, chunkOf: (chunkIndex: number) => Uint8Array) =>
      Effect.gen(function*() {
        if (!(yield* beforeTransfer)) return false
        const key = keyOf(r)
        const prepared = yield* request(PrepareStore, [key, instanceId])
        const { slots, chunk_indices: indices } = prepared.context
        if (slots.length === 0 && indices.length === 0) return true
        // From here the server holds reservations for this request: a local failure aborts them (issue 18).
        const cpuData = yield* fillSlots(r, slots, indices, chunkOf).pipe(
          Effect.onError((cause) => abortStore(key, slots.length, cause))
        )
        return yield* request(CommitStore, [key, instanceId, cpuData])
      })

    const retrieve = (r: EngineDrivenRequest) =>
      Effect.gen(function*() {
        if (!(yield* beforeTransfer)) return NOTHING
        const key = keyOf(r)
        const count = chunkCount(r)
        const prepared = yield* request(PrepareRetrieve, [key, instanceId])
        if (!prepared.success) return NOTHING
        const commit = request(CommitRetrieve, [key, instanceId])
        if (prepared.data.length > 0 || transport === "inline") {
          const released = yield* commit
          if (prepared.data.length !== count * chunkBytes) {
            return yield* new InvalidArgument({
              message: `prepare_retrieve: data has ${prepared.data.length} bytes; ${count} chunk(s) of ${chunkBytes} bytes need ${count * chunkBytes}`
            })
          }
          if (!released) return NOTHING
          return { ok: true, chunks: Array.from({ length: count }, (_, i) => prepared.data.slice(i * chunkBytes, (i + 1) * chunkBytes)) }
        }
        const slots = prepared.context.slots ?? []
        const indices = prepared.context.chunk_indices ?? []
        const copied = yield* Effect.exit(Effect.gen(function*() {
          const bad = badSlots("prepare_retrieve", slots, indices, count) ??
            (slots.length === count ? undefined : `prepare_retrieve: ${slots.length} slot(s) for the request's ${count} chunk(s)`)
          if (bad !== undefined) return yield* new InvalidArgument({ message: bad })
          const p = yield* mappedPool("retrieve")
          const chunks = slots.map(() => new Uint8Array(chunkBytes))
          yield* Effect.forEach(
            slots,
            (s, j) => native.gather(p.mapping, Float64Array.of(s.offset, 0, chunkBytes), chunks[indices[j]!]!),
            { concurrency: "unbounded", discard: true }
          )
          return chunks
        }))
        // The locks are released whatever the copy did.
        const released = yield* commit
        if (Exit.isFailure(copied)) return yield* Effect.failCause(copied.cause)
        return released ? { ok: true, chunks: copied.value } : NOTHING
      })

    return {
      ...session.view,
      layout,
      register,
      transport: Effect.sync(() => transport),
      store,
      retrieve
    } satisfies EngineDrivenWorkerAdapterShape
  })

/**
 * Builds an adapter with its own MQ client in the current Scope: connects,
 * then {@link makeEngineDrivenWorkerAdapterWith}. On close the adapter's
 * finalizer (heartbeat stop, UNREGISTER, unmap) runs before the socket
 * closes with its bounded linger.
 */
export const makeEngineDrivenWorkerAdapter = (
  options: EngineDrivenWorkerAdapterOptions
): Effect.Effect<EngineDrivenWorkerAdapterShape, RequestError, Scope.Scope | NativeMemory | ZmqSockets> =>
  withOwnClient(options, (client) => makeEngineDrivenWorkerAdapterWith(client, options))
