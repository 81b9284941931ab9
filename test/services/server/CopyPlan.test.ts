/** Copy plans (DESIGN §3.2): every byte of a chunk goes to the right place, whatever the merging does. */
import { assert, describe, it } from "@effect/vitest"
import fc from "fast-check"
import { chunkRanges, segmentPlan } from "../../../src/services/server/internal/CopyPlan.ts"
import type { LayerPlacement, PagedKvGeometry } from "../../../src/services/kv/KvCacheLayout.ts"

const geometry = (numLayers: number, numBlocks: number, blockSizeTokens: number): PagedKvGeometry => ({
  numLayers,
  numBlocks,
  blockSizeTokens,
  numHeads: 1,
  headSize: 2,
  dtype: "float16",
  elementBytes: 2,
  hiddenDim: 2,
  blockBytes: blockSizeTokens * 4
})

/** segment name → (segment byte → object byte), from the ranges of each of `names`. */
const byteMap = (names: ReadonlyArray<string>, ranges: ReadonlyArray<Float64Array>): Map<string, Map<number, number>> => {
  assert.strictEqual(ranges.length, names.length)
  const out = new Map<string, Map<number, number>>()
  for (const [i, r] of ranges.entries()) {
    const name = names[i]!
    const m = out.get(name) ?? new Map<number, number>()
    out.set(name, m)
    for (let i = 0; i < r.length; i += 3) {
      for (let b = 0; b < r[i + 2]!; b++) {
        assert.isFalse(m.has(r[i]! + b), `segment byte ${r[i]! + b} of ${name} copied twice`)
        m.set(r[i]! + b, r[i + 1]! + b)
      }
    }
  }
  return out
}

/** The rule of DESIGN §3.2 byte by byte: layer l, K/V, block j of the chunk, token t, byte b. */
const expected = (
  g: PagedKvGeometry,
  layers: ReadonlyArray<LayerPlacement>,
  chunk: number,
  blockIds: ReadonlyArray<number>,
  skip: number
): Map<string, Map<number, number>> => {
  const tokenBytes = g.hiddenDim * g.elementBytes
  const out = new Map<string, Map<number, number>>()
  for (let l = 0; l < g.numLayers; l++) {
    const layer = layers[l]!
    const m = out.get(layer.shmName) ?? new Map<number, number>()
    out.set(layer.shmName, m)
    for (let kv = 0; kv < 2; kv++) {
      for (let j = 0; j < blockIds.length; j++) {
        for (let t = 0; t < g.blockSizeTokens; t++) {
          if (j * g.blockSizeTokens + t < skip) continue
          for (let b = 0; b < tokenBytes; b++) {
            const segment = layer.baseOffsetBytes + ((kv * g.numBlocks + blockIds[j]!) * g.blockSizeTokens + t) * tokenBytes + b
            const object = ((kv * g.numLayers + l) * chunk + j * g.blockSizeTokens + t) * tokenBytes + b
            m.set(segment, object)
          }
        }
      }
    }
  }
  return out
}

describe("segmentPlan", () => {
  it("lists each segment once, in first-use order, with each layer's index and each segment's layer count", () => {
    const plan = segmentPlan(["b", "a", "b", "c", "a", "b"].map((shmName) => ({ shmName, segmentBytes: 0, baseOffsetBytes: 0 })))
    assert.deepStrictEqual(plan.names, ["b", "a", "c"])
    assert.deepStrictEqual([...plan.segmentOf], [0, 1, 0, 2, 1, 0])
    assert.deepStrictEqual([...plan.layersIn], [3, 2, 1])
  })
})

describe("chunkRanges", () => {
  it("merges consecutive blocks and leaves the rest as one range per block", () => {
    const g = geometry(1, 8, 2)
    const ranges = chunkRanges(g, [{ shmName: "a", segmentBytes: 0, baseOffsetBytes: 0 }], 6, [3, 4, 7])
    // K: blocks 3 and 4 are one run (16 bytes), block 7 another; then the same for V (numBlocks 8 further).
    assert.deepStrictEqual(ranges.map((r) => [...r]), [[24, 0, 16, 56, 16, 8, 88, 24, 16, 120, 40, 8]])
  })

  it("every byte lands where DESIGN §3.2 says, for any layout, blocks and skip", () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 1, max: 4 }),
        fc.integer({ min: 1, max: 3 }),
        fc.integer({ min: 1, max: 3 }),
        fc.uniqueArray(fc.integer({ min: 0, max: 9 }), { minLength: 1, maxLength: 4 }),
        fc.integer({ min: 0, max: 12 }),
        fc.integer({ min: 0, max: 2 }),
        (numLayers, blockSizeTokens, segments, blockIds, skipRaw, base) => {
          const g = geometry(numLayers, 10, blockSizeTokens)
          const chunk = blockIds.length * blockSizeTokens
          const skip = skipRaw % (chunk + 1)
          const layers = Array.from({ length: numLayers }, (_, l) => ({
            shmName: `s${l % segments}`,
            segmentBytes: 0,
            baseOffsetBytes: Math.floor(l / segments) * 2 * 10 * g.blockBytes + base
          }))
          const plan = segmentPlan(layers)
          assert.deepStrictEqual(
            byteMap(plan.names, chunkRanges(g, layers, chunk, blockIds, skip, plan)),
            expected(g, layers, chunk, blockIds, skip)
          )
        }
      ),
      { numRuns: 300, seed: 11 }
    )
  })
})
