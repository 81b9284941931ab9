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
 */
import { Cause, Context, Effect, Exit, Layer, Metric, Option, Scope } from "effect"
import { ServerConfig } from "./ServerConfig.ts"
import {
  type CopyPart,
  type CudaFault,
  isCudaFault,
  isSegmentFault,
  isWorkerMemoryFault,
  type NativeError,
  NativeMemory,
  SEGMENT_SHRANK,
  type ShmMapping,
  type WorkerMemoryFault
} from "../../native/Native.ts"
import type { CacheKey } from "../../schema/CacheKey.ts"
import { formatInstanceId, type InstanceId } from "../../schema/InstanceId.ts"
import { RegisterKvCache, Retrieve, Store, UnregisterKvCache } from "../../schema/Op.ts"
import type { TensorDescriptor } from "../../schema/TensorDescriptor.ts"
import { InvalidArgument, type NotRegistered, type Overloaded, type WireError } from "../../schema/WireError.ts"
import { chunkRanges, type SegmentPlan, segmentPlan } from "./internal/CopyPlan.ts"
import { row, type ServerModule } from "./Handler.ts"
import {
  type LayerPlacement,
  type PagedKvGeometry,
  sameDescriptors,
  segmentKeyOf,
  validateKvCaches,
  type ValidatedKvCaches
} from "../kv/KvCacheLayout.ts"
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
import { L2Tier } from "./l2/L2Tier.ts"
import type { KvLayout } from "./LayoutRegistry.ts"
import { type ClaimedFds, FdExchange } from "./FdExchange.ts"
import { sealNames } from "../../native/FdPassing.ts"
import { fromStart } from "../metrics/Series.ts"

/** One registered worker context (upstream ContextEntry); its liveness fields live in the registry. */
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
  ) => Effect.Effect<void, InvalidArgument | Overloaded>
  /** UNREGISTER_KV_CACHE. An unknown id logs a WARNING and succeeds. */
  readonly unregister: (id: InstanceId) => Effect.Effect<void>
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
  readonly resolveContext: (op: string, id: InstanceId) => Effect.Effect<ContextEntry, NotRegistered>
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
  readonly releaseFaulted: (
    op: string,
    id: InstanceId,
    entry: ContextEntry,
    fault: WorkerMemoryFault,
    registeredBytes?: number
  ) => Effect.Effect<InvalidArgument>
  /**
   * The one "copy failed" branch of every copy through a context (STORE,
   * RETRIEVE, Blend's scatter; issue 25 item 3): a copy of `op` through
   * `entry` (the context of `id`) failed with `error`. A vanished page or a
   * CUDA failure is released and answered by `options.release` (default
   * {@link releaseFaulted}); otherwise a context released meanwhile answers
   * `options.missing` (default this module's NotRegistered for `op`), and a
   * context still held answers `whenHeld`.
   */
  readonly copyFailed: <A>(
    op: string,
    id: InstanceId,
    entry: ContextEntry,
    error: InvalidArgument | NativeError | undefined,
    whenHeld: Effect.Effect<A, WireError>,
    options?: {
      readonly missing?: NotRegistered
      readonly release?: (fault: WorkerMemoryFault) => Effect.Effect<InvalidArgument>
    }
  ) => Effect.Effect<A, WireError>
  /** This module as a liveness target (DESIGN §5). */
  readonly target: LivenessTarget
  /** Rows: REGISTER/UNREGISTER SYNC, STORE/RETRIEVE AFFINITY. */
  readonly module: ServerModule
}>()("mpcache/services/LmcacheDrivenTransfer") {
  static readonly layer = Layer.effect(this, Effect.suspend(() => make))
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

/** What a fault left for later requests of the id: a shrunk segment (its registered and current bytes, where it hit) or a CUDA failure. */
type FaultRecord =
  | {
    readonly _tag: "SegmentShrank"
    readonly segment: string
    readonly registeredBytes: number
    /** Bytes of the segment when the fault was handled; undefined when its name was gone. */
    readonly currentBytes: number | undefined
    readonly call: string
    readonly offset: number
  }
  | {
    readonly _tag: "CudaFailed"
    /** The descriptor of the failed mapping, "kv_caches[i]" (the first that views it). */
    readonly field: string
    readonly fault: CudaFault
  }

/** "kv_caches[i]": the first descriptor of `descriptors` that views segment `key` (a shm name or a cudaSegmentKey). */
const fieldOfSegment = (descriptors: ReadonlyArray<TensorDescriptor>, key: string): string => {
  const i = descriptors.findIndex((d) => segmentKeyOf(d) === key)
  return i < 0 ? "kv_caches" : `kv_caches[${i}]`
}

/**
 * The reply to a CUDA failure on instance `idText`'s descriptor `field`
 * (issue 13 item 4): invalid_argument naming the instance, the descriptor,
 * the device and the CUDA error, and what the server did about it.
 */
const cudaFaultError = (op: string, idText: string, field: string, f: CudaFault): InvalidArgument => {
  const error = `${f.cudaErrorName} (cudaError ${f.cudaError}: ${f.cudaErrorString})`
  const refused = f.errno === "EINVAL_HANDLE"
  return new InvalidArgument({
    op,
    instance_id: idText,
    field,
    expected: refused
      ? `a CUDA IPC handle from cudaIpcGetMemHandle of a live process on this host, on device ${f.device}`
      : `a usable CUDA IPC mapping on device ${f.device}`,
    actual: `${f.call} failed with ${error}`,
    message: refused
      ? `${op}: instance ${idText}: ${field} (cuda_ipc on device ${f.device}): the CUDA driver refused the IPC handle: ${f.call} failed with ${error}; expected a handle from cudaIpcGetMemHandle of a live process on this host, on that device; nothing of the instance is kept`
      : `${op}: instance ${idText}: ${field} (cuda_ipc on device ${f.device}): ${f.call} failed with ${error}; the device memory cannot be used (a device lost, an ECC error or a sticky CUDA error); ${
        op === RegisterKvCache.name ? "nothing of the instance is kept" : "its context is released: register it again once the device is healthy"
      }`
  })
}

/** At most this many faulted ids are remembered (oldest forgotten first): a bound on a worker that faults forever. */
const MAX_FAULT_RECORDS = 1024

/** The L1 object layout of a context's geometry for `chunk`-token chunks (LayoutRegistry, L2 fingerprint). */
const kvLayoutOf = (g: PagedKvGeometry, chunk: number): KvLayout => ({
  numLayers: g.numLayers,
  hiddenDim: g.hiddenDim,
  elementBytes: g.elementBytes,
  dtype: g.dtype,
  chunkBytes: 2 * g.numLayers * chunk * g.hiddenDim * g.elementBytes
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
  const contexts = yield* makeTrackedInstances<ContextEntry>({
    name: "lmcache_driven_transfer",
    kind: "kv_cache",
    registerOp: RegisterKvCache.name,
    differs: "different memory or model",
    missing: "is not registered",
    remedy: "register it again",
    details: (e) => ({
      ...(e.memfd === undefined ? {} : { memfd: e.memfd }),
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
          (r) => (r.reason === "disconnect" || r.reason === "timeout" ? unlinkReapedNames(r.id, r.entry) : Effect.void),
          { discard: true }
        )
        : Effect.void
  })

  /**
   * `--unlink-reaped-segments` (issue 13 item 3): the cpu_shm names of a
   * reaped context, each unlinked only while it still names the file the
   * server mapped (st_dev/st_ino recorded at map time), so a name a restarted
   * worker re-created is kept. Logged per name; a failure is a WARNING.
   */
  const unlinkReapedNames = (id: InstanceId, entry: ContextEntry) =>
    Effect.forEach(entry.mappings, ([name, mapping]) =>
      mapping.identity === ""
        ? Effect.void // CUDA memory: no name
        : native.unlinkSegmentIf(name, mapping.identity).pipe(
          Effect.flatMap((outcome) =>
            Effect.logInfo(
              outcome === "unlinked"
                ? `unlinked /dev/shm/${name} of reaped instance ${formatInstanceId(id)}`
                : outcome === "replaced"
                ? `kept /dev/shm/${name} of reaped instance ${formatInstanceId(id)}: the name now names another segment (re-created)`
                : `/dev/shm/${name} of reaped instance ${formatInstanceId(id)} was already unlinked`
            )
          ),
          Effect.catch((e) => Effect.logWarning(`could not unlink /dev/shm/${name} of reaped instance ${formatInstanceId(id)}: ${e.message}`))
        ), { discard: true })

  // ---------------------------------------------------------------------------
  // faults (issue 13 item 1)
  // ---------------------------------------------------------------------------

  const faults = new Map<InstanceId, FaultRecord>()

  /** The reply for `op` on `id` whose context a fault released. */
  const faultError = (op: string, id: InstanceId, r: FaultRecord) => {
    const idText = formatInstanceId(id)
    if (r._tag === "CudaFailed") return cudaFaultError(op, idText, r.field, r.fault)
    const memfd = r.segment.startsWith("memfd:")
    const now = r.currentBytes !== undefined ? `${r.currentBytes} bytes now` : memfd ? "a passed memfd, shrunk by its owner" : "its name is gone"
    return new InvalidArgument({
      op,
      instance_id: idText,
      field: "kv_caches",
      expected: `segment ${r.segment} of at least ${r.registeredBytes} bytes (as registered)`,
      actual: r.currentBytes !== undefined ? `${r.currentBytes} bytes` : memfd ? `segment ${r.segment} shrank` : `segment ${r.segment} is gone`,
      message: `${op}: instance ${idText}: segment ${r.segment}: ${SEGMENT_SHRANK} (${r.registeredBytes} bytes registered, ${now}; ${r.call} faulted on the page at byte ${r.offset}); its context is released: recreate the memory and register it again`
    })
  }

  /** What a fault leaves for later requests of the id (a shrunk segment's size is read now). */
  const faultRecord = (entry: ContextEntry, fault: WorkerMemoryFault, mappedBytes?: number) =>
    isSegmentFault(fault)
      ? Effect.map(
        // A passed memfd has no name to measure it by: the server closed its descriptor after mapping it.
        fault.segment.startsWith("memfd:") ? Effect.succeedNone : Effect.option(native.segmentSize(fault.segment)),
        (size): FaultRecord => ({
          _tag: "SegmentShrank",
          segment: fault.segment,
          registeredBytes: entry.mappings.get(fault.segment)?.sizeBytes ?? mappedBytes ?? 0,
          currentBytes: Option.getOrUndefined(size),
          call: fault.call,
          offset: fault.offset
        })
      )
      : Effect.succeed<FaultRecord>({ _tag: "CudaFailed", field: fieldOfSegment(entry.descriptors, fault.segment), fault })

  const releaseFaulted = (op: string, id: InstanceId, entry: ContextEntry, fault: WorkerMemoryFault, mappedBytes?: number) =>
    Effect.gen(function*() {
      const record = yield* faultRecord(entry, fault, mappedBytes)
      const held = yield* contexts.get(id)
      if (held?.scope === entry.scope) {
        // Recorded before the release, so a request arriving meanwhile already gets this error.
        if (faults.size >= MAX_FAULT_RECORDS) faults.delete(faults.keys().next().value!)
        faults.set(id, record)
        // Through the one finalizer, which tells the context's owner (its mapped bytes go with the entry).
        yield* contexts.unregister(id, "fault")
        yield* Effect.logWarning(
          `instance ${formatInstanceId(id)}: ${fault.message}; released its context (${entry.mappings.size} segment(s))`
        )
      }
      return faultError(op, id, faults.get(id) ?? record)
    })

  /** The context for a transfer; an id a fault released answers that fault instead of not_registered. */
  const resolveForTransfer = (op: string, id: InstanceId): Effect.Effect<ContextEntry, WireError> =>
    contexts.resolveForTransfer(op, id).pipe(
      Effect.catch((missing): Effect.Effect<never, WireError> => {
        const record = faults.get(id)
        return Effect.fail(record === undefined ? missing : faultError(op, id, record))
      })
    )

  const copyFailed = <A>(
    op: string,
    id: InstanceId,
    entry: ContextEntry,
    error: InvalidArgument | NativeError | undefined,
    whenHeld: Effect.Effect<A, WireError>,
    options: {
      readonly missing?: NotRegistered
      readonly release?: (fault: WorkerMemoryFault) => Effect.Effect<InvalidArgument>
    } = {}
  ): Effect.Effect<A, WireError> =>
    error !== undefined && isWorkerMemoryFault(error)
      ? Effect.flatMap((options.release ?? ((f: WorkerMemoryFault) => releaseFaulted(op, id, entry, f)))(error), Effect.fail)
      : Effect.flatMap(contexts.isRegistered(id), (held) => held ? whenHeld : Effect.fail(options.missing ?? contexts.notRegistered(op, id)))

  /**
   * Maps a validated KV cache's segments into `scope` (each once, however
   * many layers view it; no page touched) and takes the model's layout
   * reference there; each error an InvalidArgument of REGISTER.
   */
  const mapContext = (
    scope: Scope.Closeable,
    id: InstanceId,
    kvCaches: ReadonlyArray<TensorDescriptor>,
    validated: ValidatedKvCaches,
    claimed: ReadonlyMap<string, ClaimedFds>,
    modelName: string,
    worldSize: number
  ) =>
    Effect.gen(function*() {
      const mappings = new Map<string, ShmMapping>()
      for (const [name, nbytes] of validated.segments) {
        const ipc = validated.cudaIpc.get(name)
        if (ipc !== undefined) {
          // One IPC mapping (and stream) per distinct handle, however many layers view it. A handle the driver
          // refuses (or a device failing while it opens) fails the REGISTER with the instance, the descriptor,
          // the device and the CUDA error (issue 13 item 4); the mappings opened so far close with the scope.
          const mapping = yield* native.mapCudaIpc(ipc.ipcHandle, ipc.deviceUuid, nbytes).pipe(
            Scope.provide(scope),
            Effect.catchIf(isCudaFault, (f) =>
              Effect.fail(cudaFaultError(RegisterKvCache.name, formatInstanceId(id), fieldOfSegment(kvCaches, name), f)))
          )
          mappings.set(name, mapping)
          continue
        }
        const passed = validated.memfd.get(name)
        const mapping = passed === undefined
          ? yield* native.map(name, nbytes).pipe(Scope.provide(scope))
          : yield* mapPassed(scope, name, nbytes, passed, claimed)
        // No prefault (issue 24 item 12): populating the page tables would allocate every page of a
        // sparse memfd, charged to the server. The first copy through each page pays its fault instead
        // (measured in docs/security.md: about +0.2 s per GiB on a first RETRIEVE, once).
        mappings.set(name, mapping)
      }
      const { geometry } = validated
      yield* layouts.register(modelName, worldSize, kvLayoutOf(geometry, chunk))
      yield* Scope.addFinalizer(scope, layouts.unregister(modelName, worldSize))
      return mappings
    }).pipe(
      Effect.mapError((e) =>
        // A reply already built for this op (a refused CUDA handle) goes as it is.
        e._tag === "InvalidArgument" && e.op === RegisterKvCache.name
          ? e
          : e._tag === "InvalidArgument"
          ? new InvalidArgument({ message: `register_kv_cache: ${e.message}` })
          : new InvalidArgument({
            message: `register_kv_cache: mapping the KV cache failed: ${e.message}`
          })
      )
    )

  /** A passed descriptor (cpu_memfd) mapped into `scope`; the claim closes the descriptor after REGISTER. */
  const mapPassed = (
    scope: Scope.Closeable,
    name: string,
    nbytes: number,
    passed: { readonly tokenHex: string; readonly index: number; readonly field: string },
    claimed: ReadonlyMap<string, ClaimedFds>
  ) => {
    const fds = claimed.get(passed.tokenHex)?.fds ?? []
    const fd = fds[passed.index]
    return fd === undefined
      ? Effect.fail(new InvalidArgument({ message: `${passed.field}.fd_index: ${passed.index}, but the token's request passed ${fds.length} descriptor(s)` }))
      : native.mapFd(fd.fd, name, nbytes).pipe(Scope.provide(scope))
  }

  /**
   * Scoped: claims every token the cpu_memfd descriptors name (FdExchange), before anything else, so a
   * replayed token is refused even when the instance is held; the descriptors close with the scope.
   */
  const claimTokens = (peer: string, id: InstanceId, kvCaches: ReadonlyArray<TensorDescriptor>) =>
    Effect.gen(function*() {
      const claimed = new Map<string, ClaimedFds>()
      for (const [i, d] of kvCaches.entries()) {
        if (d.kind !== "cpu_memfd" || d.fd_token === undefined) continue
        const hex = Buffer.from(d.fd_token).toString("hex")
        if (claimed.has(hex)) continue
        const field = `kv_caches[${i}].fd_token`
        if (fdExchange === undefined) {
          return yield* new InvalidArgument({ op: RegisterKvCache.name, field, message: `${RegisterKvCache.name}: ${field} names passed descriptors, but this server has no descriptor socket` })
        }
        claimed.set(hex, yield* fdExchange.claim(RegisterKvCache.name, id, peer, field, d.fd_token))
      }
      return claimed
    })

  /** Per descriptor, the identity of the memfd it names ("" for other kinds); a token is unique per claim. */
  const memoryIdentities = (kvCaches: ReadonlyArray<TensorDescriptor>, claimed: ReadonlyMap<string, ClaimedFds>) =>
    kvCaches.map((d) =>
      d.kind === "cpu_memfd" && d.fd_token !== undefined
        ? claimed.get(Buffer.from(d.fd_token).toString("hex"))?.fds[d.fd_index ?? 0]?.identity ?? ""
        : "")

  /** The /api/status detail of claimed descriptors. */
  const memfdOrigin = (validated: ValidatedKvCaches, claimed: ReadonlyMap<string, ClaimedFds>): MemfdOrigin | undefined => {
    const first = claimed.values().next().value
    if (first === undefined) return undefined
    return {
      pid: first.pid,
      uid: first.uid,
      gid: first.gid,
      segments: [...validated.memfd].map(([segment, p]) => {
        const fd = claimed.get(p.tokenHex)?.fds[p.index]
        return { segment, bytes: fd?.size ?? 0, seals: sealNames(fd?.seals ?? -1) }
      })
    }
  }

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
      const claimed = yield* claimTokens(peer, id, kvCaches)
      const identities = memoryIdentities(kvCaches, claimed)
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
              mappings: yield* mapContext(scope, id, kvCaches, validated, claimed, modelName, worldSize),
              memfd: memfdOrigin(validated, claimed),
              memoryIdentities: identities,
              scope
            } satisfies ContextEntry
          })
      })
      if (registered._tag === "Registered") faults.delete(id)
      if (registered._tag === "Unchanged") {
        return yield* Effect.logInfo(`instance ${formatInstanceId(id)} already registered; refreshing liveness`)
      }
      const { geometry: g, mappings } = registered.entry
      yield* Effect.logInfo(
        `registered instance ${formatInstanceId(id)}: model ${modelName}, world size ${worldSize}, ${g.numLayers} layers × [2, ${g.numBlocks}, ${g.blockSizeTokens}, ${g.numHeads}, ${g.headSize}] ${g.dtype}, ${mappings.size} segment(s)`
      )
    }))

  const unregister = (id: InstanceId) =>
    Effect.flatMap(Effect.andThen(Effect.sync(() => faults.delete(id)), contexts.unregister(id)), (released) =>
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

  // Per context: its segments in copy-plan order and their mappings, built at its first transfer.
  const plans = new WeakMap<ContextEntry, { readonly segments: SegmentPlan; readonly mappings: ReadonlyArray<ShmMapping> }>()
  const planOf = (entry: ContextEntry) => {
    let plan = plans.get(entry)
    if (plan === undefined) {
      const segments = segmentPlan(entry.layers)
      plan = { segments, mappings: segments.names.map((name) => entry.mappings.get(name)!) }
      plans.set(entry, plan)
    }
    return plan
  }

  /** One chunk's copy (blocks `chunkBlocks`, the first `skipTokens` left out) as the parts of one batched copy. */
  const copyParts = (entry: ContextEntry, chunkBlocks: ReadonlyArray<number>, skipTokens = 0): Array<CopyPart> => {
    const { segments, mappings } = planOf(entry)
    const ranges = chunkRanges(entry.geometry, entry.layers, chunk, chunkBlocks, skipTokens, segments)
    const parts: Array<CopyPart> = new Array(ranges.length)
    for (let i = 0; i < ranges.length; i++) parts[i] = { mapping: mappings[i]!, ranges: ranges[i]! }
    return parts
  }

  /** The chunk's block ids, or a reason to fail closed. */
  const blocksFor = (entry: ContextEntry, blockIds: ReadonlyArray<ReadonlyArray<number>>, count: number) => {
    const perChunk = chunk / entry.geometry.blockSizeTokens
    const list = blockIds[0] ?? []
    if (list.length < count * perChunk) {
      return { error: `block_ids[0] has ${list.length} ids; ${count} chunk(s) of ${perChunk} blocks need ${count * perChunk}` }
    }
    for (let i = 0; i < count * perChunk; i++) {
      if (list[i]! >= entry.geometry.numBlocks) {
        return { error: `block_ids[0][${i}] = ${list[i]} is outside the registered ${entry.geometry.numBlocks} blocks` }
      }
    }
    return { perChunk, list }
  }

  // STORE and RETRIEVE hold their reservations and read locks in the request's scope (L1Handles, issue 25
  // item 2): whatever ends the request — an answer, a wire error, a defect, an interruption — releases them.
  const store = (key: CacheKey, id: InstanceId, blockIds: ReadonlyArray<ReadonlyArray<number>>) =>
    Effect.scoped(Effect.gen(function*() {
      const entry = yield* resolveForTransfer("store", id)
      const { first, count, rank } = yield* chunkRange("store", key)
      if (count === 0) return true
      const blocks = blocksFor(entry, blockIds, count)
      if ("error" in blocks) {
        yield* Effect.logWarning(`store: failing closed, nothing written: ${blocks.error}`)
        return false
      }
      const hashes = chunkHashes(key.token_ids, chunk, first + count).slice(first)
      const objectKeys = objectKeysOf(key, hashes, rank)
      const g = entry.geometry
      const layout = kvLayoutOf(g, chunk)
      const objectBytes = layout.chunkBytes
      const reserved: Array<{ readonly hold: WriteHold; readonly chunkBlocks: ReadonlyArray<number> }> = []
      let full = false
      for (let i = 0; i < count; i++) {
        const chunkBlocks = blocks.list.slice(i * blocks.perChunk, (i + 1) * blocks.perChunk)
        if (chunkBlocks.every((b) => b === 0)) continue // vLLM's null block: nothing computed here
        const r = yield* L1Handles.reserve(l1, objectKeys[i]!, objectBytes)
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
          native.gatherAll(copyParts(entry, chunkBlocks), hold.reservation.bytes),
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
        yield* l2.writeThrough(hold.reservation.key, layout) // returns at once (issue 15 item 4)
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
      const blocks = blocksFor(entry, blockIds, count)
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
          copyParts(
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
