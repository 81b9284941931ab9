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

/** Where the memory lives: POSIX shared memory, or a CUDA IPC allocation. */
export const TensorKind = Schema.Literals(["cpu_shm", "cuda_ipc"])
export type TensorKind = typeof TensorKind.Type

export const TensorDescriptor = Schema.Struct({
  kind: TensorKind,
  /** cpu_shm: the POSIX name without its leading slash (as listed in /dev/shm). */
  shm_name: Schema.optionalKey(WireString),
  /** cuda_ipc: the 64-byte cudaIpcMemHandle_t. */
  ipc_handle: Schema.optionalKey(Schema.Uint8Array),
  /** "cpu" for cpu_shm; the GPU's UUID for cuda_ipc. */
  device_uuid: WireString,
  /** Size of the whole segment in bytes. */
  nbytes: Uint,
  dtype: Dtype,
  shape: Schema.Array(Uint),
  /** Strides in elements. */
  stride: Schema.Array(Uint),
  /** Offset of element [0, …, 0] in elements from the segment start. */
  storage_offset: Uint
})
export type TensorDescriptor = typeof TensorDescriptor.Type
