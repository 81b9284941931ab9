/**
 * The model geometry of the transfer benches (bench:transfer, bench:l2):
 * 256-token chunks of a 32-layer, 8 heads × 128 head size, float16 model,
 * one kv rank, 16-token engine blocks; one chunk = 2 × 32 × 256 × 1024 × 2 B
 * = 32 MiB. And the worker side they share: a paged KV cache in POSIX shm
 * filled once with distinct non-zero bytes, and the cleanup step that
 * unlinks its segments.
 */
import { randomBytes } from "node:crypto"
import { existsSync, rmSync } from "node:fs"
import { Effect, type Scope } from "effect"
import { loadNativeAddon, type NativeError, type NativeMemory } from "../../src/native/Native.ts"
import type { InvalidArgument } from "../../src/schema/WireError.ts"
import type { ZmqSockets } from "../../src/services/zmq/Sockets.ts"
import { makePagedKvCache, type PagedKvCache, type PagedKvCacheOptions } from "../../src/services/client/PagedKvCache.ts"

export const NUM_LAYERS = 32
export const NUM_HEADS = 8
export const HEAD_SIZE = 128
export const DTYPE = "float16" as const
export const ELEMENT_BYTES = 2
export const BLOCK_TOKENS = 16
export const CHUNK_TOKENS = 256
/** One block of K (or V) of one layer: 32 KiB. */
export const BLOCK_BYTES = BLOCK_TOKENS * NUM_HEADS * HEAD_SIZE * ELEMENT_BYTES
/** One chunk of one rank, `[2, layers, chunk, heads × head size]`: 32 MiB. */
export const CHUNK_BYTES = 2 * NUM_LAYERS * CHUNK_TOKENS * NUM_HEADS * HEAD_SIZE * ELEMENT_BYTES
export const BLOCKS_PER_CHUNK = CHUNK_TOKENS / BLOCK_TOKENS
/** One layer's segment (K and V) of a cache of `numBlocks` blocks, bytes. */
export const layerBytes = (numBlocks: number): number => 2 * numBlocks * BLOCK_BYTES

/** The segments `makeFilledCache(namePrefix, …)` creates: `<namePrefix>-L<layer>`. */
export const segmentNamesOf = (namePrefix: string): Array<string> => Array.from({ length: NUM_LAYERS }, (_, l) => `${namePrefix}-L${l}`)

/** Unlinks whichever of `names` still exist in /dev/shm (a bench's cleanup step: synchronous, safe on `exit`). */
export const unlinkSegments = (names: ReadonlyArray<string>): void => {
  for (const name of names) {
    if (!existsSync(`/dev/shm/${name}`)) continue
    try {
      loadNativeAddon().shmUnlink(name)
    } catch {
      rmSync(`/dev/shm/${name}`, { force: true })
    }
  }
}

/** What a bench's cache maker may need: the native memory, sockets (a memfd cache hands its descriptors over) and its scope. */
export type CacheMakerContext = NativeMemory | ZmqSockets | Scope.Scope

/**
 * A PagedKvCache of `numBlocks` blocks (made by `make`, POSIX shm by default), every layer filled once with non-zero bytes: a
 * random pattern of odd length, repeated, so that no two blocks hold the same bytes. Lives with the scope.
 */
export const makeFilledCache = (
  namePrefix: string,
  numBlocks: number,
  make: (options: PagedKvCacheOptions) => Effect.Effect<PagedKvCache, NativeError | InvalidArgument, CacheMakerContext> = (o) => makePagedKvCache({ ...o, backing: "cpu_shm" })
): Effect.Effect<PagedKvCache, NativeError | InvalidArgument, CacheMakerContext> =>
  Effect.gen(function*() {
    const cache = yield* make({
      namePrefix,
      numLayers: NUM_LAYERS,
      numBlocks,
      blockSizeTokens: BLOCK_TOKENS,
      numHeads: NUM_HEADS,
      headSize: HEAD_SIZE,
      dtype: DTYPE
    })
    // Every layer's K and V filled once with non-zero bytes: a random pattern of odd length, repeated, so
    // that no two blocks hold the same bytes. Through the cache's own writes, so any backing fills the same way.
    const data = Buffer.allocUnsafe(layerBytes(numBlocks) / 2)
    for (let layer = 0; layer < NUM_LAYERS; layer++) {
      for (const kv of [0, 1] as const) {
        data.fill(randomBytes(4099).map((b) => b | 1))
        yield* cache.writeBlocks(layer, kv, 0, data)
      }
    }
    return cache
  })
