/**
 * The engine-driven transfer module (DESIGN §3.1 ops 14–19, §3.2
 * RegisterEngineDrivenContext, §4 "Engine-driven", §5; reference §4): the
 * worker copies its KV bytes itself, and the server only hands out places
 * in L1 (PREPARE_*) and publishes or releases them (COMMIT_*). For engines
 * that cannot share their KV memory with the server (no CUDA IPC, non-CUDA
 * devices), or that choose to.
 *
 * **Registration.** REGISTER_KV_CACHE_ENGINE_DRIVEN_CONTEXT (SYNC) validates
 * the layout (`validateLayout`: block_size must divide the chunk size, one
 * chunk object must fit in L1, a model already registered with another
 * layout is refused — each an `invalid_argument` naming the field), builds
 * the per-instance pair (context entry, transfer strategy) and answers
 * `{shm_name, pool_size}` of the L1 pool. The L1 object of one chunk of one
 * rank is `[2, num_layers, chunk_size, hidden_dim_size]` (K = 0, V = 1) of
 * `dtype_str`, or with `use_mla` `[num_layers, chunk_size, hidden_dim_size]`
 * (upstream's MLA layout: one latent per token, no separate K and V). The
 * layout is registered in the LayoutRegistry (so LOOKUP answers for the
 * model) and released by the entry's finalizer. An id already held with the
 * same payload only refreshes last_seen; a different payload is refused
 * (`invalid_argument`: a process never inherits another's context).
 *
 * **The pair.** One entry of the module's per-instance core
 * (`InstanceModule.ts`, tracked: an InstanceRegistry) holds the context
 * *and* its strategy, so they are inserted and removed in one transaction
 * (upstream inserts and pops `_contexts[id]` and `_strategies[id]` under one
 * lock): a reap racing a re-register can never leave a context without its
 * strategy.
 * The entry owns a child Scope of the module's scope; UNREGISTER, a reap and
 * server shutdown all release it by closing that Scope — one finalizer, run
 * once — which closes the strategy (aborting its pending write reservations,
 * so partial data is never published, and releasing its pending read locks)
 * and drops the layout reference.
 *
 * **Strategy selection** (the server's `--engine-driven-transport`, upstream
 * `ShmTransferStrategy` when `shm_name` is set and `pool_size > 0`, else
 * `PickleTransferStrategy`): every context of a server gets the same kind.
 * The strategy is `internal/TransferStrategy.ts` (its pending PREPAREs and
 * their expiry timer: `internal/PendingPrepares.ts`); this module holds the
 * service — registration, the key checks and the rows.
 * - `shm` (default): REGISTER answers the pool's name and size; the worker
 *   maps the pool. PREPARE_STORE's slots are byte offsets into it; the worker
 *   copies its chunks there and COMMIT_STORE with empty `cpu_data`
 *   publishes. PREPARE_RETRIEVE answers slots of the read-locked objects;
 *   the worker copies out, and COMMIT_RETRIEVE releases the locks. Like
 *   upstream, a COMMIT_STORE with non-empty `cpu_data` is also accepted
 *   (inline bytes).
 * - `inline`: REGISTER answers `{shm_name: "", pool_size: 0}`. PREPARE_STORE
 *   still reserves and answers the slots (for their length, shape and dtype;
 *   the offsets mean nothing to a worker without the pool), and COMMIT_STORE
 *   must carry the bytes. PREPARE_RETRIEVE answers the chunks' bytes in
 *   `data` and releases the locks at once; COMMIT_RETRIEVE answers true.
 * - Inline bytes are the reserved (or retrieved) chunks' L1 objects
 *   concatenated in `chunk_indices` order (DESIGN §3.2), each exactly
 *   `chunk_bytes` long; any other length fails closed (`false`, the pending
 *   reservations dropped, nothing published).
 * - An L1 without a shared pool (an in-process test store) forces `inline`,
 *   and so does CURVE (issue 24 item 7: the pool holds every tenant's
 *   chunks; `validate` refuses `shm` with CURVE, and makes `inline` its default).
 *
 * **Pending writes and reads** live in the instance's strategy, keyed by
 * (request_id, worker_id, start, end) of the key — the request and its
 * range (upstream keys by `(instance_id, key)` without request_id; keying by
 * the request keeps two requests of the same tokens apart). A second PREPARE
 * of the same pending key replaces the first (its reservations are dropped,
 * its locks released). An entry's pending state goes with the entry
 * (unregister, reap, shutdown), and a PREPARE that is never committed is
 * released on its own once it is older than `--prepare-ttl-seconds`
 * (default 60; issue 18): 1 ms past the TTL the strategy's expiry timer
 * (one per strategy and direction, sleeping until the oldest pending
 * PREPARE is due) drops its reservations (nothing published) or releases
 * its read locks, logging a WARNING and
 * counting `mpcache_engine_driven_prepare_expired_total`; a COMMIT arriving
 * later answers false and publishes nothing, even when it beats the timer.
 * (The TTL does not stretch over the server's own stalls: it bounds what a
 * worker may hold, not a worker's silence.)
 *
 * **Transfers** (AFFINITY): a key is moved chunk by chunk over the complete
 * chunks of `[start, end)`; `start` must be chunk-aligned, `worker_id` must
 * name a rank below the context's world size and `model_name` must be the
 * context's (else `invalid_argument`; nothing reserved or locked). An id the
 * server does not hold answers `not_registered`. Every PREPARE/COMMIT
 * refreshes last_seen and latches transfer activity of this context only.
 * - PREPARE_STORE reserves L1 objects for the chunks not already cached (or
 *   being written by someone else) and answers `{context: {slots,
 *   chunk_indices}}`: one slot `{offset, length, shape, dtype}` per reserved
 *   chunk in chunk order, `chunk_indices` their indices within the key's
 *   range (0 = the chunk at `start`). Empty slots: everything is cached.
 *   When L1 is full of locked or reserved objects the reservation stops at
 *   the first chunk that does not fit (a WARNING), and the slots cover the
 *   chunks before it.
 * - COMMIT_STORE publishes the pending write → true; false when there is
 *   none (never prepared, already committed, replaced, expired) or when a
 *   reservation was dropped meanwhile (CLEAR force). A worker that gives up
 *   after PREPARE_STORE aborts with a COMMIT_STORE whose `cpu_data` is not
 *   empty but shorter than one chunk object (one byte; Op.ts
 *   CommitStore): the reservations are dropped at once, nothing published,
 *   → false.
 * - PREPARE_RETRIEVE takes the read locks LOOKUP's prefetch holds for
 *   `request_id` (or fresh ones) for every chunk; a chunk not in L1 answers
 *   `{success: false, data: empty, context: {}}` with nothing locked.
 * - COMMIT_RETRIEVE releases them → true; false when none are pending
 *   (never prepared, already committed, expired).
 */
import { Context, Effect, Layer, Scope } from "effect"
import { type EngineDrivenTransport, ServerConfig, type ServerConfigInput, SHM_UNDER_TENANCY } from "./ServerConfig.ts"
import type { CacheKey } from "../../schema/CacheKey.ts"
import { dtypeBytes } from "../../schema/Dtype.ts"
import type {
  EngineDrivenPool,
  PrepareRetrieveResponse,
  PrepareStoreResponse,
  RegisterEngineDrivenContext
} from "../../schema/EngineDriven.ts"
import { formatInstanceId, type InstanceId } from "../../schema/InstanceId.ts"
import {
  CommitRetrieve,
  CommitStore,
  PrepareRetrieve,
  PrepareStore,
  RegisterKvCacheEngineDrivenContext,
  UnregisterKvCacheEngineDrivenContext
} from "../../schema/Op.ts"
import { type Forbidden, InvalidArgument, type WireError } from "../../schema/WireError.ts"
import { type EngineDrivenLayout, validateLayout } from "../kv/EngineDrivenLayout.ts"
import { row, type ServerModule } from "./Handler.ts"
import { L1Store } from "./L1Store.ts"
import { type KvLayout, LayoutRegistry } from "./LayoutRegistry.ts"
import { L2Tier } from "./l2/L2Tier.ts"
import type { InstanceOwner } from "../liveness/InstanceOwner.ts"
import type { LivenessTarget } from "../liveness/LivenessTarget.ts"
import { makeTrackedInstances } from "./InstanceModule.ts"
import { Lookup, objectKeysOf } from "./Lookup.ts"
import { chunkHashes } from "../kv/TokenHasher.ts"
import { originOf } from "./kvevents/L1EventSink.ts"
import { pendingKeyOf } from "./internal/PendingPrepares.ts"
import { makeTransferStrategy, type TransferStrategy } from "./internal/TransferStrategy.ts"

// ---------------------------------------------------------------------------
// models
// ---------------------------------------------------------------------------

/** Whether two registrations describe the same context (every field equal). */
const sameRegistration = (a: RegisterEngineDrivenContext, b: RegisterEngineDrivenContext): boolean =>
  a.instance_id === b.instance_id && a.model_name === b.model_name && a.world_size === b.world_size &&
  a.block_size === b.block_size && a.num_layers === b.num_layers && a.hidden_dim_size === b.hidden_dim_size &&
  a.dtype_str === b.dtype_str && a.use_mla === b.use_mla

/** One registered engine-driven context and its strategy: the pair of DESIGN §4, one registry entry. */
export interface EngineDrivenContext {
  readonly registration: RegisterEngineDrivenContext
  readonly layout: EngineDrivenLayout
  readonly strategy: TransferStrategy
  /** Owns the strategy's release and the layout reference; closed exactly once. */
  readonly scope: Scope.Closeable
}

// ---------------------------------------------------------------------------
// service
// ---------------------------------------------------------------------------

const REGISTER = RegisterKvCacheEngineDrivenContext.name

export class EngineDrivenTransfer extends Context.Service<EngineDrivenTransfer, {
  /**
   * REGISTER_KV_CACHE_ENGINE_DRIVEN_CONTEXT → the pool to map (`shm_name ""`,
   * `pool_size 0` with the inline transport). Fails with InvalidArgument
   * naming the bad field, a layout other than the model's registered one, or
   * a held id with a different payload. `owner`: who registers it (the
   * tenant guard's, issue 25 item 1), inserted with a new context.
   */
  readonly register: (registration: RegisterEngineDrivenContext, owner?: InstanceOwner) => Effect.Effect<EngineDrivenPool, InvalidArgument | Forbidden>
  /** UNREGISTER_KV_CACHE_ENGINE_DRIVEN_CONTEXT. An unknown id logs a WARNING and succeeds. */
  readonly unregister: (id: InstanceId) => Effect.Effect<void, Forbidden>
  /** PREPARE_STORE. Fails with NotRegistered / InvalidArgument. */
  readonly prepareStore: (key: CacheKey, id: InstanceId) => Effect.Effect<PrepareStoreResponse, WireError>
  /** COMMIT_STORE → published. Fails with NotRegistered / InvalidArgument. */
  readonly commitStore: (key: CacheKey, id: InstanceId, cpuData: Uint8Array) => Effect.Effect<boolean, WireError>
  /** PREPARE_RETRIEVE. Fails with NotRegistered / InvalidArgument. */
  readonly prepareRetrieve: (key: CacheKey, id: InstanceId) => Effect.Effect<PrepareRetrieveResponse, WireError>
  /** COMMIT_RETRIEVE → released. Fails with NotRegistered / InvalidArgument. */
  readonly commitRetrieve: (key: CacheKey, id: InstanceId) => Effect.Effect<boolean, WireError>
  /** The context of `id` without touching its liveness; undefined when none. */
  readonly contextOf: (id: InstanceId) => Effect.Effect<EngineDrivenContext | undefined>
  /** The transport of this server's contexts. */
  readonly transport: EngineDrivenTransport
  /** This module as a liveness target of kind `engine_driven` (DESIGN §5). */
  readonly target: LivenessTarget
  /** The `engine_driven` block of `/api/status`. */
  readonly status: () => Effect.Effect<Record<string, unknown>>
  /** Rows: REGISTER and UNREGISTER on SYNC; the PREPARE and COMMIT ops on AFFINITY. */
  readonly module: ServerModule
}>()("mpcache/services/EngineDrivenTransfer") {
  /** Needs the config, L1, lookup and the layout registry (L2Tier optional); releases every context at shutdown. */
  static readonly layer = Layer.effect(this, Effect.suspend(() => make))
  /**
   * For tests: this module over its own L1 (sized by `config`), layout
   * registry and lookup, on `ServerConfig.layerTest(config)`; each of them
   * is an output too, so a test reaches L1. It needs only the raw
   * resource under L1's pool, `NativeMemory` (`NativeMemoryLive` of
   * src/layers: services never import layers). L2 off.
   */
  static readonly layerTest = (config: Partial<ServerConfigInput> = {}) =>
    this.layer.pipe(
      Layer.provideMerge(Lookup.layer),
      Layer.provideMerge(Layer.mergeAll(L1Store.layer, LayoutRegistry.layer)),
      Layer.provideMerge(ServerConfig.layerTest(config))
    )
}

const make = Effect.gen(function*() {
  const config = yield* ServerConfig
  const l1 = yield* L1Store
  const lookup = yield* Lookup
  const l2 = yield* L2Tier
  const layouts = yield* LayoutRegistry
  const chunk = config.chunkSizeTokens
  const pool = l1.pool
  // With CURVE the pool is never handed out (issue 24 item 7): `validate` refuses shm there, and a
  // configuration built without it (a program's own ServerConfigShape) gets inline all the same.
  const shmRefused = config.curve !== undefined && config.engineDrivenTransport === "shm"
  const transport: EngineDrivenTransport = pool === undefined || shmRefused ? "inline" : config.engineDrivenTransport
  if (shmRefused) yield* Effect.logWarning(`engine-driven transport: ${SHM_UNDER_TENANCY}; contexts use inline bytes`)
  else if (pool === undefined && config.engineDrivenTransport === "shm") {
    yield* Effect.logWarning("engine-driven transport: L1 has no shared pool; contexts use inline bytes")
  }
  const poolAnswer: EngineDrivenPool = transport === "shm" && pool !== undefined
    ? { shm_name: pool.shmName, pool_size: pool.sizeBytes }
    : { shm_name: "", pool_size: 0 }

  const contexts = yield* makeTrackedInstances<EngineDrivenContext>({
    name: "engine_driven_transfer",
    kind: "engine_driven",
    registerOp: REGISTER,
    unregisterOp: UnregisterKvCacheEngineDrivenContext.name,
    differs: "a different context (model, world size or layout)",
    missing: "has no engine-driven context",
    remedy: "register it again",
    details: ({ layout, registration: r, strategy }) => ({
      // The engine copies through L1's own pool: the server maps none of this worker's memory.
      mapped_bytes: 0,
      mappings: 0,
      model_name: r.model_name,
      world_size: r.world_size,
      transport: strategy.transport,
      layout: {
        num_layers: layout.numLayers,
        hidden_dim_size: layout.hiddenDim,
        block_size: layout.blockSizeTokens,
        dtype: layout.dtype,
        use_mla: layout.useMla,
        object_shape: layout.objectShape,
        chunk_bytes: layout.chunkBytes
      },
      pending_stores: strategy.pendingStores().requests,
      pending_retrieves: strategy.pendingRetrieves().requests
    })
  })

  /** Validates a REGISTER's layout and builds the pair in `scope`: the layout reference, then the strategy. */
  const acquireContext = (scope: Scope.Closeable, p: RegisterEngineDrivenContext) =>
    Effect.gen(function*() {
      const layout = validateLayout(p, chunk, l1.stats().capacityBytes)
      if ("error" in layout) return yield* new InvalidArgument({ message: `${REGISTER}: ${layout.error}` })
      const kvLayout: KvLayout = {
        numLayers: layout.numLayers,
        hiddenDim: layout.hiddenDim,
        elementBytes: dtypeBytes(layout.dtype),
        dtype: layout.dtype,
        chunkBytes: layout.chunkBytes
      }
      const known = yield* layouts.get(p.model_name, p.world_size)
      if (known !== undefined && (known.chunkBytes !== kvLayout.chunkBytes || known.numLayers !== kvLayout.numLayers ||
        known.hiddenDim !== kvLayout.hiddenDim || known.elementBytes !== kvLayout.elementBytes))
      {
        return yield* new InvalidArgument({
          message: `${REGISTER}: num_layers, hidden_dim_size, dtype_str, use_mla: model ${p.model_name} (world size ${p.world_size}) is registered with ${known.numLayers} layers × ${known.hiddenDim} of ${known.elementBytes}-byte elements (${known.chunkBytes}-byte chunks); this context describes ${kvLayout.numLayers} × ${kvLayout.hiddenDim} of ${kvLayout.elementBytes} bytes (${kvLayout.chunkBytes}-byte chunks)`
        })
      }
      yield* layouts.register(p.model_name, p.world_size, kvLayout)
      yield* Scope.addFinalizer(scope, layouts.unregister(p.model_name, p.world_size))
      // LOOKUP keys L2 by the registry's layout (the first registrant's), so writes use it too.
      const l2Layout = known ?? kvLayout
      const strategy = makeTransferStrategy(transport, layout, l1, lookup, `engine-driven instance ${formatInstanceId(p.instance_id)}`, {
        ttlMs: config.prepareTtlSeconds * 1000,
        scope
      }, (r) => l2.writeThrough(r.key, l2Layout, r.origin))
      yield* Scope.addFinalizer(scope, strategy.release)
      return { registration: p, layout, strategy, scope } satisfies EngineDrivenContext
    })

  const register = (p: RegisterEngineDrivenContext, owner?: InstanceOwner) =>
    Effect.gen(function*() {
      const idText = formatInstanceId(p.instance_id)
      const registered = yield* contexts.register(p.instance_id, {
        owner,
        same: (held) => sameRegistration(held.registration, p),
        acquire: (scope) => acquireContext(scope, p)
      })
      if (registered._tag === "Unchanged") {
        yield* Effect.logInfo(`engine-driven instance ${idText} already registered; refreshing liveness`)
        return poolAnswer
      }
      const { layout } = registered.entry
      yield* Effect.logInfo(
        `registered engine-driven instance ${idText}: model ${p.model_name}, world size ${p.world_size}, chunk object [${layout.objectShape.join(", ")}] ${layout.dtype} (${layout.chunkBytes} bytes), block size ${layout.blockSizeTokens}, transport ${transport}`
      )
      return poolAnswer
    })

  const unregister = (id: InstanceId) =>
    Effect.flatMap(contexts.unregister(id), (released) =>
      released === undefined
        ? Effect.logWarning(`unregister: no engine-driven context found for instance ${formatInstanceId(id)}`)
        : Effect.logInfo(`unregistered engine-driven instance ${formatInstanceId(id)}`))

  /** The object keys of the key's complete chunks, after the key's checks (fail closed, nothing touched). */
  const objectKeysFor = (op: string, entry: EngineDrivenContext, key: CacheKey) =>
    Effect.gen(function*() {
      const r = entry.registration
      const fail = (message: string) => Effect.fail(new InvalidArgument({ message: `${op}: ${message}` }))
      if (key.model_name !== r.model_name) {
        return yield* fail(`key.model_name (${key.model_name}) is not the model of instance ${formatInstanceId(r.instance_id)}'s context (${r.model_name})`)
      }
      if (key.world_size !== r.world_size) {
        return yield* fail(`key.world_size (${key.world_size}) is not the world size of the context (${r.world_size})`)
      }
      if (key.worker_id === null) return yield* fail(`key.worker_id is nil; a ${op} names the kv rank it moves`)
      if (key.worker_id >= r.world_size) {
        return yield* fail(`key.worker_id (${key.worker_id}) must be below the world size (${r.world_size})`)
      }
      if (key.start % chunk !== 0) return yield* fail(`key.start (${key.start}) must be a multiple of the chunk size (${chunk})`)
      const first = key.start / chunk
      const count = Math.floor((key.end - key.start) / chunk)
      const hashes = count === 0 ? [] : chunkHashes(key.token_ids, chunk, first + count).slice(first)
      return objectKeysOf(key, hashes, key.worker_id)
    })

  const prepareStore = (key: CacheKey, id: InstanceId) =>
    Effect.gen(function*() {
      const entry = yield* contexts.resolveForTransfer(PrepareStore.name, id)
      const objectKeys = yield* objectKeysFor(PrepareStore.name, entry, key)
      // What each chunk's commit announces in the KV event log (computed only for a chunk's first rank).
      const first = key.start / chunk
      const allHashes = objectKeys.length === 0 ? [] : chunkHashes(key.token_ids, chunk, first + objectKeys.length)
      const origins = objectKeys.map((_, i) => originOf(key.token_ids, chunk, first + i, allHashes))
      const answer = yield* entry.strategy.prepareStore(pendingKeyOf(key), objectKeys, origins)
      if (answer === undefined) return yield* contexts.notRegistered(PrepareStore.name, id)
      return answer
    })

  const commitStore = (key: CacheKey, id: InstanceId, cpuData: Uint8Array) =>
    Effect.gen(function*() {
      const entry = yield* contexts.resolveForTransfer(CommitStore.name, id)
      const ok = yield* entry.strategy.commitStore(pendingKeyOf(key), cpuData)
      if (ok === undefined) return yield* contexts.notRegistered(CommitStore.name, id)
      return ok
    })

  const prepareRetrieve = (key: CacheKey, id: InstanceId) =>
    Effect.gen(function*() {
      const entry = yield* contexts.resolveForTransfer(PrepareRetrieve.name, id)
      const objectKeys = yield* objectKeysFor(PrepareRetrieve.name, entry, key)
      const answer = yield* entry.strategy.prepareRetrieve(pendingKeyOf(key), key.request_id, objectKeys)
      if (answer === undefined) return yield* contexts.notRegistered(PrepareRetrieve.name, id)
      return answer
    })

  const commitRetrieve = (key: CacheKey, id: InstanceId) =>
    Effect.gen(function*() {
      const entry = yield* contexts.resolveForTransfer(CommitRetrieve.name, id)
      const ok = yield* entry.strategy.commitRetrieve(pendingKeyOf(key))
      if (ok === undefined) return yield* contexts.notRegistered(CommitRetrieve.name, id)
      return ok
    })

  const target = contexts.target

  const status = () =>
    Effect.gen(function*() {
      let stores = 0
      let retrieves = 0
      const all = yield* contexts.entries()
      for (const { strategy } of all) {
        stores += strategy.pendingStores().requests
        retrieves += strategy.pendingRetrieves().requests
      }
      return {
        engine_driven: {
          transport,
          pool: poolAnswer.shm_name === "" ? null : poolAnswer.shm_name,
          contexts: all.length,
          pending_stores: stores,
          pending_retrieves: retrieves
        }
      }
    })

  const module: ServerModule = {
    name: "engine_driven_transfer",
    target,
    status,
    rows: [
      row(RegisterKvCacheEngineDrivenContext, "SYNC", ([registration], ctx) => register(registration, ctx.owner)),
      row(UnregisterKvCacheEngineDrivenContext, "SYNC", ([id]) => unregister(id)),
      row(PrepareStore, "AFFINITY", ([key, id]) => prepareStore(key, id)),
      row(CommitStore, "AFFINITY", ([key, id, cpuData]) => commitStore(key, id, cpuData)),
      row(PrepareRetrieve, "AFFINITY", ([key, id]) => prepareRetrieve(key, id)),
      row(CommitRetrieve, "AFFINITY", ([key, id]) => commitRetrieve(key, id))
    ]
  }

  return {
    register,
    unregister,
    prepareStore,
    commitStore,
    prepareRetrieve,
    commitRetrieve,
    contextOf: contexts.get,
    transport,
    target,
    status,
    module
  }
})
