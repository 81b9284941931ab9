/**
 * The typed facade of the native memory addon (DESIGN §1 "native code", §4
 * "Data path"): POSIX shared-memory segments (`cpu_shm` descriptors) and
 * other processes' CUDA allocations (`cuda_ipc` descriptors, through
 * libcudart loaded at run time) mapped into the server, and bulk copies
 * between those mappings and JS buffers that run on the libuv thread pool,
 * never on the JS thread.
 *
 * This module holds the contract: the {@link NativeMemory} service and its
 * shape, and the Effect wrappers of the addon's raw calls
 * ({@link makeNativeCalls}), each of which turns the addon's `code` into
 * {@link InvalidArgument} (the caller asked for something wrong) or
 * {@link NativeError} (the system refused). Beside it: the failure and its
 * fault kinds (`NativeError.ts`, re-exported here), the addon's typed
 * surface and its loader (`internal/AddonLoader.ts`, re-exported here) and
 * the mapping of its errors (`internal/AddonErrors.ts`). The live layer,
 * which owns the mappings and their release, is `src/layers/NativeMemory.ts`.
 *
 * Units: every size, offset and length is in bytes. Segment names are POSIX
 * names without their leading slash, as listed in /dev/shm (DESIGN §3.2).
 *
 * The addon is built at install time (`npm ci` runs `scripts/build-native.mjs`).
 */
import { Context, Effect } from "effect"
import type { Scope } from "effect"
import type { InvalidArgument } from "../schema/WireError.ts"
import { countFault, cudaFaults, toCopyError, toCudaError, toMapError, toNativeError } from "./internal/AddonErrors.ts"
import type { AddonMapping, NativeAddon } from "./internal/AddonLoader.ts"
import type { CudaFault, NativeError, SegmentFault } from "./NativeError.ts"

export {
  type CudaFault,
  faultKind,
  type FaultKind,
  guardedFaultsTotal,
  isCudaFault,
  isSegmentFault,
  isWorkerMemoryFault,
  NativeError,
  SEGMENT_SHRANK,
  type SegmentFault,
  type WorkerMemoryFault
} from "./NativeError.ts"
export {
  type AddonMapping,
  addonPath,
  type FdFacts,
  type FdListener,
  type FdListenerStats,
  type FdListenOptions,
  type FdRefusalReason,
  type FdRequest,
  loadNativeAddon,
  type NativeAddon
} from "./internal/AddonLoader.ts"

// ---------------------------------------------------------------------------
// service
// ---------------------------------------------------------------------------

/**
 * One mapped shared-memory segment, handed out by {@link NativeMemoryShape.map}.
 * Pass it back to `gather`/`scatter`; its lifetime is the Scope it was mapped in.
 *
 * @category models
 */
export interface ShmMapping {
  /** The segment's POSIX name without its leading slash (as in /dev/shm). */
  readonly name: string
  /** Bytes mapped, from offset 0 of the segment: the descriptor's `nbytes`. */
  readonly sizeBytes: number
  /**
   * shm: the segment's file at map time as "<st_dev>:<st_ino>" (what its
   * name pointed at then; see `unlinkSegmentIf`); "" for CUDA memory.
   */
  readonly identity: string
  /** True once the mapping's release began: no new copy is accepted on it. */
  readonly isClosed: () => boolean
  /** How many times its release ran; ends at 1 after unmapping, never more. */
  readonly releases: () => number
}

/**
 * One mapping's share of a batched copy (`gatherAll` / `scatterAll`):
 * (mappingOffset, bufferOffset, length) triples, bytes.
 *
 * @category models
 */
export interface CopyPart {
  readonly mapping: ShmMapping
  readonly ranges: Float64Array
}

/**
 * A CUDA allocation of this process (worker side), handed out by
 * {@link NativeMemoryShape.allocateCuda}: a mapping like any other for
 * gather/scatter, plus what a `cuda_ipc` descriptor needs to name it.
 *
 * @category models
 */
export interface CudaAllocation extends ShmMapping {
  /** The 64-byte cudaIpcMemHandle_t (cudaIpcGetMemHandle) another process opens it with. */
  readonly ipcHandle: Uint8Array
  /** The device's UUID ("GPU-…"). */
  readonly deviceUuid: string
}

/**
 * What the CUDA backend found on this host, probed once per process
 * (libcudart is dlopen'ed on first use: the path in `MPCACHE_CUDART` when
 * set, else libcudart.so, .so.13, .so.12, .so.11.0).
 *
 * @category models
 */
export interface CudaBackendInfo {
  /** True when libcudart loaded, resolved its symbols and reports at least one device. */
  readonly available: boolean
  /** Why not ("libcudart not found: tried …", "… cudaGetDeviceCount failed: …"); "" when available. */
  readonly reason: string
  /** The library that loaded (as given to dlopen); "" when none. */
  readonly library: string
  /** The names or paths dlopen was given, in order. */
  readonly tried: ReadonlyArray<string>
  /** The devices, by ordinal, with their UUIDs ("GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"). */
  readonly devices: ReadonlyArray<{ readonly ordinal: number; readonly uuid: string }>
}

/** The message every refusal for a missing CUDA backend starts with. */
export const CUDA_UNAVAILABLE = "CUDA IPC backend not available on this host"

/**
 * The native memory backend: shared-memory segments, CUDA IPC mappings,
 * scoped mappings and off-thread copies (DESIGN §4).
 *
 * @category models
 */
export interface NativeMemoryShape {
  /**
   * Creates a segment of `nbytes` bytes (shm_open O_CREAT|O_EXCL, mode 0600,
   * ftruncate). Fails with NativeError: EEXIST when the name is taken, EINVAL
   * for a bad name or byte count. Used by tests and by the engine-driven pool.
   */
  readonly createSegment: (name: string, nbytes: number) => Effect.Effect<void, NativeError>
  /** Removes a segment's name (shm_unlink); mappings of it stay valid. NativeError ENOENT when absent. */
  readonly unlinkSegment: (name: string) => Effect.Effect<void, NativeError>
  /** The segment's size in bytes (fstat). NativeError ENOENT when absent. */
  readonly segmentSize: (name: string) => Effect.Effect<number, NativeError>
  /**
   * Removes the name only while it still names the file `identity`
   * (a {@link ShmMapping.identity}): "unlinked"; "replaced" when the name now
   * names another file (a restarted worker re-created it: kept); "absent"
   * when there is no such name. NativeError for other system errors.
   */
  readonly unlinkSegmentIf: (
    name: string,
    identity: string
  ) => Effect.Effect<"unlinked" | "replaced" | "absent", NativeError>
  /**
   * Scoped: maps bytes [0, nbytes) of the segment read/write (MAP_SHARED).
   * Closing the scope waits for copies in flight on it, then unmaps, exactly
   * once (also when the layer shuts down first).
   *
   * Fails with InvalidArgument when the segment does not exist, holds fewer
   * than `nbytes` bytes (mapping it would risk SIGBUS), or the name or
   * `nbytes` (an integer ≥ 1) is malformed; with NativeError for other
   * system errors (EACCES, ENOMEM …).
   *
   * `owned: true` marks memory this process created (the server's L1 pool):
   * it is left out of {@link NativeMemoryShape.usage}, which counts other
   * processes' memory only.
   */
  readonly map: (
    name: string,
    nbytes: number,
    options?: { readonly owned?: boolean }
  ) => Effect.Effect<ShmMapping, InvalidArgument | NativeError, Scope.Scope>
  /**
   * Scoped: maps bytes [0, nbytes) of a descriptor this process holds (a
   * passed memfd, `cpu_memfd`; issue 13 item 2) like `map` does a named
   * segment: the same mapping core, release and fault guard. `name` labels
   * the mapping (its segment key). The caller keeps `fd` and closes it; the
   * mapping holds the memory. InvalidArgument when the file is shorter than
   * `nbytes`; NativeError for system errors.
   */
  readonly mapFd: (fd: number, name: string, nbytes: number) => Effect.Effect<ShmMapping, InvalidArgument | NativeError, Scope.Scope>
  /**
   * Scoped: opens another process's CUDA allocation from its 64-byte IPC
   * handle (cudaIpcOpenMemHandle on the device whose UUID is `deviceUuid`,
   * with a CUDA stream of its own), as a mapping of `nbytes` bytes that
   * gather/scatter/releases treat like any other. Named
   * `cuda:<deviceUuid>:<hex of the handle>`. Closing the scope waits for
   * copies in flight, then closes the IPC mapping (cudaIpcCloseMemHandle),
   * then destroys the stream, exactly once (also when the layer shuts down
   * first).
   *
   * Fails with InvalidArgument when the backend is not available (the
   * message starts with {@link CUDA_UNAVAILABLE} and says why), the UUID is
   * malformed or names no device of this host, or the handle is not 64
   * bytes; with a {@link CudaFault} when cudaIpcOpenMemHandle refuses the
   * handle (EINVAL_HANDLE) or another CUDA call fails (ECUDA); NativeError
   * for the rest.
   * cudart cannot tell an allocation's size: `nbytes` is the caller's word.
   */
  readonly mapCudaIpc: (
    ipcHandle: Uint8Array,
    deviceUuid: string,
    nbytes: number
  ) => Effect.Effect<ShmMapping, InvalidArgument | NativeError, Scope.Scope>
  /**
   * Scoped, worker side: cudaMalloc of `nbytes` on the device `deviceUuid`
   * and its IPC handle, for a `cuda_ipc` descriptor (see
   * `src/native/CudaExport.ts`). Closing the scope waits for copies, then
   * cudaFree. Contents start uninitialised. Errors as for `mapCudaIpc`.
   */
  readonly allocateCuda: (
    deviceUuid: string,
    nbytes: number
  ) => Effect.Effect<CudaAllocation, InvalidArgument | NativeError, Scope.Scope>
  /** Probes the CUDA backend (once per process; later calls return the same). Never fails. */
  readonly cudaBackend: () => Effect.Effect<CudaBackendInfo>
  /** `cudaBackend()`'s `available`. */
  readonly cudaAvailable: () => Effect.Effect<boolean>
  /** cudaMemGetInfo on the device `deviceUuid`: bytes free and total. Errors as for `mapCudaIpc`. */
  readonly cudaMemInfo: (
    deviceUuid: string
  ) => Effect.Effect<{ readonly free: number; readonly total: number }, InvalidArgument | NativeError>
  /**
   * Copies mapping → `dest` on the libuv pool. `ranges` holds
   * (mappingOffset, bufferOffset, length) triples, bytes; all are checked
   * before anything is copied: InvalidArgument names the first bad triple
   * (not an integer ≥ 0, or outside the mapping or `dest`). NativeError
   * "ECLOSED" when the mapping is closing or closed. Uninterruptible: it
   * completes only when the bytes are in `dest`.
   *
   * Gotcha: the copy reads/writes `dest`'s memory from another thread; until
   * the Effect completes, `dest`'s ArrayBuffer must not be transferred,
   * detached or resized (the server's L1 buffers never are).
   */
  readonly gather: (
    mapping: ShmMapping,
    ranges: Float64Array,
    dest: Uint8Array
  ) => Effect.Effect<void, InvalidArgument | NativeError>
  /** Copies `src` → mapping; the same ranges, checks, errors and guarantees as `gather`. */
  readonly scatter: (
    mapping: ShmMapping,
    ranges: Float64Array,
    src: Uint8Array
  ) => Effect.Effect<void, InvalidArgument | NativeError>
  /**
   * `gather` of several mappings into one `dest` as ONE job on the libuv
   * pool (the layers of one chunk: one pool round trip per chunk instead of
   * one per layer, which kept the copy thread waiting on the JS thread). The
   * parts run in order; every part is checked before anything is copied; a
   * mapping closing or closed fails the whole call with NativeError ECLOSED;
   * the first failing part (CUDA) stops the job. Same guarantees as `gather`.
   */
  readonly gatherAll: (
    parts: ReadonlyArray<CopyPart>,
    dest: Uint8Array
  ) => Effect.Effect<void, InvalidArgument | NativeError>
  /** `scatter` of one `src` into several mappings as one job; as `gatherAll`. */
  readonly scatterAll: (
    parts: ReadonlyArray<CopyPart>,
    src: Uint8Array
  ) => Effect.Effect<void, InvalidArgument | NativeError>
  /**
   * Populates the page tables of bytes [offset, offset + length) of the
   * mapping on the libuv pool (contents unchanged), so later copies into it
   * do not pay first-touch page faults. `touch: true` (memory this process
   * owns: the L1 pool) also writes every page once with an atomic no-op, so a
   * hypervisor that backs guest pages lazily backs them now rather than on
   * the first STORE (~4 s per GiB on the Firecracker VMs measured). Counted
   * as a copy in flight. InvalidArgument for a range outside the mapping;
   * NativeError ECLOSED.
   */
  readonly prefault: (
    mapping: ShmMapping,
    offset: number,
    length: number,
    options?: { readonly touch?: boolean }
  ) => Effect.Effect<void, InvalidArgument | NativeError>
  /**
   * One ArrayBuffer viewing the whole mapping (zero-copy; the same object on
   * every call), for the memory's owner (the server's L1 pool). Releasing the
   * mapping detaches it before unmapping, so a late access sees an empty
   * buffer, never unmapped memory. NativeError ECLOSED once closed.
   */
  readonly view: (mapping: ShmMapping) => Effect.Effect<ArrayBuffer, InvalidArgument | NativeError>
  /** Process-wide counters: mappings currently mapped and their bytes. */
  readonly stats: () => { readonly openMappings: number; readonly mappedBytes: number }
  /**
   * The mappings of other processes' memory this layer holds open now (every
   * `map` but `owned` ones, `mapFd`, `mapCudaIpc`; not `allocateCuda`),
   * counted from its set of open mappings: a mapping leaves it when its
   * release has unmapped it, so reap, UNREGISTER and a fault release all
   * lower it through the one finalizer (issue 24 items 4 and 12).
   */
  readonly usage: () => MappingUsage
  /** Process-wide: copies and prefaults ended by a guarded fault since start (see {@link SegmentFault}). */
  readonly guardedFaults: () => number
  /** Process-wide: CUDA opens and copies of worker memory ended by a {@link CudaFault} since start. */
  readonly cudaFaults: () => number
}

/**
 * What {@link NativeMemoryShape.usage} counts: mappings of other processes'
 * memory, and their bytes of host memory (shared memory, memfds) and of
 * device memory (CUDA IPC).
 *
 * @category models
 */
export interface MappingUsage {
  readonly mappings: number
  readonly hostBytes: number
  readonly deviceBytes: number
}

/**
 * The native memory service. Live implementation: `NativeMemoryLive` in
 * `src/layers/NativeMemory.ts`.
 *
 * @category services
 */
export class NativeMemory extends Context.Service<NativeMemory, NativeMemoryShape>()("mpcache/native/NativeMemory") {}

// ---------------------------------------------------------------------------
// raw calls as Effects
// ---------------------------------------------------------------------------

/**
 * The addon's calls as Effects with typed failures. No resource management:
 * `openMapping` hands out an unscoped mapping, `closeMapping` closes it; the
 * live layer pairs them with acquireRelease.
 *
 * @category constructors
 */
export const makeNativeCalls = (addon: NativeAddon) => ({
  createSegment: (name: string, nbytes: number): Effect.Effect<void, NativeError> =>
    Effect.try({ try: () => addon.shmCreate(name, nbytes), catch: (e) => toNativeError(e, "shmCreate") }),
  unlinkSegment: (name: string): Effect.Effect<void, NativeError> =>
    Effect.try({ try: () => addon.shmUnlink(name), catch: (e) => toNativeError(e, "shmUnlink") }),
  segmentSize: (name: string): Effect.Effect<number, NativeError> =>
    Effect.try({ try: () => addon.shmSize(name), catch: (e) => toNativeError(e, "shmSize") }),
  unlinkSegmentIf: (name: string, identity: string): Effect.Effect<"unlinked" | "replaced" | "absent", NativeError> =>
    Effect.try({ try: () => addon.shmUnlinkIf(name, identity), catch: (e) => toNativeError(e, "shmUnlinkIf") }),
  openMapping: (name: string, nbytes: number): Effect.Effect<AddonMapping, InvalidArgument | NativeError> =>
    Effect.try({ try: () => addon.openMapping(name, nbytes), catch: (e) => toMapError(name, nbytes, e) }),
  openMappingFd: (fd: number, name: string, nbytes: number): Effect.Effect<AddonMapping, InvalidArgument | NativeError> =>
    Effect.try({ try: () => addon.openMappingFd(fd, name, nbytes), catch: (e) => toMapError(name, nbytes, e) }),
  /** Opens a cuda_ipc mapping (on the libuv pool). */
  openCudaIpcMapping: (
    ipcHandle: Uint8Array,
    deviceUuid: string,
    nbytes: number
  ): Effect.Effect<AddonMapping, InvalidArgument | NativeError> =>
    Effect.tryPromise({
      try: () => addon.openCudaIpcMapping(ipcHandle, deviceUuid, nbytes),
      catch: (e) => toCudaError(e, "openCudaIpcMapping")
    }).pipe(countFault),
  /** cudaMalloc + cudaIpcGetMemHandle (on the libuv pool). */
  cudaAllocate: (deviceUuid: string, nbytes: number): Effect.Effect<AddonMapping, InvalidArgument | NativeError> =>
    Effect.tryPromise({ try: () => addon.cudaAllocate(deviceUuid, nbytes), catch: (e) => toCudaError(e, "cudaAllocate") }),
  /** Probes libcudart once per process; MPCACHE_CUDART is read here, from this thread's process.env. */
  cudaProbe: (): Effect.Effect<CudaBackendInfo> => Effect.promise(() => addon.cudaProbe(process.env["MPCACHE_CUDART"] ?? "")),
  cudaMemGetInfo: (
    deviceUuid: string
  ): Effect.Effect<{ readonly free: number; readonly total: number }, InvalidArgument | NativeError> =>
    Effect.tryPromise({ try: () => addon.cudaMemGetInfo(deviceUuid), catch: (e) => toCudaError(e, "cudaMemGetInfo") }),
  /** Resolves after the release (munmap; for CUDA: IPC close or cudaFree, then stream destroy); waits for copies in flight first. */
  closeMapping: (mapping: AddonMapping): Effect.Effect<void, NativeError> =>
    Effect.tryPromise({ try: () => mapping.close(), catch: (e) => toNativeError(e, "munmap") }),
  /**
   * One gather or scatter. Validation errors are thrown synchronously by the
   * addon, before anything is queued. Uninterruptible: once queued, the copy
   * cannot be stopped, so the caller must not get its buffer back before it ends.
   */
  copy: (
    direction: "gather" | "scatter",
    mapping: AddonMapping,
    ranges: Float64Array,
    buffer: Uint8Array
  ): Effect.Effect<void, InvalidArgument | NativeError> =>
    Effect.uninterruptible(
      Effect.tryPromise({
        try: () => (direction === "gather" ? mapping.gather(ranges, buffer) : mapping.scatter(ranges, buffer)),
        catch: (e) => toCopyError(e, direction)
      }).pipe(countFault)
    ),
  /** One job over several mappings (see NativeAddon.copyBatch); uninterruptible like `copy`. */
  copyBatch: (
    direction: "gather" | "scatter",
    mappings: ReadonlyArray<AddonMapping>,
    ranges: ReadonlyArray<Float64Array>,
    buffer: Uint8Array
  ): Effect.Effect<void, InvalidArgument | NativeError> =>
    Effect.uninterruptible(
      Effect.tryPromise({ try: () => addon.copyBatch(direction, mappings, ranges, buffer), catch: (e) => toCopyError(e, direction) })
        .pipe(countFault)
    ),
  prefault: (
    mapping: AddonMapping,
    offset: number,
    length: number,
    touch = false
  ): Effect.Effect<void, InvalidArgument | NativeError> =>
    Effect.uninterruptible(
      Effect.tryPromise({ try: () => mapping.prefault(offset, length, touch), catch: (e) => toCopyError(e, "prefault") })
        .pipe(countFault)
    ),
  view: (mapping: AddonMapping): Effect.Effect<ArrayBuffer, NativeError> =>
    Effect.try({ try: () => mapping.arrayBuffer(), catch: (e) => toNativeError(e, "arrayBuffer") }),
  stats: (): { readonly openMappings: number; readonly mappedBytes: number } => addon.stats(),
  guardedFaults: (): number => addon.guardedFaults(),
  cudaFaults
})

/** The addon's calls as Effects (see {@link makeNativeCalls}). */
export type NativeCalls = ReturnType<typeof makeNativeCalls>
