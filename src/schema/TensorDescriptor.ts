/**
 * TensorDescriptor (DESIGN §3.2): replaces upstream's pickled torch IPC
 * wrapper (`CudaIPCWrapper` / `CpuShmTensorWrapper`, msgpack Ext 1) with a
 * plain map any language can build. `nbytes` is the size of the whole
 * segment; the tensor is the view `(storage_offset, shape, stride)` inside
 * it, in elements of `dtype`.
 */
import { Schema } from "effect"
import { WireString } from "./Text.ts"
import { Dtype } from "./Dtype.ts"
import { Uint } from "./Integer.ts"
import { atMostLength, MAX_DEVICE_UUID_LENGTH, MAX_SHM_NAME_LENGTH, MAX_TENSOR_DIMS } from "./Limits.ts"

/** `shape` / `stride`: at most `MAX_TENSOR_DIMS` dimensions (issue 24 item 5). */
const Dims = Schema.Array(Uint).check(atMostLength(MAX_TENSOR_DIMS, "dimensions (MAX_TENSOR_DIMS)"))

/**
 * Where the memory lives: POSIX shared memory named in /dev/shm (`cpu_shm`),
 * a memfd whose descriptor the worker passed over the descriptor socket
 * (`cpu_memfd`, issue 13 item 2, docs/memfd.md), or a CUDA IPC allocation.
 */
export const TensorKind = Schema.Literals(["cpu_shm", "cpu_memfd", "cuda_ipc"])
export type TensorKind = typeof TensorKind.Type

export const TensorDescriptor = Schema.Struct({
  kind: TensorKind,
  /** cpu_shm: the POSIX name without its leading slash (as listed in /dev/shm). */
  shm_name: Schema.optionalKey(WireString.check(atMostLength(MAX_SHM_NAME_LENGTH, "characters (NAME_MAX)"))),
  /** cpu_memfd: the 16-byte one-time token the descriptor socket answered for the passed descriptors. */
  fd_token: Schema.optionalKey(Schema.Uint8Array),
  /** cpu_memfd: which of that request's descriptors holds this tensor (0-based, in the order passed). */
  fd_index: Schema.optionalKey(Uint),
  /** cuda_ipc: the 64-byte cudaIpcMemHandle_t. */
  ipc_handle: Schema.optionalKey(Schema.Uint8Array),
  /** "cpu" for cpu_shm and cpu_memfd; the GPU's UUID for cuda_ipc. */
  device_uuid: WireString.check(atMostLength(MAX_DEVICE_UUID_LENGTH, "characters (MAX_DEVICE_UUID_LENGTH)")),
  /** Size of the whole segment in bytes. */
  nbytes: Uint,
  dtype: Dtype,
  shape: Dims,
  /** Strides in elements. */
  stride: Dims,
  /** Offset of element [0, …, 0] in elements from the segment start. */
  storage_offset: Uint
})
export type TensorDescriptor = typeof TensorDescriptor.Type

/**
 * The segment key of a cpu_memfd descriptor: `memfd:<hex of the token>:<fd_index>`
 * (descriptors naming one passed descriptor share one mapping). Also the
 * mapping's name in errors and fault reports.
 */
export const memfdSegmentKey = (token: Uint8Array, index: number): string =>
  `memfd:${Buffer.from(token.buffer, token.byteOffset, token.byteLength).toString("hex")}:${index}`
