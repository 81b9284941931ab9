/**
 * Deterministic KV bytes for tests: the content of token `t` of K or V of
 * `layer` depends on (seed, layer, kv, t), so any retrieved byte can be
 * checked against what the writer computed; an engine-driven chunk object's
 * on (seed, chunk index).
 */
import { Effect } from "effect"
import type { PagedKvCache } from "../../src/services/client/PagedKvCache.ts"

/** Bytes of tokens [t0, t0 + block_size) of one layer's K or V. */
export const blockContent = (cache: PagedKvCache, seed: number, layer: number, kv: 0 | 1, t0: number): Buffer => {
  const g = cache.geometry
  const tokenBytes = g.blockBytes / g.blockSizeTokens
  const out = Buffer.alloc(g.blockBytes)
  for (let t = 0; t < g.blockSizeTokens; t++) {
    let x = (seed * 2654435761 + layer * 40503 + kv * 7919 + (t0 + t) * 104729) >>> 0
    for (let b = 0; b < tokenBytes; b++) {
      x = (x * 1103515245 + 12345) >>> 0
      out[t * tokenBytes + b] = x >>> 24
    }
  }
  return out
}

/** Writes tokens [0, blockIds.length · block_size) into `blockIds`, every layer, K and V. */
export const writeTokens = (cache: PagedKvCache, seed: number, blockIds: ReadonlyArray<number>) =>
  Effect.forEach(blockIds, (blockId, j) =>
    Effect.forEach([0, 1] as const, (kv) =>
      Effect.forEach(
        Array.from({ length: cache.geometry.numLayers }, (_, l) => l),
        (l) => cache.writeBlock(l, kv, blockId, blockContent(cache, seed, l, kv, j * cache.geometry.blockSizeTokens)),
        { discard: true }
      ), { discard: true }), { discard: true })

/**
 * Compares `blockIds` with what `writeTokens(seed)` wrote for the same token
 * positions; returns the mismatching (block index, layer, kv) triples.
 */
export const verifyTokens = (cache: PagedKvCache, seed: number, blockIds: ReadonlyArray<number>, skipBlocks = 0) =>
  Effect.gen(function*() {
    const bad: Array<string> = []
    for (let j = skipBlocks; j < blockIds.length; j++) {
      for (const kv of [0, 1] as const) {
        for (let l = 0; l < cache.geometry.numLayers; l++) {
          const got = yield* cache.readBlock(l, kv, blockIds[j]!)
          if (!got.equals(blockContent(cache, seed, l, kv, j * cache.geometry.blockSizeTokens))) bad.push(`${j}/${l}/${kv}`)
        }
      }
    }
    return bad
  })

/**
 * Chunk c's L1 object (`bytes` long, any layout) as engine-driven worker `seed` computes it: the bytes an
 * engine-driven store sends and a retrieve must get back.
 */
export const chunkContent = (seed: number, c: number, bytes: number): Uint8Array => {
  const out = new Uint8Array(bytes)
  let x = (seed * 2654435761 + (c + 1) * 40503) >>> 0 || 1
  for (let i = 0; i < bytes; i++) {
    x ^= x << 13
    x ^= x >>> 17
    x ^= x << 5
    out[i] = x & 0xff
  }
  return out
}
