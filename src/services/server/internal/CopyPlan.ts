/**
 * Copy plans between a worker's paged KV blocks and one L1 object (DESIGN
 * §3.2). A worker layer is `[2, num_blocks, block_size, hidden]`; an L1
 * object is `[2, num_layers, chunk_size, hidden]`. Block `j` of a chunk
 * holds its tokens `j·block_size …`; for each layer and each of K and V it
 * is one contiguous run on both sides. Runs that continue each other on
 * both sides (consecutive block ids) are merged.
 */
import type { LayerPlacement, PagedKvGeometry } from "../../kv/KvCacheLayout.ts"

/**
 * Ranges `(segmentOffset, objectOffset, length)` in bytes, per segment name,
 * for one chunk whose blocks are `blockIds` (`chunkSizeTokens / block_size`
 * of them). The first `skipTokens` tokens of the chunk are left out.
 *
 * Every segment's ranges are a view of one Float64Array allocated per call
 * (this runs for every chunk of every transfer: no growing arrays, no copies).
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
  // At most one range per block, K and V, per layer: each segment gets room for its layers' share.
  const perLayer = 2 * blockIds.length * 3
  const layersOf = new Map<string, number>()
  for (let l = 0; l < numLayers; l++) layersOf.set(layers[l]!.shmName, (layersOf.get(layers[l]!.shmName) ?? 0) + 1)
  const start = new Map<string, number>()
  let capacity = 0
  for (const [name, count] of layersOf) {
    start.set(name, capacity)
    capacity += count * perLayer
  }
  const all = new Float64Array(capacity)
  const end = new Map(start)
  for (let l = 0; l < numLayers; l++) {
    const layer = layers[l]!
    const first = start.get(layer.shmName)!
    let n = end.get(layer.shmName)!
    for (let kv = 0; kv < 2; kv++) {
      for (let j = 0; j < blockIds.length; j++) {
        const t0 = j * bs
        if (t0 + bs <= skipTokens) continue
        const s = Math.max(0, skipTokens - t0)
        const segmentOffset = layer.baseOffsetBytes + ((kv * numBlocks + blockIds[j]!) * bs + s) * tokenBytes
        const objectOffset = ((kv * numLayers + l) * chunkSizeTokens + t0 + s) * tokenBytes
        const length = (bs - s) * tokenBytes
        // Runs that continue each other on both sides (consecutive block ids) are merged.
        if (n - first >= 3 && all[n - 3]! + all[n - 1]! === segmentOffset && all[n - 2]! + all[n - 1]! === objectOffset) {
          all[n - 1] = all[n - 1]! + length
        } else {
          all[n] = segmentOffset
          all[n + 1] = objectOffset
          all[n + 2] = length
          n += 3
        }
      }
    }
    end.set(layer.shmName, n)
  }
  const out = new Map<string, Float64Array>()
  for (const [name, first] of start) out.set(name, all.subarray(first, end.get(name)!))
  return out
}
