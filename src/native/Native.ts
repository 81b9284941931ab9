/**
 * The typed facade of the native memory addon (DESIGN §1 "native code", §4
 * "Data path"): POSIX shared-memory segments (`cpu_shm` descriptors) and
 * other processes' CUDA allocations (`cuda_ipc` descriptors, through
 * libcudart loaded at run time) mapped into the server, and bulk copies
 * between those mappings and JS buffers that run on the libuv thread pool,
 * never on the JS thread.
 *
 * This module holds the contract: the {@link NativeMemory} service and its
 * shape, the {@link NativeError} failure, the typed surface of the C++ addon
 * (`src/native/addon`) and the Effect wrappers of its raw calls, each of
 * which turns the addon's `code` into {@link InvalidArgument} (the caller
 * asked for something wrong) or {@link NativeError} (the system refused).
 * The live layer, which owns the mappings and their release, is
 * `src/layers/NativeMemory.ts`.
 *
 * Units: every size, offset and length is in bytes. Segment names are POSIX
 * names without their leading slash, as listed in /dev/shm (DESIGN §3.2).
 *
 * The addon is built at install time (`npm ci` runs `scripts/build-native.mjs`).
 */
import { existsSync } from "node:fs"
import { createRequire } from "node:module"
import { fileURLToPath } from "node:url"
import { Context, Effect, Metric, Schema } from "effect"
import type { Scope } from "effect"
import { InvalidArgument } from "../schema/WireError.ts"

// ---------------------------------------------------------------------------
// errors
// ---------------------------------------------------------------------------

/**
 * A native call failed: `call` names it (shm_open, ftruncate, mmap, munmap,
 * gather …), `errno` the code ("ENOENT", "EACCES", "ECLOSED" for a copy on a
 * closed mapping …), `message` says what failed on which segment and why
 * (strerror for system errors). Problems with the caller's input are
 * {@link InvalidArgument} instead.
 *
 * @category errors
 */
export class NativeError extends Schema.TaggedError<NativeError>()("NativeError", {
  call: Schema.String,
  errno: Schema.String,
  message: Schema.String,
  /** A guarded fault (errno "EFAULT", see {@link isSegmentFault}): the segment whose page vanished. */
  segment: Schema.optionalKey(Schema.String),
  /** A guarded fault: the byte offset in that mapping where the copy hit the missing page. */
  offset: Schema.optionalKey(Schema.Number),
  /** A CUDA failure on a mapping ({@link isCudaFault}): the device's UUID ("GPU-…"). */
  device: Schema.optionalKey(Schema.String),
  /** A CUDA failure: the cudaError_t. */
  cudaError: Schema.optionalKey(Schema.Number),
  /** A CUDA failure: its name ("cudaErrorLaunchFailure", cudaGetErrorName). */
  cudaErrorName: Schema.optionalKey(Schema.String),
  /** A CUDA failure: cudaGetErrorString's words ("unspecified launch failure"). */
  cudaErrorString: Schema.optionalKey(Schema.String)
}) {}

/**
 * A NativeError of a guarded fault (issue 13 item 1, DESIGN §8): a copy
 * (`call` "gather" / "scatter") or prefault ("prefault") of a worker's
 * segment took SIGBUS or SIGSEGV on the mapping, because the worker shrank
 * the segment (`ftruncate`) below the size it registered; the addon's fault
 * guard (src/native/addon/guard.h) ended that one copy instead of the
 * process. `segment` names it, `offset` is where in the mapping the copy
 * hit the first missing page (bytes). The mapping stays mapped (a copy of
 * the pages still there works); the server releases the instance.
 *
 * @category error handling
 */
export type SegmentFault = NativeError & { readonly errno: "EFAULT"; readonly segment: string; readonly offset: number }

/** Whether `e` is a {@link SegmentFault}. */
export const isSegmentFault = (e: { readonly _tag: string }): e is SegmentFault =>
  e instanceof NativeError && e.errno === "EFAULT" && e.segment !== undefined

/** What every fault reply says, after naming the instance and the segment (issue 13). */
export const SEGMENT_SHRANK = "the segment shrank below its registered size"

/**
 * A NativeError of a CUDA call that failed on a worker's CUDA memory (issue
 * 13 item 4): errno "EINVAL_HANDLE" when cudaIpcOpenMemHandle refused the
 * handle (`call` "cudaIpcOpenMemHandle"), "ECUDA" when another call failed
 * opening it or copying through it (cudaSetDevice, cudaMemcpyAsync,
 * cudaStreamSynchronize: a device lost mid-copy, an ECC error, a sticky
 * error after which the context is unusable). `segment` is the mapping's
 * name (`cuda:<device>:<hex of the handle>`), `device` its device's UUID,
 * `cudaError` / `cudaErrorName` / `cudaErrorString` what cudart said. The
 * server answers invalid_argument and releases the instance.
 *
 * @category error handling
 */
export type CudaFault = NativeError & {
  readonly errno: "ECUDA" | "EINVAL_HANDLE"
  readonly segment: string
  readonly device: string
  readonly cudaError: number
  readonly cudaErrorName: string
  readonly cudaErrorString: string
}

/** Whether `e` is a {@link CudaFault}. */
export const isCudaFault = (e: { readonly _tag: string }): e is CudaFault =>
  e instanceof NativeError && (e.errno === "ECUDA" || e.errno === "EINVAL_HANDLE") && e.cudaErrorName !== undefined &&
  e.segment !== undefined && e.device !== undefined

/** A fault of worker memory the server answers by releasing the instance (issue 13 items 1 and 4). */
export type WorkerMemoryFault = SegmentFault | CudaFault

/** Whether `e` is a {@link WorkerMemoryFault}. */
export const isWorkerMemoryFault = (e: { readonly _tag: string }): e is WorkerMemoryFault => isSegmentFault(e) || isCudaFault(e)

/**
 * The `kind` label of {@link guardedFaultsTotal}: `segment_shrank` (a
 * guarded SIGBUS/SIGSEGV: the segment shrank under a copy),
 * `cuda_handle_refused` (cudaIpcOpenMemHandle refused a REGISTER's handle),
 * `cuda_error` (another CUDA call failed on a worker's memory).
 */
export type FaultKind = "segment_shrank" | "cuda_handle_refused" | "cuda_error"

/** The {@link FaultKind} of a fault. */
export const faultKind = (e: WorkerMemoryFault): FaultKind =>
  isSegmentFault(e) ? "segment_shrank" : e.errno === "EINVAL_HANDLE" ? "cuda_handle_refused" : "cuda_error"

/**
 * Faults of worker memory that ended a request, by `kind` ({@link FaultKind})
 * and `call` ("gather", "scatter", "prefault" for segment_shrank; the CUDA
 * call for the CUDA kinds): one per faulted copy job or refused open.
 * `/api/status` fault_guard.guarded_faults is the sum of kind
 * segment_shrank, fault_guard.cuda_faults the sum of the CUDA kinds.
 *
 * @category metrics
 */
export const guardedFaultsTotal = Metric.counter("mpcache_guarded_faults_total", {
  description:
    "Requests of worker memory ended by a fault, by kind (segment_shrank: a guarded SIGBUS/SIGSEGV, the segment shrank under the copy; cuda_handle_refused: cudaIpcOpenMemHandle refused the handle; cuda_error: a CUDA call failed on the memory, e.g. a device lost mid-copy) and call",
  incremental: true
})

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
// the addon
// ---------------------------------------------------------------------------

/**
 * A mapping as the addon returns it (`Mapping`, a C++ ObjectWrap). Copies
 * resolve when the bytes are copied; `close()` resolves after the munmap, and
 * every call of it resolves after that same munmap. `closed` is true from the
 * first `close()` on.
 *
 * @category models
 */
export interface AddonMapping {
  readonly name: string
  /** Bytes mapped. */
  readonly size: number
  readonly closed: boolean
  /** "shm" (openMapping), "cuda_ipc" (openCudaIpcMapping) or "cuda_alloc" (cudaAllocate). */
  readonly kind: "shm" | "cuda_ipc" | "cuda_alloc"
  /** The device UUID as given; "cpu" for shm. */
  readonly device: string
  /** shm: "<st_dev>:<st_ino>" of the segment when mapped; "" for CUDA. */
  readonly identity: string
  gather(ranges: Float64Array, dest: Uint8Array): Promise<void>
  scatter(ranges: Float64Array, src: Uint8Array): Promise<void>
  /** shm: populates page tables (and with `touch`, writes each page once, atomically, contents unchanged); CUDA: resolves at once. */
  prefault(offset: number, length: number, touch?: boolean): Promise<void>
  /** shm only (EINVAL for CUDA memory). */
  arrayBuffer(): ArrayBuffer
  /** CUDA only: the 64-byte cudaIpcMemHandle_t (EINVAL for shm). */
  ipcHandle(): Uint8Array
  close(): Promise<void>
}

/**
 * What the addon reads of a descriptor (fdInfo, and each one a request passed).
 *
 * @category models
 */
export interface FdFacts {
  readonly fd: number
  /** st_size, bytes; -1 when fstat failed. */
  readonly size: number
  /** F_GET_SEALS: F_SEAL_* bits; -1 when the file takes no seals (not a memfd or shmem file). */
  readonly seals: number
  readonly regular: boolean
  /** The file's type, for messages: "regular file", "socket", "fifo", "directory", "character device" … */
  readonly kind: string
  /** The open file's access mode: "rw", "r", "w" ("?" unknown). */
  readonly access: "rw" | "r" | "w" | "?"
  /** "<st_dev>:<st_ino>". */
  readonly identity: string
}

/**
 * One request on the descriptor socket, as the listener's thread hands it
 * over: the connection to reply on, the sender's SO_PEERCRED, the payload and
 * the facts of each passed descriptor in SCM_RIGHTS order, or the framing
 * `error` that ended the request ("" when none; then `fds` is empty). Only
 * memfds (files that take seals) reach JS: their `fd` is the receiver's to
 * close with {@link FdListener.closePassed}; any other descriptor was let go
 * of by the addon already and carries `fd` -1 (issue 24 item 2).
 *
 * @category models
 */
export interface FdRequest {
  readonly conn: number
  readonly pid: number
  readonly uid: number
  readonly gid: number
  readonly error: string
  readonly payload: Uint8Array
  readonly fds: ReadonlyArray<FdFacts>
}

/** Why the listener refused a connection before any request reached JS (the `reason` of its counters). */
export type FdRefusalReason = "uid" | "connections" | "connections_per_uid" | "deadline"

/**
 * The listener's counters (issue 24 items 8, 9, 11): connections open now,
 * connections accepted since start, passed descriptors in this process's
 * table (tokens, requests in flight, closes pending) and those queued for
 * the closer thread, and refusals per reason since start.
 *
 * @category models
 */
export interface FdListenerStats {
  readonly connections: number
  readonly accepted: number
  readonly heldDescriptors: number
  readonly closingDescriptors: number
  readonly refusals: Readonly<Record<FdRefusalReason, number>>
}

/**
 * How the listener takes connections (src/native/addon/fdlisten.cc):
 * `maxConnections` in all and `maxConnectionsPerUid` per sender uid
 * (over one a connection is answered `refusals.connections` /
 * `refusals.connections_per_uid` and closed at accept); connections are read
 * only while fewer than `maxPassedDescriptors` + 64 passed descriptors are
 * held; `allowedUid` -1 takes every uid that can connect (a path: its mode
 * decides), else only that uid and root (others answered `refusals.uid`
 * and closed before anything is read); `refusals.deadline` answers a
 * request not complete 5 s after accept. `groupId`: a path's group (mode
 * 0660), absent: mode 0600. Each refusal is a packed reply payload.
 *
 * @category models
 */
export interface FdListenOptions {
  readonly maxConnections: number
  readonly maxConnectionsPerUid: number
  readonly maxPassedDescriptors: number
  readonly allowedUid: number
  readonly groupId?: number
  readonly refusals: Readonly<Record<FdRefusalReason, Uint8Array>>
}

/**
 * The descriptor socket's listener: `reply` once per request (then the
 * connection closes); `closePassed` closes a memfd a request handed over
 * (and takes it off `heldDescriptors`); `stats` reads the counters and
 * re-arms the refusal callback; `close` is final.
 */
export interface FdListener {
  readonly path: string
  reply(conn: number, bytes: Uint8Array): void
  closePassed(fd: number): void
  stats(): FdListenerStats
  close(): void
}

/**
 * The addon's exports (`src/native/addon/addon.cc`). Every throw or rejection
 * is an Error with a string `code` (errno name, or EINVAL, EINVAL_SIZE,
 * EINVAL_RANGE, ECLOSED, EFAULT for a guarded fault, which also carries
 * `segment`, `signal` and `offset`) and `call`. Loading it installs the
 * process-wide fault guard (src/native/addon/guard.h).
 *
 * @category models
 */
export interface NativeAddon {
  shmCreate(name: string, nbytes: number): void
  shmUnlink(name: string): void
  shmSize(name: string): number
  shmUnlinkIf(name: string, identity: string): "unlinked" | "replaced" | "absent"
  openMapping(name: string, nbytes: number): AddonMapping
  /** Maps a descriptor this process holds (cpu_memfd); the caller keeps and closes `fd`. EINVAL_SIZE when shorter than nbytes. */
  openMappingFd(fd: number, name: string, nbytes: number): AddonMapping
  /** memfd_create(MFD_CLOEXEC|MFD_ALLOW_SEALING), ftruncate(nbytes), F_ADD_SEALS `seals` (F_SEAL_* bits) → the descriptor. */
  memfdCreate(name: string, nbytes: number, seals: number): number
  /** fstat, F_GET_SEALS (-1: the file takes no seals) and the access mode of a descriptor. */
  fdInfo(fd: number): FdFacts
  closeFd(fd: number): void
  /** Client side of the descriptor socket (src/native/FdPassing.ts). */
  sendFds(socketPath: string, payload: Uint8Array, fds: ReadonlyArray<number>, timeoutMs: number): Promise<Uint8Array>
  /** Server side of the descriptor socket (src/native/FdPassing.ts); `onRefusal` runs after refusals (coalesced: read `stats()`). */
  listenFds(socketPath: string, onRequest: (request: FdRequest) => void, onRefusal: () => void, options: FdListenOptions): FdListener
  /**
   * Rejects with ENOCUDA, EINVAL (UUID), EINVAL_HANDLE (cudaIpcOpenMemHandle refused), ECUDA (those two with
   * `segment`, `device`, `cudaError`, `cudaErrorName`, `cudaErrorString`); throws EINVAL for bad arguments.
   */
  openCudaIpcMapping(ipcHandle: Uint8Array, deviceUuid: string, nbytes: number): Promise<AddonMapping>
  cudaAllocate(deviceUuid: string, nbytes: number): Promise<AddonMapping>
  /** Loads libcudart once per process; `libraryPath` (else MPCACHE_CUDART from the C environment) counts on the first call only. */
  cudaProbe(libraryPath?: string): Promise<CudaBackendInfo>
  cudaMemGetInfo(deviceUuid: string): Promise<{ readonly free: number; readonly total: number }>
  /** mappings[i] copies with ranges[i] to or from `buffer`, all in one job; checks as gather/scatter, ECLOSED if any mapping is closed. */
  copyBatch(
    direction: "gather" | "scatter",
    mappings: ReadonlyArray<AddonMapping>,
    ranges: ReadonlyArray<Float64Array>,
    buffer: Uint8Array
  ): Promise<void>
  /** Every backend's mappings. */
  stats(): { readonly openMappings: number; readonly mappedBytes: number }
  /** Copies and prefaults ended by a guarded fault since the process started. */
  guardedFaults(): number
  /**
   * RLIMIT_NOFILE's soft limit raised to the hard one (an infinite hard limit: to /proc/sys/fs/nr_open); a
   * refused raise keeps the soft limit. Descriptor counts (`before`: the soft limit before the call).
   */
  raiseDescriptorLimit(): { readonly soft: number; readonly hard: number; readonly before: number }
  /** srand(3) from getrandom(2): libzmq's ROUTER takes its first generated routing id from rand() (src/native/addon/limits.cc). */
  seedLibzmqRandom(): number
  /**
   * The OpenSSL HMAC APIs this process exports that passed RFC 4231's test case 2, preferred first ("evp_mac":
   * OpenSSL 3's EVP_MAC, "hmac": HMAC_*), resolved once with dlsym (src/native/addon/hmac.h); `reason` says
   * what was missing or failed ("" when both work).
   */
  hmacProbe(): { readonly apis: ReadonlyArray<"evp_mac" | "hmac">; readonly reason: string }
  /**
   * HMAC-SHA256 under `key` of the concatenation of `parts`, 32 bytes, on the libuv pool. The parts are read in
   * place while it runs (each held by a reference): their bytes must stay unchanged and mapped until it settles.
   * `api` picks one of hmacProbe's (default: the first). Throws EINVAL (arguments), ENOSYS (no such API);
   * rejects with ECRYPTO when OpenSSL fails. Wrapped by src/native/Hmac.ts.
   */
  hmacSha256(key: Uint8Array, parts: ReadonlyArray<Uint8Array>, api?: "evp_mac" | "hmac"): Promise<Buffer>
  /** hmacSha256 jobs queued or running whose promise has not settled yet (process-wide; drops just before it settles). */
  hmacInFlight(): number
  /** The process's accepted (non-listening) sockets whose local address is TCP `port` or Unix `path`: [fd, inode] pairs (sockets.h). */
  scanAcceptedSockets(address: { readonly port: number } | { readonly path: string }): Promise<ReadonlyArray<readonly [number, number]>>
  /** shutdown(fd, SHUT_RDWR) if `fd` is still the socket of `inode`; whether it was. */
  shutdownSocket(fd: number, inode: number): boolean
  /** copyBatch with the shm copies outside the fault guard: bench/transfer/transfer.ts only, to measure the guard's cost. */
  copyBatchUnguarded(
    direction: "gather" | "scatter",
    mappings: ReadonlyArray<AddonMapping>,
    ranges: ReadonlyArray<Float64Array>,
    buffer: Uint8Array
  ): Promise<void>
}

/**
 * Where `node-gyp` puts the addon: `src/native/addon/build/Release/` of the
 * package, whether this module runs from source (src/native/Native.ts) or as
 * the emitted JavaScript of the library build (dist/src/native/Native.js:
 * tsconfig.build.json keeps rootDir at the package root, so dist/ mirrors
 * it and the source tree sits three levels up). The addon is never copied
 * into dist/: a consumer's `npm install` builds it in place.
 */
export const addonPath: string = fileURLToPath(
  new URL(
    import.meta.url.endsWith(".ts")
      ? "./addon/build/Release/mpcache_native.node"
      : "../../../src/native/addon/build/Release/mpcache_native.node",
    import.meta.url
  )
)

let loaded: NativeAddon | undefined

/**
 * Loads the addon once per process (or worker thread). Throws an Error that
 * says how to build it when it is missing.
 *
 * @category constructors
 */
export const loadNativeAddon = (): NativeAddon => {
  if (loaded !== undefined) return loaded
  const howToBuild = "Build it with `npm ci` (or `node scripts/build-native.mjs`)."
  if (!existsSync(addonPath)) {
    throw new Error(`mpcache native addon is not built: ${addonPath} is missing. ${howToBuild}`)
  }
  try {
    loaded = createRequire(import.meta.url)(addonPath) as NativeAddon
  } catch (cause) {
    const why = cause instanceof Error ? cause.message : String(cause)
    throw new Error(`mpcache native addon ${addonPath} does not load: ${why}. ${howToBuild}`, { cause })
  }
  return loaded
}

// ---------------------------------------------------------------------------
// error mapping
// ---------------------------------------------------------------------------

/** What a fault adds to an addon error: a guarded fault's segment and offset, a CUDA failure's segment, device and error. */
interface FaultFields {
  segment?: string
  offset?: number
  device?: string
  cudaError?: number
  cudaErrorName?: string
  cudaErrorString?: string
}

/** The `code`, `call` and message of an addon error (or of anything thrown), and its {@link FaultFields}. */
const describe = (cause: unknown, fallbackCall: string): { code: string; call: string; message: string; fault: FaultFields } => {
  if (cause instanceof Error) {
    const e = cause as Error & Record<string, unknown>
    const fault: FaultFields = {}
    for (const key of ["segment", "device", "cudaErrorName", "cudaErrorString"] as const) {
      const v = e[key]
      if (typeof v === "string") fault[key] = v
    }
    for (const key of ["offset", "cudaError"] as const) {
      const v = e[key]
      if (typeof v === "number") fault[key] = v
    }
    return {
      code: typeof e["code"] === "string" ? e["code"] : "EUNKNOWN",
      call: typeof e["call"] === "string" ? e["call"] : fallbackCall,
      message: cause.message,
      fault
    }
  }
  return { code: "EUNKNOWN", call: fallbackCall, message: String(cause), fault: {} }
}

/**
 * Any addon failure as a NativeError (segment-level calls, close).
 *
 * @category error handling
 */
export const toNativeError = (cause: unknown, fallbackCall: string): NativeError => {
  const d = describe(cause, fallbackCall)
  return new NativeError({ call: d.call, errno: d.code, message: d.message })
}

/**
 * A failure of openMapping: a missing segment, a segment shorter than asked
 * and malformed input are the caller's (InvalidArgument); the rest NativeError.
 *
 * @category error handling
 */
export const toMapError = (name: string, nbytes: number, cause: unknown): InvalidArgument | NativeError => {
  const d = describe(cause, "openMapping")
  switch (d.code) {
    case "ENOENT":
      return new InvalidArgument({
        message: `shared-memory segment ${name} does not exist (expected /dev/shm/${name}, created by the worker before it registers)`
      })
    case "EINVAL_SIZE":
      return new InvalidArgument({ message: `${d.message}; expected nbytes (${nbytes}) <= the segment's size` })
    case "EINVAL":
    case "ENAMETOOLONG":
      return new InvalidArgument({ message: d.message })
    default:
      return new NativeError({ call: d.call, errno: d.code, message: d.message })
  }
}

/**
 * A failure of a CUDA open, allocation or query: no backend (ENOCUDA) and a
 * bad or unknown device UUID or argument (EINVAL) are the caller's
 * (InvalidArgument); the rest NativeError, with its fault fields: a handle
 * cudart refuses (EINVAL_HANDLE) and a failed CUDA call (ECUDA) are
 * {@link CudaFault}s.
 *
 * @category error handling
 */
export const toCudaError = (cause: unknown, fallbackCall: string): InvalidArgument | NativeError => {
  const d = describe(cause, fallbackCall)
  switch (d.code) {
    case "ENOCUDA":
    case "EINVAL":
      return new InvalidArgument({ message: d.message })
    default:
      return new NativeError({ call: d.call, errno: d.code, message: d.message, ...d.fault })
  }
}

/**
 * A failure of gather/scatter/prefault: bad ranges or buffers are
 * InvalidArgument; ECLOSED and the rest NativeError; a guarded fault a
 * NativeError EFAULT with its segment and offset ({@link SegmentFault}).
 *
 * @category error handling
 */
export const toCopyError = (cause: unknown, fallbackCall: string): InvalidArgument | NativeError => {
  const d = describe(cause, fallbackCall)
  if (d.code === "EINVAL_RANGE" || d.code === "EINVAL") return new InvalidArgument({ message: d.message })
  return new NativeError({ call: d.call, errno: d.code, message: d.message, ...d.fault })
}

/**
 * CUDA opens and copies of worker memory ended by a {@link CudaFault} in this process since it started
 * (process-wide, as the addon's own `guardedFaults` counter is): what `/api/status` reports.
 */
let cudaFaultCount = 0

/**
 * Counts a {@link WorkerMemoryFault} in {@link guardedFaultsTotal} (labels `kind`, `call`), and a CUDA one in
 * `cudaFaultCount`; other failures pass untouched. Inside the copy's uninterruptible region: a batch whose first
 * failure interrupts its siblings still counts each of their faults, as the addon's own counter does.
 */
const countFault = <A, R>(
  copy: Effect.Effect<A, InvalidArgument | NativeError, R>
): Effect.Effect<A, InvalidArgument | NativeError, R> =>
  Effect.tapError(copy, (e) => {
    if (!isWorkerMemoryFault(e)) return Effect.void
    if (isCudaFault(e)) cudaFaultCount++
    return Metric.update(Metric.withAttributes(guardedFaultsTotal, { kind: faultKind(e), call: e.call }), 1)
  })

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
  cudaFaults: (): number => cudaFaultCount
})

/** The addon's calls as Effects (see {@link makeNativeCalls}). */
export type NativeCalls = ReturnType<typeof makeNativeCalls>
