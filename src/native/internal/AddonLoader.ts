/**
 * The C++ addon (`src/native/addon`) as JavaScript sees it: the types of its
 * exports ({@link NativeAddon} and what its calls take and return), where
 * the built addon is ({@link addonPath}) and loading it once per process
 * ({@link loadNativeAddon}). Raw: its calls throw and reject plain Errors
 * with a `code`; `src/native/Native.ts` wraps them as Effects with typed
 * failures (`AddonErrors.ts`).
 *
 * @internal
 */
import { existsSync } from "node:fs"
import { createRequire } from "node:module"
import path from "node:path"
import type { CudaBackendInfo } from "../Native.ts"

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
 * package, found from the package's root, so that it is the same file
 * whether this module runs from source (src/native/internal/AddonLoader.ts),
 * as the emitted JavaScript of the library build (dist/src/native/internal/)
 * or inside the bundled `mpcache serve` (build/cli/bin/main.mjs). The root is
 * where the package resolves its own `mpcache/package.json` (Node's
 * self-reference through the `exports` of package.json, which lists
 * "./package.json"). The addon is never copied into dist/: a consumer's
 * `npm install` builds it in place.
 */
export const addonPath: string = path.join(
  path.dirname(createRequire(import.meta.url).resolve("mpcache/package.json")),
  "src", "native", "addon", "build", "Release", "mpcache_native.node"
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
