/**
 * Validation of REGISTER_KV_CACHE descriptors against the LMCache-driven KV
 * layout (DESIGN §3.2, §4): one descriptor per layer, each the contiguous
 * view `[2, num_blocks, block_size, num_heads, head_size]` (K and V on dim
 * 0) at `storage_offset` inside a POSIX shared-memory segment (`cpu_shm`) or
 * a CUDA allocation (`cuda_ipc`, named by its 64-byte IPC handle and device
 * UUID) of `nbytes`; every layer alike. A violation is an `invalid_argument`
 * naming the field. The segment's existence and real size are checked when
 * it is mapped.
 */
import { dtypeBytes, type Dtype } from "../../schema/Dtype.ts"
import { memfdSegmentKey, type TensorDescriptor } from "../../schema/TensorDescriptor.ts"

/** The paged KV geometry shared by every layer of one registration. */
export interface PagedKvGeometry {
  readonly numLayers: number
  readonly numBlocks: number
  /** Tokens per engine block. */
  readonly blockSizeTokens: number
  readonly numHeads: number
  readonly headSize: number
  readonly dtype: Dtype
  readonly elementBytes: number
  /** num_heads × head_size. */
  readonly hiddenDim: number
  /** Bytes of one block of one of K or V: block_size × hidden × element. */
  readonly blockBytes: number
}

/** Where one layer lives: its segment and the byte offset of its element [0,0,0,0,0]. */
export interface LayerPlacement {
  /** The segment's key: the shm name (cpu_shm), or {@link cudaSegmentKey} (cuda_ipc). */
  readonly shmName: string
  readonly segmentBytes: number
  readonly baseOffsetBytes: number
}

export interface ValidatedKvCaches {
  readonly geometry: PagedKvGeometry
  readonly layers: ReadonlyArray<LayerPlacement>
  /** Distinct segments (by key) and the size each claims. */
  readonly segments: ReadonlyMap<string, number>
  /** The cuda_ipc ones among `segments`, by key: what mapping them takes. */
  readonly cudaIpc: ReadonlyMap<string, { readonly ipcHandle: Uint8Array; readonly deviceUuid: string }>
  /** The cpu_memfd ones among `segments`, by key: the token (hex) and the index of the passed descriptor. */
  readonly memfd: ReadonlyMap<string, { readonly tokenHex: string; readonly index: number; readonly field: string }>
}

/** Whether this host can map cuda_ipc descriptors, and why not. */
export interface CudaIpcSupport {
  readonly available: boolean
  readonly reason: string
}

/** `cuda:<device_uuid>:<hex of the 64-byte handle>`: descriptors sharing one handle share one segment. */
export const cudaSegmentKey = (deviceUuid: string, ipcHandle: Uint8Array): string =>
  `cuda:${deviceUuid}:${Buffer.from(ipcHandle.buffer, ipcHandle.byteOffset, ipcHandle.byteLength).toString("hex")}`

const fmt = (a: ReadonlyArray<number>) => `[${a.join(", ")}]`
/** Equal int lists, compared without building strings (a check that runs per layer). */
const sameInts = (a: ReadonlyArray<number>, b: ReadonlyArray<number>) => a.length === b.length && a.every((n, i) => n === b[i])

const NO_BYTES = new Uint8Array(0)

/**
 * The key of the segment descriptor `d` views, what the server maps once
 * however many descriptors share it (DESIGN §3.2): the shm name (cpu_shm),
 * {@link memfdSegmentKey} (cpu_memfd) or {@link cudaSegmentKey} (cuda_ipc).
 * A descriptor missing its naming field gets the key of an empty one;
 * {@link validateKvCaches} refuses it before anything is mapped.
 */
export const segmentKeyOf = (d: TensorDescriptor): string =>
  d.kind === "cuda_ipc"
    ? cudaSegmentKey(d.device_uuid, d.ipc_handle ?? NO_BYTES)
    : d.kind === "cpu_memfd"
    ? memfdSegmentKey(d.fd_token ?? NO_BYTES, d.fd_index ?? 0)
    : d.shm_name ?? ""

/** What a registration asks the server to map: its distinct segments and their bytes, host and device. */
export interface SegmentDemand {
  readonly segments: number
  /** Bytes of the cpu_shm and cpu_memfd segments (each segment's largest claimed `nbytes`). */
  readonly hostBytes: number
  /** Bytes of the cuda_ipc segments. */
  readonly deviceBytes: number
}

/**
 * The distinct segments `descriptors` name, counted before anything per
 * layer is built (issue 24 item 4): the walk stops at the `limit + 1`-th
 * distinct segment, so its cost is bounded by the limit whatever the
 * descriptors claim (`over`: more than `limit`; the figures then cover only
 * the first `limit + 1`). Several descriptors viewing one segment count once,
 * as they are mapped once.
 */
export const segmentDemand = (
  descriptors: ReadonlyArray<TensorDescriptor>,
  limit: number
): SegmentDemand & { readonly over: boolean } => {
  const bytes = new Map<string, { readonly host: boolean; nbytes: number }>()
  for (const d of descriptors) {
    const key = segmentKeyOf(d)
    const seen = bytes.get(key)
    if (seen !== undefined) {
      seen.nbytes = Math.max(seen.nbytes, d.nbytes)
      continue
    }
    bytes.set(key, { host: d.kind !== "cuda_ipc", nbytes: d.nbytes })
    if (bytes.size > limit) break
  }
  let hostBytes = 0
  let deviceBytes = 0
  for (const b of bytes.values()) {
    if (b.host) hostBytes += b.nbytes
    else deviceBytes += b.nbytes
  }
  return { segments: bytes.size, hostBytes, deviceBytes, over: bytes.size > limit }
}

/**
 * Checks `kvCaches` for a server whose chunk size is `chunkSizeTokens`.
 * Returns the geometry, or the message of the first violation (it names
 * the field: `kv_caches[i].stride`, …).
 */
export const validateKvCaches = (
  kvCaches: ReadonlyArray<TensorDescriptor>,
  chunkSizeTokens: number,
  cuda: CudaIpcSupport = { available: false, reason: "" }
): ValidatedKvCaches | { readonly error: string } => {
  if (kvCaches.length === 0) return { error: "kv_caches: expected one descriptor per layer, got none" }
  const first = kvCaches[0]!
  const layers: Array<LayerPlacement> = []
  const segments = new Map<string, number>()
  const cudaIpc = new Map<string, { readonly ipcHandle: Uint8Array; readonly deviceUuid: string }>()
  const memfd = new Map<string, { readonly tokenHex: string; readonly index: number; readonly field: string }>()
  for (let i = 0; i < kvCaches.length; i++) {
    const d = kvCaches[i]!
    const at = `kv_caches[${i}]`
    if (d.kind === "cuda_ipc") {
      if (!cuda.available) {
        return { error: `${at}.kind: cuda_ipc: CUDA IPC backend not available on this host${cuda.reason === "" ? "" : ` (${cuda.reason})`}` }
      }
      if (d.ipc_handle === undefined) return { error: `${at}.ipc_handle: required for a cuda_ipc descriptor (the 64-byte cudaIpcMemHandle_t)` }
      if (d.ipc_handle.length !== 64) return { error: `${at}.ipc_handle: expected the 64-byte cudaIpcMemHandle_t, got ${d.ipc_handle.length} bytes` }
      if (d.device_uuid.length === 0 || d.device_uuid === "cpu") {
        return { error: `${at}.device_uuid: expected the GPU's UUID ("GPU-…") for a cuda_ipc descriptor, got "${d.device_uuid}"` }
      }
    } else if (d.kind === "cpu_memfd") {
      if (d.fd_token === undefined || d.fd_token.length !== 16) {
        return { error: `${at}.fd_token: required for a cpu_memfd descriptor: the 16-byte token the descriptor socket answered (docs/memfd.md)` }
      }
      if (d.fd_index === undefined) return { error: `${at}.fd_index: required for a cpu_memfd descriptor: which passed descriptor (0-based) holds this layer` }
    } else {
      if (d.shm_name === undefined || d.shm_name.length === 0) return { error: `${at}.shm_name: required for a cpu_shm descriptor` }
      if (d.shm_name.includes("/")) return { error: `${at}.shm_name: expected a POSIX name without slashes (as listed in /dev/shm), got "${d.shm_name}"` }
    }
    const key = segmentKeyOf(d)
    if (d.kind === "cuda_ipc") cudaIpc.set(key, { ipcHandle: d.ipc_handle!, deviceUuid: d.device_uuid })
    else if (d.kind === "cpu_memfd") memfd.set(key, { tokenHex: Buffer.from(d.fd_token!).toString("hex"), index: d.fd_index!, field: at })
    if (d.shape.length !== 5 || d.shape[0] !== 2 || d.shape.some((n) => n < 1)) {
      return { error: `${at}.shape: expected [2, num_blocks, block_size, num_heads, head_size] with every size ≥ 1, got ${fmt(d.shape)}` }
    }
    if (i > 0 && !sameInts(d.shape, first.shape)) {
      return { error: `${at}.shape: every layer must have the same shape; layer 0 has ${fmt(first.shape)}, this one ${fmt(d.shape)}` }
    }
    if (d.dtype !== first.dtype) return { error: `${at}.dtype: every layer must have the same dtype; layer 0 is ${first.dtype}, this one ${d.dtype}` }
    const [, nb, bs, nh, hs] = d.shape as [number, number, number, number, number]
    const contiguous = [nb * bs * nh * hs, bs * nh * hs, nh * hs, hs, 1]
    if (!sameInts(d.stride, contiguous)) {
      return { error: `${at}.stride: expected the contiguous strides ${fmt(contiguous)} (elements), got ${fmt(d.stride)}` }
    }
    const elt = dtypeBytes(d.dtype)
    const extentBytes = (d.storage_offset + 2 * nb * bs * nh * hs) * elt
    if (extentBytes > d.nbytes) {
      return {
        error: `${at}.nbytes: the view ends at byte ${extentBytes} (storage_offset ${d.storage_offset} + ${2 * nb * bs * nh * hs} elements of ${elt} bytes) but the segment is ${d.nbytes} bytes`
      }
    }
    const claimed = segments.get(key)
    if (claimed !== undefined && claimed !== d.nbytes) {
      return { error: `${at}.nbytes: segment ${key} is claimed as ${claimed} bytes by another layer and ${d.nbytes} by this one` }
    }
    segments.set(key, d.nbytes)
    layers.push({ shmName: key, segmentBytes: d.nbytes, baseOffsetBytes: d.storage_offset * elt })
  }
  const [, numBlocks, blockSizeTokens, numHeads, headSize] = first.shape as [number, number, number, number, number]
  if (chunkSizeTokens % blockSizeTokens !== 0) {
    return { error: `kv_caches[0].shape[2]: the block size (${blockSizeTokens} tokens) must divide the server's chunk size (${chunkSizeTokens} tokens)` }
  }
  const elementBytes = dtypeBytes(first.dtype)
  return {
    geometry: {
      numLayers: kvCaches.length,
      numBlocks,
      blockSizeTokens,
      numHeads,
      headSize,
      dtype: first.dtype,
      elementBytes,
      hiddenDim: numHeads * headSize,
      blockBytes: blockSizeTokens * numHeads * headSize * elementBytes
    },
    layers,
    segments,
    cudaIpc,
    memfd
  }
}

/**
 * Same memory: equal descriptors in the same order (REGISTER of a held id is a no-op refresh only then,
 * DESIGN §5). A cpu_memfd descriptor's `fd_token` is a one-time ticket, not the memory's name (every
 * REGISTER brings a fresh one), so it is not compared here: the caller compares the passed descriptors'
 * identities (st_dev:st_ino) instead.
 */
export const sameDescriptors = (a: ReadonlyArray<TensorDescriptor>, b: ReadonlyArray<TensorDescriptor>): boolean =>
  a.length === b.length && a.every((d, i) => {
    const e = b[i]!
    return d.kind === e.kind && d.shm_name === e.shm_name && d.fd_index === e.fd_index &&
      (d.fd_token === undefined) === (e.fd_token === undefined) && d.device_uuid === e.device_uuid && d.nbytes === e.nbytes &&
      d.dtype === e.dtype && sameInts(d.shape, e.shape) && sameInts(d.stride, e.stride) &&
      d.storage_offset === e.storage_offset &&
      (d.ipc_handle === undefined ? e.ipc_handle === undefined : e.ipc_handle !== undefined && Buffer.from(d.ipc_handle).equals(Buffer.from(e.ipc_handle)))
  })
