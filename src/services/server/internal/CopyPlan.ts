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
 * The segments a context's layers live in, in first-use order, and each
 * layer's index among them. Fixed for a registration, so it is computed
 * once per context, not per chunk (issue 16: the per-chunk maps of names
 * were a quarter of what a STORE allocated).
 */
export interface SegmentPlan {
  /** Segment names, each once, in the order of the layers that first use them. */
  readonly names: ReadonlyArray<string>
  /** Layer `l`'s segment: `names[segmentOf[l]]`. */
  readonly segmentOf: Int32Array
  /** How many layers each segment holds, by index into `names`. */
  readonly layersIn: Int32Array
}

/** The {@link SegmentPlan} of `layers` (one entry per layer, as `ContextEntry.layers`). */
export const segmentPlan = (layers: ReadonlyArray<LayerPlacement>): SegmentPlan => {
  const index = new Map<string, number>()
  const segmentOf = new Int32Array(layers.length)
  const counts: Array<number> = []
  for (let l = 0; l < layers.length; l++) {
    const name = layers[l]!.shmName
    let i = index.get(name)
    if (i === undefined) {
      i = index.size
      index.set(name, i)
      counts.push(0)
    }
    segmentOf[l] = i
    counts[i]!++
  }
  return { names: [...index.keys()], segmentOf, layersIn: Int32Array.from(counts) }
}

/**
 * Ranges `(segmentOffset, objectOffset, length)` in bytes, one Float64Array
 * per segment of `plan` (the i-th for `plan.names[i]`), for one chunk whose
 * blocks are `blockIds` (`chunkSizeTokens / block_size` of them). The first
 * `skipTokens` tokens of the chunk are left out.
 *
 * Every segment's ranges are a view of one Float64Array allocated per call
 * (this runs for every chunk of every transfer: no maps, no growing arrays).
 */
export const chunkRanges = (
  geometry: PagedKvGeometry,
  layers: ReadonlyArray<LayerPlacement>,
  chunkSizeTokens: number,
  blockIds: ReadonlyArray<number>,
  skipTokens = 0,
  plan: SegmentPlan = segmentPlan(layers)
): Array<Float64Array> => {
  const { numLayers, numBlocks, blockSizeTokens: bs } = geometry
  const tokenBytes = geometry.hiddenDim * geometry.elementBytes
  const segments = plan.names.length
  // At most one range per block, K and V, per layer: each segment gets room for its layers' share.
  const perLayer = 2 * blockIds.length * 3
  const start = new Int32Array(segments)
  const end = new Int32Array(segments)
  let capacity = 0
  for (let s = 0; s < segments; s++) {
    start[s] = capacity
    end[s] = capacity
    capacity += plan.layersIn[s]! * perLayer
  }
  const all = new Float64Array(capacity)
  for (let l = 0; l < numLayers; l++) {
    const base = layers[l]!.baseOffsetBytes
    const seg = plan.segmentOf[l]!
    const first = start[seg]!
    let n = end[seg]!
    for (let kv = 0; kv < 2; kv++) {
      for (let j = 0; j < blockIds.length; j++) {
        const t0 = j * bs
        if (t0 + bs <= skipTokens) continue
        const s = Math.max(0, skipTokens - t0)
        const segmentOffset = base + ((kv * numBlocks + blockIds[j]!) * bs + s) * tokenBytes
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
    end[seg] = n
  }
  const out: Array<Float64Array> = new Array(segments)
  for (let s = 0; s < segments; s++) out[s] = all.subarray(start[s]!, end[s]!)
  return out
}
