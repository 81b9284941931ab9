/**
 * Worker side of `cuda_ipc` (DESIGN §3.2, §4): export this process's device
 * memory to the server. A buffer is allocated with cudaMalloc and named by its
 * cudaIpcGetMemHandle handle (both through the libcudart the addon dlopen's:
 * `MPCACHE_CUDART`, else the system's), and {@link cudaTensorDescriptor}
 * builds the TensorDescriptor a REGISTER_KV_CACHE sends for a view of it.
 *
 * {@link makeCudaPagedKvCache} is the CUDA twin of `makePagedKvCache`
 * (src/services/client/PagedKvCache.ts): the same `PagedKvCache` interface (so the
 * same WorkerAdapter registration and the same block reads and writes),
 * with the KV cache in device memory: one allocation holding every layer
 * (descriptors share one handle and differ in `storage_offset`) or one per
 * layer. Block reads and writes copy through host memory with
 * cudaMemcpyAsync + cudaStreamSynchronize, off the JS thread.
 *
 * The allocation belongs to the Scope it was made in: closing it waits for
 * copies in flight, then cudaFree. A process that dies without closing it
 * loses it with its CUDA context; the server's IPC mapping keeps the memory
 * alive until the server closes it (UNREGISTER or reap).
 */
import { Effect } from "effect"
import type { Scope } from "effect"
import { type Dtype, dtypeBytes } from "../../schema/Dtype.ts"
import type { TensorDescriptor } from "../../schema/TensorDescriptor.ts"
import { InvalidArgument } from "../../schema/WireError.ts"
import type { PagedKvCache, PagedKvCacheOptions } from "./PagedKvCache.ts"
import { CUDA_UNAVAILABLE, type CudaAllocation, NativeMemory, type NativeError } from "../../native/Native.ts"

/** The view of an allocation a descriptor describes (elements of `dtype`). */
export interface CudaTensorView {
  readonly dtype: Dtype
  readonly shape: ReadonlyArray<number>
  /** Strides in elements; default: contiguous. */
  readonly stride?: ReadonlyArray<number>
  /** Offset of element [0, …, 0] in elements; default 0. */
  readonly storageOffset?: number
}

const contiguousStrides = (shape: ReadonlyArray<number>): Array<number> => {
  const out = new Array<number>(shape.length)
  let step = 1
  for (let i = shape.length - 1; i >= 0; i--) {
    out[i] = step
    step *= shape[i]!
  }
  return out
}

/** The `cuda_ipc` TensorDescriptor of `view` inside `allocation` (nbytes: the whole allocation). */
export const cudaTensorDescriptor = (allocation: CudaAllocation, view: CudaTensorView): TensorDescriptor => ({
  kind: "cuda_ipc",
  ipc_handle: allocation.ipcHandle,
  device_uuid: allocation.deviceUuid,
  nbytes: allocation.sizeBytes,
  dtype: view.dtype,
  shape: [...view.shape],
  stride: [...(view.stride ?? contiguousStrides(view.shape))],
  storage_offset: view.storageOffset ?? 0
})

/**
 * The device to use: `deviceUuid` when given, else the first device. Fails
 * with InvalidArgument ("CUDA IPC backend not available on this host (…)")
 * when there is no backend.
 */
export const resolveCudaDevice = (deviceUuid?: string): Effect.Effect<string, InvalidArgument, NativeMemory> =>
  Effect.gen(function*() {
    const info = yield* (yield* NativeMemory).cudaBackend()
    if (!info.available) return yield* new InvalidArgument({ message: `${CUDA_UNAVAILABLE} (${info.reason})` })
    if (deviceUuid !== undefined) return deviceUuid
    return info.devices[0]!.uuid
  })

/**
 * Scoped: cudaMalloc of `nbytes` on `deviceUuid` (default: the first device)
 * and its IPC handle. Freed when the scope closes.
 */
export const exportCudaBuffer = (
  nbytes: number,
  deviceUuid?: string
): Effect.Effect<CudaAllocation, InvalidArgument | NativeError, NativeMemory | Scope.Scope> =>
  Effect.gen(function*() {
    const device = yield* resolveCudaDevice(deviceUuid)
    return yield* (yield* NativeMemory).allocateCuda(device, nbytes)
  })

export interface CudaPagedKvCacheOptions extends Omit<PagedKvCacheOptions, "namePrefix"> {
  /** The device (UUID); default: the first one. */
  readonly deviceUuid?: string
  /** "shared" (default): one allocation for every layer; "per-layer": one each. */
  readonly allocation?: "shared" | "per-layer"
}

/** A paged KV cache in device memory, with the allocations behind it. */
export interface CudaPagedKvCache extends PagedKvCache {
  readonly allocations: ReadonlyArray<CudaAllocation>
  readonly deviceUuid: string
}

/**
 * Scoped: allocates the KV cache on the device — per layer
 * `[2, num_blocks, block_size, num_heads, head_size]` — and builds the
 * cuda_ipc descriptors. Contents start uninitialised.
 */
export const makeCudaPagedKvCache = (
  options: CudaPagedKvCacheOptions
): Effect.Effect<CudaPagedKvCache, InvalidArgument | NativeError, NativeMemory | Scope.Scope> =>
  Effect.gen(function*() {
    const native = yield* NativeMemory
    const { numLayers, numBlocks, blockSizeTokens, numHeads, headSize, dtype } = options
    const deviceUuid = yield* resolveCudaDevice(options.deviceUuid)
    const elementBytes = dtypeBytes(dtype)
    const hiddenDim = numHeads * headSize
    const blockBytes = blockSizeTokens * hiddenDim * elementBytes
    const layerBytes = 2 * numBlocks * blockBytes
    const layerElements = layerBytes / elementBytes
    const shape = [2, numBlocks, blockSizeTokens, numHeads, headSize]
    const perLayer = options.allocation === "per-layer"
    const allocations: Array<CudaAllocation> = []
    if (perLayer) {
      for (let l = 0; l < numLayers; l++) allocations.push(yield* native.allocateCuda(deviceUuid, layerBytes))
    } else {
      allocations.push(yield* native.allocateCuda(deviceUuid, numLayers * layerBytes))
    }
    /** The allocation of `layer` and the byte offset of its element [0,0,0,0,0]. */
    const place = (layer: number) =>
      perLayer ? { allocation: allocations[layer]!, base: 0 } : { allocation: allocations[0]!, base: layer * layerBytes }
    const descriptors = Array.from({ length: numLayers }, (_, l) =>
      cudaTensorDescriptor(place(l).allocation, { dtype, shape, storageOffset: perLayer ? 0 : l * layerElements }))
    const range = (layer: number, kv: 0 | 1, blockId: number, count = 1) =>
      Float64Array.of(place(layer).base + (kv * numBlocks + blockId) * blockBytes, 0, count * blockBytes)
    return {
      geometry: { numLayers, numBlocks, blockSizeTokens, numHeads, headSize, dtype, elementBytes, hiddenDim, blockBytes },
      backing: "cuda_ipc",
      descriptors,
      memfds: [],
      segmentNames: allocations.map((a) => a.name),
      allocations,
      deviceUuid,
      writeBlock: (layer, kv, blockId, data) => native.scatter(place(layer).allocation, range(layer, kv, blockId), data),
      readBlock: (layer, kv, blockId) =>
        Effect.suspend(() => {
          const out = Buffer.alloc(blockBytes)
          return native.gather(place(layer).allocation, range(layer, kv, blockId), out).pipe(Effect.as(out))
        }),
      writeBlocks: (layer, kv, firstBlockId, data) =>
        native.scatter(place(layer).allocation, range(layer, kv, firstBlockId, Math.floor(data.length / blockBytes)), data),
      readBlocks: (layer, kv, firstBlockId, count) =>
        Effect.suspend(() => {
          const out = Buffer.alloc(count * blockBytes)
          return native.gather(place(layer).allocation, range(layer, kv, firstBlockId, count), out).pipe(Effect.as(out))
        })
    }
  })
