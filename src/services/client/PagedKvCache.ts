/**
 * A worker's paged KV cache in POSIX shared memory (client side, DESIGN §4):
 * one segment per layer, each `[2, num_blocks, block_size, num_heads,
 * head_size]` (K and V on dim 0), with the descriptors a REGISTER_KV_CACHE
 * sends, and block reads and writes for the engine's side of the copies.
 *
 * Segments belong to whoever created them (DESIGN §5): the cache creates its
 * segments in the current Scope and unlinks them when it closes; the
 * server's mappings of them are the server's business.
 */
import { Effect, Scope } from "effect"
import { NativeMemory, type NativeError, type ShmMapping } from "../../native/Native.ts"
import { dtypeBytes, type Dtype } from "../../schema/Dtype.ts"
import type { TensorDescriptor } from "../../schema/TensorDescriptor.ts"
import type { InvalidArgument } from "../../schema/WireError.ts"
import type { PagedKvGeometry } from "../kv/KvCacheLayout.ts"

export interface PagedKvCacheOptions {
  /** Segment names are `<namePrefix>-L<layer>`; make it unique per worker (e.g. include the instance id). */
  readonly namePrefix: string
  readonly numLayers: number
  readonly numBlocks: number
  readonly blockSizeTokens: number
  readonly numHeads: number
  readonly headSize: number
  readonly dtype: Dtype
}

export interface PagedKvCache {
  readonly geometry: PagedKvGeometry
  /** One descriptor per layer, in layer order (REGISTER_KV_CACHE's kv_caches). */
  readonly descriptors: ReadonlyArray<TensorDescriptor>
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
 * unlinks them). Fails with NativeError when a name is taken (EEXIST) or
 * shared memory is exhausted.
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
    const names: Array<string> = []
    const mappings: Array<ShmMapping> = []
    for (let l = 0; l < numLayers; l++) {
      const name = `${options.namePrefix}-L${l}`
      yield* Effect.acquireRelease(native.createSegment(name, layerBytes), () => Effect.ignore(native.unlinkSegment(name)))
      mappings.push(yield* native.map(name, layerBytes))
      names.push(name)
    }
    const shape = [2, numBlocks, blockSizeTokens, numHeads, headSize]
    const stride = [numBlocks * blockSizeTokens * hiddenDim, blockSizeTokens * hiddenDim, hiddenDim, headSize, 1]
    const descriptors: Array<TensorDescriptor> = names.map((name) => ({
      kind: "cpu_shm",
      shm_name: name,
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
      descriptors,
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
