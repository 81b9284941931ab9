/**
 * A worker's paged KV cache in host shared memory (client side, DESIGN §4):
 * one segment per layer, each `[2, num_blocks, block_size, num_heads,
 * head_size]` (K and V on dim 0), with the descriptors a REGISTER_KV_CACHE
 * sends, and block reads and writes for the engine's side of the copies.
 *
 * Two backings (issue 13): `cpu_memfd` (default) — one sealed memfd per
 * layer (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), handed to the server
 * over its descriptor socket at each REGISTER (MemfdHandOver.ts): nothing
 * is named in /dev/shm and the kernel frees the memory once the last
 * holder is gone; `cpu_shm` — a POSIX segment per layer named
 * `<namePrefix>-L<layer>`, for servers without a descriptor socket.
 *
 * Segments belong to whoever created them (DESIGN §5): the cache creates its
 * memory in the current Scope and unlinks (shm) or closes (memfd) it when
 * the scope closes; the server's mappings of it are the server's business.
 */
import { Effect, Scope } from "effect"
import { createMemfd, KV_SEALS } from "../../native/FdPassing.ts"
import { NativeMemory, type NativeError, type ShmMapping } from "../../native/Native.ts"
import { dtypeBytes, type Dtype } from "../../schema/Dtype.ts"
import type { TensorDescriptor } from "../../schema/TensorDescriptor.ts"
import type { InvalidArgument } from "../../schema/WireError.ts"
import type { PagedKvGeometry } from "../kv/KvCacheLayout.ts"

/** What a paged KV cache lives in: passed memfds (default) or named POSIX segments. */
export type KvBacking = "cpu_memfd" | "cpu_shm"

/** What a cache's memory is: a host backing, or CUDA allocations (CudaPagedKvCache.ts). */
export type KvCacheKind = KvBacking | "cuda_ipc"

export interface PagedKvCacheOptions {
  /**
   * Segment names are `<namePrefix>-L<layer>` (cpu_shm: in /dev/shm, make it unique per worker, e.g. include
   * the instance id; cpu_memfd: the memfd's name, shown in /proc/<pid>/maps).
   */
  readonly namePrefix: string
  /** Default `cpu_memfd`. */
  readonly backing?: KvBacking
  /** cpu_memfd: the F_SEAL_* bits added (FdPassing.ts), default KV_SEALS; 0 leaves the memfd unsealed. */
  readonly seals?: number
  readonly numLayers: number
  readonly numBlocks: number
  readonly blockSizeTokens: number
  readonly numHeads: number
  readonly headSize: number
  readonly dtype: Dtype
}

export interface PagedKvCache {
  readonly geometry: PagedKvGeometry
  readonly backing: KvCacheKind
  /**
   * One descriptor per layer, in layer order (REGISTER_KV_CACHE's kv_caches).
   * cpu_memfd: `fd_index` set, `fd_token` not: each REGISTER hands `memfds`
   * over and fills in the token (WorkerAdapter.registerPagedKvCache).
   */
  readonly descriptors: ReadonlyArray<TensorDescriptor>
  /** cpu_memfd: the descriptors, by `fd_index`; empty for cpu_shm. */
  readonly memfds: ReadonlyArray<number>
  readonly segmentNames: ReadonlyArray<string>
  /** Writes one block of K (kv 0) or V (kv 1) of `layer`: `geometry.blockBytes` bytes. */
  readonly writeBlock: (layer: number, kv: 0 | 1, blockId: number, data: Uint8Array) => Effect.Effect<void, InvalidArgument | NativeError>
  /** Reads one block of K or V of `layer`. */
  readonly readBlock: (layer: number, kv: 0 | 1, blockId: number) => Effect.Effect<Buffer, InvalidArgument | NativeError>
  /** Writes consecutive blocks `firstBlockId …` of K or V of `layer` from `data` (a whole number of blocks). */
  readonly writeBlocks: (layer: number, kv: 0 | 1, firstBlockId: number, data: Uint8Array) => Effect.Effect<void, InvalidArgument | NativeError>
  /** Reads `count` consecutive blocks `firstBlockId …` of K or V of `layer`. */
  readonly readBlocks: (layer: number, kv: 0 | 1, firstBlockId: number, count: number) => Effect.Effect<Buffer, InvalidArgument | NativeError>
}

/**
 * Creates and maps the segments in the current Scope (closing it unmaps and
 * unlinks or closes them). Fails with NativeError when a name is taken
 * (EEXIST, cpu_shm) or shared memory or descriptors are exhausted.
 */
export const makePagedKvCache = (
  options: PagedKvCacheOptions
): Effect.Effect<PagedKvCache, NativeError | InvalidArgument, NativeMemory | Scope.Scope> =>
  Effect.gen(function*() {
    const native = yield* NativeMemory
    const { numLayers, numBlocks, blockSizeTokens, numHeads, headSize, dtype } = options
    const elementBytes = dtypeBytes(dtype)
    const hiddenDim = numHeads * headSize
    const blockBytes = blockSizeTokens * hiddenDim * elementBytes
    const layerBytes = 2 * numBlocks * blockBytes
    const backing = options.backing ?? "cpu_memfd"
    const names: Array<string> = []
    const mappings: Array<ShmMapping> = []
    const memfds: Array<number> = []
    for (let l = 0; l < numLayers; l++) {
      const name = `${options.namePrefix}-L${l}`
      if (backing === "cpu_memfd") {
        const fd = yield* createMemfd(name, layerBytes, options.seals ?? KV_SEALS)
        mappings.push(yield* native.mapFd(fd, name, layerBytes))
        memfds.push(fd)
      } else {
        yield* Effect.acquireRelease(native.createSegment(name, layerBytes), () => Effect.ignore(native.unlinkSegment(name)))
        mappings.push(yield* native.map(name, layerBytes))
      }
      names.push(name)
    }
    const shape = [2, numBlocks, blockSizeTokens, numHeads, headSize]
    const stride = [numBlocks * blockSizeTokens * hiddenDim, blockSizeTokens * hiddenDim, hiddenDim, headSize, 1]
    const descriptors: Array<TensorDescriptor> = names.map((name, l) => ({
      ...(backing === "cpu_memfd" ? { kind: "cpu_memfd" as const, fd_index: l } : { kind: "cpu_shm" as const, shm_name: name }),
      device_uuid: "cpu",
      nbytes: layerBytes,
      dtype,
      shape,
      stride,
      storage_offset: 0
    }))
    const range = (kv: 0 | 1, blockId: number, count = 1) =>
      Float64Array.of((kv * numBlocks + blockId) * blockBytes, 0, count * blockBytes)
    return {
      geometry: { numLayers, numBlocks, blockSizeTokens, numHeads, headSize, dtype, elementBytes, hiddenDim, blockBytes },
      backing,
      descriptors,
      memfds,
      segmentNames: names,
      writeBlock: (layer, kv, blockId, data) => native.scatter(mappings[layer]!, range(kv, blockId), data),
      readBlock: (layer, kv, blockId) =>
        Effect.suspend(() => {
          const out = Buffer.alloc(blockBytes)
          return native.gather(mappings[layer]!, range(kv, blockId), out).pipe(Effect.as(out))
        }),
      writeBlocks: (layer, kv, firstBlockId, data) =>
        native.scatter(mappings[layer]!, range(kv, firstBlockId, Math.floor(data.length / blockBytes)), data),
      readBlocks: (layer, kv, firstBlockId, count) =>
        Effect.suspend(() => {
          const out = Buffer.alloc(count * blockBytes)
          return native.gather(mappings[layer]!, range(kv, firstBlockId, count), out).pipe(Effect.as(out))
        })
    }
  })
