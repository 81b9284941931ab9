/**
 * The LMCache-driven transfer module (DESIGN §3–5; reference §3.2–3.5): the
 * worker registers its paged KV cache (POSIX shared memory or CUDA IPC
 * allocations, one descriptor per layer); the server maps it and copies
 * chunks between those blocks and L1 on STORE and RETRIEVE, off the JS thread.
 *
 * Each registered context is an entry of the module's per-instance core
 * (`InstanceModule.ts`, tracked): it owns a child Scope of the module's
 * scope, into which its mappings and its layout reference are acquired, and
 * UNREGISTER, a reap and server shutdown all release it by closing that
 * Scope — one finalizer, run once. Closing waits for copies in flight on its
 * mappings. A REGISTER of a held id with the same descriptors, model and
 * world size only refreshes last_seen; with others it is refused
 * (`invalid_argument`, DESIGN §5).
 *
 * REGISTER and UNREGISTER run on the SYNC lane (one at a time), so the
 * check-then-insert of REGISTER cannot interleave with another REGISTER or
 * UNREGISTER (a reap can: the core handles it).
 *
 * **Worker memory is touched only by copies** (issue 24 item 12): REGISTER
 * maps the segments and nothing else; no page of them is read or written
 * (nor populated: MAP_POPULATE or MADV_POPULATE_* would allocate the holes
 * of a sparse memfd, charged to the server) until a STORE or RETRIEVE
 * copies exactly its blocks. What a registration may map is bounded first
 * (`MappingBudget`: distinct segments per REGISTER, mappings and host bytes
 * per server; `overloaded` naming the flag, nothing mapped).
 *
 * **A vanished page** (issue 13 item 1, DESIGN §8): every copy of worker
 * memory (STORE's gather, RETRIEVE's scatter, Blend's copies through
 * {@link LmcacheDrivenTransfer.releaseFaulted}) runs under the addon's fault
 * guard. When a worker shrinks a registered
 * segment and a copy hits the missing pages, that copy fails with a
 * {@link SegmentFault}; the request is answered `invalid_argument` naming
 * the instance, the segment and "the segment shrank below its registered
 * size", and the instance's context is released through its one finalizer
 * (other instances and L1 untouched: a failed STORE aborts its
 * reservations, a failed RETRIEVE releases its read locks). Until the id
 * registers again (or unregisters), a transfer naming it gets the same
 * error rather than `not_registered`, so a fault found by Blend's copies is
 * still reported to the worker on its next request.
 *
 * **A CUDA failure** (issue 13 item 4) gets the same treatment: a cuda_ipc
 * handle that cudaIpcOpenMemHandle refuses fails the REGISTER with
 * `invalid_argument` naming the instance, the descriptor, the device and
 * the CUDA error (nothing of the instance is kept: its scope closes); a
 * CUDA call failing on a registered mapping mid-STORE or mid-RETRIEVE (a
 * lost device, an ECC error, a sticky error after which the context is
 * unusable: a {@link CudaFault}) answers `invalid_argument` naming the
 * instance, the descriptor, the device and the error, and releases the
 * context through the same finalizer. Each is counted in
 * `mpcache_guarded_faults_total{kind}` (Native.ts).
 *
 * This module holds the service (REGISTER/UNREGISTER, STORE/RETRIEVE and
 * their rows); its machinery is `internal/WorkerMemory.ts` (claiming passed
 * descriptors, mapping, block checks and copy parts, unlinking reaped
 * names) and `internal/FaultRelease.ts` (the fault release and the one
 * "copy failed" branch).
 */
import { Cause, Context, Effect, Exit, Layer, Metric, Option, type Scope } from "effect"
import { ServerConfig, type ServerConfigInput } from "./ServerConfig.ts"
import { type NativeError, NativeMemory, type ShmMapping, type WorkerMemoryFault } from "../../native/Native.ts"
import type { CacheKey } from "../../schema/CacheKey.ts"
import { formatInstanceId, type InstanceId } from "../../schema/InstanceId.ts"
import { RegisterKvCache, Retrieve, Store, UnregisterKvCache } from "../../schema/Op.ts"
import type { TensorDescriptor } from "../../schema/TensorDescriptor.ts"
import { type Forbidden, InvalidArgument, type NotRegistered, type Overloaded, type WireError } from "../../schema/WireError.ts"
import { type FaultRelease, makeFaultRelease } from "./internal/FaultRelease.ts"
import { kvLayoutOf, makeWorkerMemory } from "./internal/WorkerMemory.ts"
import { row, type ServerModule } from "./Handler.ts"
import { type LayerPlacement, type PagedKvGeometry, sameDescriptors, validateKvCaches } from "../kv/KvCacheLayout.ts"
import { MappingBudget } from "./MappingBudget.ts"
import { L1Store, type ReadHandle } from "./L1Store.ts"
import * as L1Handles from "./internal/L1Handles.ts"
import type { WriteHold } from "./internal/L1Handles.ts"
import { LayoutRegistry } from "./LayoutRegistry.ts"
import type { InstanceOwner } from "../liveness/InstanceOwner.ts"
import type { LivenessTarget } from "../liveness/LivenessTarget.ts"
import { makeTrackedInstances } from "./InstanceModule.ts"
import { Lookup, objectKeysOf } from "./Lookup.ts"
import { chunkHashes } from "../kv/TokenHasher.ts"
import { originOf } from "./kvevents/L1EventSink.ts"
import { L2Tier } from "./l2/L2Tier.ts"
import { FdExchange } from "./FdExchange.ts"
import { fromStart } from "../metrics/Series.ts"

/** One registered worker context (upstream ContextEntry); its liveness fields live in the registry. */
/** Bytes the mappings of one registration hold: each segment mapped once, from offset 0 for its `sizeBytes`. */
const sumMappedBytes = (mappings: ReadonlyMap<string, ShmMapping>): number => {
  let total = 0
  for (const m of mappings.values()) total += m.sizeBytes
  return total
}

export interface ContextEntry {
  readonly modelName: string
  readonly worldSize: number
  readonly engineType: string
  readonly descriptors: ReadonlyArray<TensorDescriptor>
  readonly geometry: PagedKvGeometry
  readonly layers: ReadonlyArray<LayerPlacement>
  readonly mappings: ReadonlyMap<string, ShmMapping>
  /** cpu_memfd (issue 13 item 2): who passed the descriptors (SO_PEERCRED) and each one's size and seals. */
  readonly memfd: MemfdOrigin | undefined
  /** Per descriptor, the passed memfd's "<dev>:<ino>" ("" for other kinds): what a repeated REGISTER must match. */
  readonly memoryIdentities: ReadonlyArray<string>
  /** Owns the mappings and the layout reference; closed exactly once. */
  readonly scope: Scope.Closeable
}

/** The `memfd` detail of an instance in /api/status: the sender's credentials and each passed descriptor's size and seals. */
export interface MemfdOrigin {
  readonly pid: number
  readonly uid: number
  readonly gid: number
  readonly segments: ReadonlyArray<{ readonly segment: string; readonly bytes: number; readonly seals: ReadonlyArray<string> }>
}

const storedChunksTotal = fromStart(Metric.counter("mpcache_stored_chunks_total", { description: "Chunks copied into L1 by STORE", incremental: true }))
const retrievedChunksTotal = fromStart(Metric.counter("mpcache_retrieved_chunks_total", { description: "Chunks copied out of L1 by RETRIEVE", incremental: true }))
const storedBytesTotal = fromStart(Metric.counter("mpcache_stored_bytes_total", { description: "Bytes copied into L1 by STORE", incremental: true }))
const retrievedBytesTotal = fromStart(Metric.counter("mpcache_retrieved_bytes_total", { description: "Bytes copied out of L1 by RETRIEVE", incremental: true }))

export class LmcacheDrivenTransfer extends Context.Service<LmcacheDrivenTransfer, {
  /**
   * REGISTER_KV_CACHE, received on connection `peer` (routing id hex; its
   * cpu_memfd tokens must have been issued to it: FdExchange). Fails with
   * InvalidArgument naming the bad field, the refused token or the changed
   * memory; with Overloaded naming `--max-segments-per-register`,
   * `--max-mappings` or `--max-mapped-bytes` (MappingBudget, issue 24 items
   * 4 and 12) before anything is mapped. Maps the segments and touches none
   * of their pages. `owner`: who registers it (the tenant guard's, issue 25
   * item 1), inserted with a new context.
   */
  readonly register: (
    id: InstanceId,
    kvCaches: ReadonlyArray<TensorDescriptor>,
    modelName: string,
    worldSize: number,
    engineType: string,
    peer?: string,
    owner?: InstanceOwner
  ) => Effect.Effect<void, InvalidArgument | Overloaded | Forbidden>
  /** UNREGISTER_KV_CACHE. An unknown id logs a WARNING and succeeds. */
  readonly unregister: (id: InstanceId) => Effect.Effect<void, Forbidden>
  /** STORE → ok. Fails with NotRegistered / InvalidArgument. */
  readonly store: (key: CacheKey, id: InstanceId, blockIds: ReadonlyArray<ReadonlyArray<number>>) => Effect.Effect<boolean, WireError>
  /** RETRIEVE → ok. Fails with NotRegistered / InvalidArgument. */
  readonly retrieve: (
    key: CacheKey,
    id: InstanceId,
    blockIds: ReadonlyArray<ReadonlyArray<number>>,
    skipFirstNTokens: number
  ) => Effect.Effect<boolean, WireError>
  readonly isRegistered: (id: InstanceId) => Effect.Effect<boolean>
  /**
   * The context of `id` for a transfer through it by another module (a CB
   * retrieve, DESIGN §5): refreshes last_seen and latches transfer activity
   * like STORE/RETRIEVE. Fails with NotRegistered naming `op` when none.
   */
  readonly resolveContext: (op: string, id: InstanceId) => Effect.Effect<ContextEntry, NotRegistered | Forbidden>
  /** The context of `id` without touching its liveness; undefined when none. */
  readonly contextOf: (id: InstanceId) => Effect.Effect<ContextEntry | undefined>
  /**
   * A copy through `entry` (the context of `id`) hit a vanished page, or a
   * CUDA call failed on one of its mappings: releases that context through
   * its finalizer if it is still the one held, remembers the fault for later
   * requests naming `id`, and returns the reply for `op`: InvalidArgument
   * naming the instance and the segment, and {@link SEGMENT_SHRANK} (detail:
   * op, instance_id, field "kv_caches", expected/actual bytes of the
   * segment) or the device and the CUDA error (detail field
   * "kv_caches[i]", expected a usable mapping on the device, actual the
   * error). Used by this module and Blend; `registeredBytes` is the faulted
   * segment's mapped size when it is not one of the context's (a Blend
   * cos/sin table).
   */
  readonly releaseFaulted: FaultRelease["releaseFaulted"]
  /**
   * The one "copy failed" branch of every copy through a context (STORE,
   * RETRIEVE, Blend's scatter; issue 25 item 3): a copy of `op` through
   * `entry` (the context of `id`) failed with `error`. A vanished page or a
   * CUDA failure is released and answered by `options.release` (default
   * {@link releaseFaulted}); otherwise a context released meanwhile answers
   * `options.missing` (default this module's NotRegistered for `op`), and a
   * context still held answers `whenHeld`.
   */
  readonly copyFailed: FaultRelease["copyFailed"]
  /** This module as a liveness target (DESIGN §5). */
  readonly target: LivenessTarget
  /** Rows: REGISTER/UNREGISTER SYNC, STORE/RETRIEVE AFFINITY. */
  readonly module: ServerModule
}>()("mpcache/services/LmcacheDrivenTransfer") {
  /** Needs the config, native memory, L1, lookup, the layout registry and the mapping budget (FdExchange, L2Tier optional). */
  static readonly layer = Layer.effect(this, Effect.suspend(() => make))
  /**
   * For tests: this module over its own storage — L1, the layout registry
   * and the mapping budget — and lookup, on `ServerConfig.layerTest(config)`;
   * each of them is an output too, so a test reaches L1 or the budget. It
   * needs only {@link NativeMemory}, the raw resource (`NativeMemoryLive` of
   * src/layers, or a test's probe over it: services never import layers).
   * No FdExchange (cpu_memfd is refused: "no descriptor socket") and L2 off.
   */
  static readonly layerTest = (config: Partial<ServerConfigInput> = {}) =>
    this.layer.pipe(
      Layer.provideMerge(Lookup.layer),
      Layer.provideMerge(Layer.mergeAll(L1Store.layer, LayoutRegistry.layer, MappingBudget.layer)),
      Layer.provideMerge(ServerConfig.layerTest(config))
    )
}

/**
 * The refusal of a named segment under `--named-segments deny` (issue 13
 * item 3): invalid_argument for `op` naming the instance and the descriptor
 * `field` ("kv_caches[2]"), expected/actual the descriptor kinds.
 */
export const namedSegmentsDenied = (op: string, id: InstanceId, field: string): InvalidArgument =>
  new InvalidArgument({
    op,
    instance_id: formatInstanceId(id),
    field: `${field}.kind`,
    expected: "a descriptor kind other than cpu_shm",
    actual: "cpu_shm",
    message: `${op}: instance ${formatInstanceId(id)}: ${field} is a named shared-memory segment (cpu_shm), and named segments are disabled on this server (--named-segments deny)`
  })

const make = Effect.gen(function*() {
  const l2 = yield* L2Tier
  const budget = yield* MappingBudget
  const config = yield* ServerConfig
  const native = yield* NativeMemory
  const l1 = yield* L1Store
  const lookup = yield* Lookup
  const layouts = yield* LayoutRegistry
  // Absent in module-level test assemblies: cpu_memfd is then refused as "no descriptor socket".
  const fdExchange = Option.getOrUndefined(yield* Effect.serviceOption(FdExchange))
  const chunk = config.chunkSizeTokens
  const memory = makeWorkerMemory({ native, layouts, fdExchange, chunk })
  const contexts = yield* makeTrackedInstances<ContextEntry>({
    name: "lmcache_driven_transfer",
    kind: "kv_cache",
    registerOp: RegisterKvCache.name,
    unregisterOp: UnregisterKvCache.name,
    differs: "different memory or model",
    missing: "is not registered",
    remedy: "register it again",
    details: (e) => ({
      ...(e.memfd === undefined ? {} : { memfd: e.memfd }),
      // What this instance's registration maps of its worker's memory (the status page's per-instance figure;
      // the server card's native.mapped_bytes is their sum).
      mapped_bytes: sumMappedBytes(e.mappings),
      mappings: e.mappings.size,
      model_name: e.modelName,
      world_size: e.worldSize,
      engine_type: e.engineType,
      layout: {
        num_layers: e.geometry.numLayers,
        num_blocks: e.geometry.numBlocks,
        block_size: e.geometry.blockSizeTokens,
        num_heads: e.geometry.numHeads,
        head_size: e.geometry.headSize,
        dtype: e.geometry.dtype,
        segments: [...e.mappings.keys()]
      }
    }),
    onReaped: (reaped) =>
      config.unlinkReapedSegments
        ? Effect.forEach(
          reaped,
          (r) => (r.reason === "disconnect" || r.reason === "timeout" ? memory.unlinkReapedNames(r.id, r.entry) : Effect.void),
          { discard: true }
        )
        : Effect.void
  })

  const faults = makeFaultRelease(contexts, native.segmentSize)
  const { releaseFaulted, copyFailed, resolveForTransfer } = faults

  const register = (
    id: InstanceId,
    kvCaches: ReadonlyArray<TensorDescriptor>,
    modelName: string,
    worldSize: number,
    engineType: string,
    peer = "",
    owner?: InstanceOwner
  ) =>
    Effect.scoped(Effect.gen(function*() {
      // Bounded before anything else looks at the descriptors one by one (issue 24 item 4).
      const demand = yield* budget.demandOf(RegisterKvCache.name, id, "kv_caches", kvCaches)
      const claimed = yield* memory.claimTokens(peer, id, kvCaches)
      const identities = memory.memoryIdentities(kvCaches, claimed)
      const registered = yield* contexts.register(id, {
        owner,
        same: (held) =>
          sameDescriptors(held.descriptors, kvCaches) && held.memoryIdentities.every((m, i) => m === identities[i]) &&
          held.modelName === modelName && held.worldSize === worldSize,
        acquire: (scope) =>
          Effect.gen(function*() {
            if (worldSize < 1) return yield* new InvalidArgument({ message: `register_kv_cache: world_size must be ≥ 1, got ${worldSize}` })
            const named = kvCaches.findIndex((d) => d.kind === "cpu_shm")
            if (config.namedSegments === "deny" && named >= 0) return yield* namedSegmentsDenied(RegisterKvCache.name, id, `kv_caches[${named}]`)
            // A new context only: refreshing a held one maps nothing.
            yield* budget.admit(RegisterKvCache.name, id, demand)
            // cuda_ipc descriptors need the CUDA backend (libcudart loaded at run time; DESIGN §4).
            const cuda = kvCaches.some((d) => d.kind === "cuda_ipc") ? yield* native.cudaBackend() : undefined
            const validated = validateKvCaches(kvCaches, chunk, cuda)
            if ("error" in validated) return yield* new InvalidArgument({ message: `register_kv_cache: ${validated.error}` })
            return {
              modelName,
              worldSize,
              engineType,
              descriptors: kvCaches,
              geometry: validated.geometry,
              layers: validated.layers,
              mappings: yield* memory.mapContext(scope, id, kvCaches, validated, claimed, modelName, worldSize),
              memfd: memory.memfdOrigin(validated, claimed),
              memoryIdentities: identities,
              scope
            } satisfies ContextEntry
          })
      })
      if (registered._tag === "Registered") faults.forget(id)
      if (registered._tag === "Unchanged") {
        return yield* Effect.logInfo(`instance ${formatInstanceId(id)} already registered; refreshing liveness`)
      }
      const { geometry: g, mappings } = registered.entry
      yield* Effect.logInfo(
        `registered instance ${formatInstanceId(id)}: model ${modelName}, world size ${worldSize}, ${g.numLayers} layers × [2, ${g.numBlocks}, ${g.blockSizeTokens}, ${g.numHeads}, ${g.headSize}] ${g.dtype}, ${mappings.size} segment(s)`
      )
    }))

  const unregister = (id: InstanceId) =>
    Effect.flatMap(Effect.andThen(Effect.sync(() => faults.forget(id)), contexts.unregister(id)), (released) =>
      released === undefined
        ? Effect.logWarning(`unregister: no registered context found for instance ${formatInstanceId(id)}`)
        : Effect.logInfo(`unregistered instance ${formatInstanceId(id)}`))

  /** Chunk range of a transfer: the complete chunks of [start, end); start must be chunk-aligned. */
  const chunkRange = (op: string, key: CacheKey) =>
    key.start % chunk !== 0
      ? Effect.fail(new InvalidArgument({ message: `${op}: key.start (${key.start}) must be a multiple of the chunk size (${chunk})` }))
      : key.worker_id === null
      ? Effect.fail(new InvalidArgument({ message: `${op}: key.worker_id is nil; a ${op} names the kv rank it moves` }))
      : Effect.succeed({ first: key.start / chunk, count: Math.floor((key.end - key.start) / chunk), rank: key.worker_id })

  // STORE and RETRIEVE hold their reservations and read locks in the request's scope (L1Handles, issue 25
  // item 2): whatever ends the request — an answer, a wire error, a defect, an interruption — releases them.
  const store = (key: CacheKey, id: InstanceId, blockIds: ReadonlyArray<ReadonlyArray<number>>) =>
    Effect.scoped(Effect.gen(function*() {
      const entry = yield* resolveForTransfer("store", id)
      const { first, count, rank } = yield* chunkRange("store", key)
      if (count === 0) return true
      const blocks = memory.blocksFor(entry, blockIds, count)
      if ("error" in blocks) {
        yield* Effect.logWarning(`store: failing closed, nothing written: ${blocks.error}`)
        return false
      }
      const allHashes = chunkHashes(key.token_ids, chunk, first + count)
      const objectKeys = objectKeysOf(key, allHashes.slice(first), rank)
      const g = entry.geometry
      const layout = kvLayoutOf(g, chunk)
      const objectBytes = layout.chunkBytes
      const reserved: Array<{ readonly hold: WriteHold; readonly chunkBlocks: ReadonlyArray<number> }> = []
      let full = false
      for (let i = 0; i < count; i++) {
        const chunkBlocks = blocks.list.slice(i * blocks.perChunk, (i + 1) * blocks.perChunk)
        if (chunkBlocks.every((b) => b === 0)) continue // vLLM's null block: nothing computed here
        const r = yield* L1Handles.reserve(l1, objectKeys[i]!, objectBytes, originOf(key.token_ids, chunk, first + i, allHashes))
        if (r._tag === "Full") {
          full = true
          break
        }
        if (r._tag === "Reserved") reserved.push({ hold: r.hold, chunkBlocks })
      }
      // One copy job per chunk (every layer of it), the chunks in parallel on the libuv pool.
      const copied = yield* Effect.exit(Effect.forEach(
        reserved,
        ({ hold, chunkBlocks }) =>
          native.gatherAll(memory.copyParts(entry, chunkBlocks), hold.reservation.bytes),
        { concurrency: "unbounded", discard: true }
      ))
      if (Exit.isFailure(copied)) {
        // The reservations are aborted when the request's scope closes.
        return yield* copyFailed(
          "store",
          id,
          entry,
          Option.getOrUndefined(Cause.findErrorOption(copied.cause)),
          Effect.as(Effect.logWarning("store: copy failed; nothing published", copied.cause), false)
        )
      }
      let committed = 0
      for (const { hold } of reserved) {
        if (!(yield* L1Handles.commit(l1, hold))) continue
        committed++
        yield* l2.writeThrough(hold.reservation.key, layout, hold.reservation.origin) // returns at once (issue 15 item 4)
      }
      yield* Metric.update(storedChunksTotal, committed)
      yield* Metric.update(storedBytesTotal, committed * objectBytes)
      if (full) yield* Effect.logWarning(`store: L1 is full of locked or reserved objects; stored ${committed} of ${count} chunk(s)`)
      return !full
    }))

  const retrieve = (
    key: CacheKey,
    id: InstanceId,
    blockIds: ReadonlyArray<ReadonlyArray<number>>,
    skipFirstNTokens: number
  ) =>
    Effect.scoped(Effect.gen(function*() {
      const entry = yield* resolveForTransfer("retrieve", id)
      const { first, count, rank } = yield* chunkRange("retrieve", key)
      if (count === 0) return true
      const blocks = memory.blocksFor(entry, blockIds, count)
      if ("error" in blocks) {
        yield* Effect.logWarning(`retrieve: failing closed, nothing read: ${blocks.error}`)
        return false
      }
      const hashes = chunkHashes(key.token_ids, chunk, first + count).slice(first)
      const objectKeys = objectKeysOf(key, hashes, rank)
      const handles: Array<ReadHandle> = []
      for (let i = 0; i < count; i++) {
        const h = yield* lookup.acquireForRetrieve(key.request_id, objectKeys[i]!)
        if (h === undefined) {
          yield* Effect.logWarning(`retrieve: chunk ${first + i} of request ${key.request_id} is not in L1; nothing read`)
          return false
        }
        handles.push(h)
      }
      yield* Effect.forEach(handles, (h, i) =>
        native.scatterAll(
          memory.copyParts(
            entry,
            blocks.list.slice(i * blocks.perChunk, (i + 1) * blocks.perChunk),
            Math.max(0, Math.min(chunk, skipFirstNTokens - i * chunk))
          ),
          h.bytes
        ), { concurrency: "unbounded", discard: true }).pipe(
          Effect.catch((e) => copyFailed("retrieve", id, entry, e, Effect.fail(new InvalidArgument({ message: `retrieve: ${e.message}` }))))
        )
      yield* Metric.update(retrievedChunksTotal, count)
      yield* Metric.update(retrievedBytesTotal, handles.reduce((n, h) => n + h.bytes.length, 0))
      return true
    }))

  const target = contexts.target

  const module: ServerModule = {
    name: "lmcache_driven_transfer",
    target,
    rows: [
      row(RegisterKvCache, "SYNC", ([id, kvCaches, modelName, worldSize, engineType], ctx) =>
        register(id, kvCaches, modelName, worldSize, engineType, ctx.peer, ctx.owner)),
      row(UnregisterKvCache, "SYNC", ([id]) => unregister(id)),
      row(Store, "AFFINITY", ([key, id, blockIds, eventHandle]) =>
        store(key, id, blockIds).pipe(Effect.map((ok) => [eventHandle, ok] as const))),
      row(Retrieve, "AFFINITY", ([key, id, blockIds, eventHandle, skip]) =>
        retrieve(key, id, blockIds, skip).pipe(Effect.map((ok) => [eventHandle, ok] as const)))
    ]
  }

  return {
    register,
    unregister,
    store,
    retrieve,
    isRegistered: contexts.isRegistered,
    resolveContext: contexts.resolveForTransfer,
    contextOf: contexts.get,
    releaseFaulted,
    copyFailed,
    target,
    module
  }
})
