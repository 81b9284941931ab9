/**
 * Copy plans between a worker's paged KV blocks and one L1 object (DESIGN
 * §3.2). A worker layer is `[2, num_blocks, block_size, hidden]`; an L1
 * object is `[2, num_layers, chunk_size, hidden]`. Block `j` of a chunk
 * holds its tokens `j·block_size …`; for each layer and each of K and V it
 * is one contiguous run on both sides. Runs that continue each other on
 * both sides (consecutive block ids) are merged.
 */
import type { LayerPlacement, PagedKvGeometry } from "./KvCacheLayout.ts"

/**
 * Ranges `(segmentOffset, objectOffset, length)` in bytes, per segment name,
 * for one chunk whose blocks are `blockIds` (`chunkSizeTokens / block_size`
 * of them). The first `skipTokens` tokens of the chunk are left out.
 */
export const chunkRanges = (
  geometry: PagedKvGeometry,
  layers: ReadonlyArray<LayerPlacement>,
  chunkSizeTokens: number,
  blockIds: ReadonlyArray<number>,
  skipTokens = 0
): Map<string, Float64Array> => {
  const { numLayers, numBlocks, blockSizeTokens: bs } = geometry
  const tokenBytes = geometry.hiddenDim * geometry.elementBytes
  const runs = new Map<string, Array<number>>()
  for (let l = 0; l < numLayers; l++) {
    const layer = layers[l]!
    let list = runs.get(layer.shmName)
    if (list === undefined) {
      list = []
      runs.set(layer.shmName, list)
    }
    for (let kv = 0; kv < 2; kv++) {
      for (let j = 0; j < blockIds.length; j++) {
        const t0 = j * bs
        if (t0 + bs <= skipTokens) continue
        const s = Math.max(0, skipTokens - t0)
        const segmentOffset = layer.baseOffsetBytes + ((kv * numBlocks + blockIds[j]!) * bs + s) * tokenBytes
        const objectOffset = ((kv * numLayers + l) * chunkSizeTokens + t0 + s) * tokenBytes
        const length = (bs - s) * tokenBytes
        const n = list.length
        if (n >= 3 && list[n - 3]! + list[n - 1]! === segmentOffset && list[n - 2]! + list[n - 1]! === objectOffset) {
          list[n - 1] = list[n - 1]! + length
        } else {
          list.push(segmentOffset, objectOffset, length)
        }
      }
    }
  }
  const out = new Map<string, Float64Array>()
  for (const [name, list] of runs) out.set(name, Float64Array.from(list))
  return out
}
