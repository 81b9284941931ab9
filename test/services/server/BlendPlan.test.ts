/**
 * The computing half of CB_RETRIEVE_PRE_COMPUTED
 * (src/services/server/internal/BlendPlan.ts): the copy plan of checked
 * matches (V and unshifted K byte for byte from the cached object, shifted
 * K rotated into staging; runs continuing each other merged) and whether a
 * KV context can be re-rotated. The match rules themselves are tested in
 * Blend.test.ts ("planMatches").
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import type { LayerPlacement, PagedKvGeometry } from "../../../src/services/kv/KvCacheLayout.ts"
import { kvCompatibility, planCopies, type PlannedMatch } from "../../../src/services/server/internal/BlendPlan.ts"
import type { RotationSpec } from "../../../src/services/server/internal/Rope.ts"

const CHUNK = 32
/** One layer, 4 blocks of 16 tokens, one head of 2 float32 dims: 8 bytes a token. */
const geometry: PagedKvGeometry = {
  numLayers: 1,
  numBlocks: 4,
  blockSizeTokens: 16,
  numHeads: 1,
  headSize: 2,
  dtype: "float32",
  elementBytes: 4,
  hiddenDim: 2,
  blockBytes: 16 * 8
}
const layers: ReadonlyArray<LayerPlacement> = [{ shmName: "kv", segmentBytes: 2 * 4 * 16 * 8, baseOffsetBytes: 0 }]
const spec: RotationSpec = { dtype: "float32", numHeads: 1, headSize: 2, rotaryOffset: 0, rotaryDim: 2, isNeoxStyle: true }
const match = (over: Partial<PlannedMatch>): PlannedMatch => ({
  index: 0,
  hash: new Uint8Array(32),
  hashHex: "h",
  objectTokenOffset: 0,
  curSt: 0,
  numTokens: 16,
  delta: 0,
  ...over
})
/** A cached chunk object [2, 1 layer, 32 tokens, 2] float32: K token t = (t + 1, 0), V token t = (−t, t). */
const object = () => {
  const f = new Float32Array(2 * CHUNK * 2)
  for (let t = 0; t < CHUNK; t++) {
    f.set([t + 1, 0], 2 * t)
    f.set([-t, t], 2 * (CHUNK + t))
  }
  return new Uint8Array(f.buffer)
}

/** planCopies of `plan` over one cached object `bytes` (hash "h") and blocks `blockList`. */
const copiesOf = (plan: ReadonlyArray<PlannedMatch>, bytes: Uint8Array, blockList: ReadonlyArray<number>, rows = new Map<number, Float32Array>()) =>
  planCopies({ plan, objects: new Map([["h", { bytes }]]), rows, geometry, layers, spec, chunkSizeTokens: CHUNK, blockList })

describe("planCopies", () => {
  it.effect("an unshifted match: K and V byte for byte from the object, one range per block and K/V", () =>
    Effect.gen(function*() {
      const bytes = object()
      const jobs = yield* copiesOf([match({})], bytes, [2, 3])
      assert.strictEqual(jobs.length, 1)
      assert.strictEqual(jobs[0]!.segment, "kv")
      assert.strictEqual(jobs[0]!.src, bytes)
      // K: block 2 (segment byte 2·16·8 = 256) ← object byte 0; V: block 4 + 2 (768) ← object byte 32·8 = 256.
      assert.deepStrictEqual([...jobs[0]!.ranges], [256, 0, 128, 768, 256, 128])
    }))

  it.effect("runs continuing each other on both sides are merged (consecutive blocks)", () =>
    Effect.gen(function*() {
      const jobs = yield* copiesOf([match({ numTokens: 32 })], object(), [2, 3])
      assert.deepStrictEqual([...jobs[0]!.ranges], [256, 0, 256, 768, 256, 256])
    }))

  it.effect("a shifted match: K rotated by Δ into staging (row |Δ|), V from the object", () =>
    Effect.gen(function*() {
      const bytes = object()
      // Δ = 1 with cos = 0, sin = 1: (x₁, x₂) → (−x₂, x₁).
      const jobs = yield* copiesOf([match({ curSt: 1, numTokens: 1, delta: 1 })], bytes, [2], new Map([[1, Float32Array.from([0, 1])]]))
      assert.strictEqual(jobs.length, 2)
      const [k, v] = jobs[0]!.src === bytes ? [jobs[1]!, jobs[0]!] : [jobs[0]!, jobs[1]!]
      assert.notStrictEqual(k.src, bytes)
      assert.deepStrictEqual([...new Float32Array(k.src.buffer, k.src.byteOffset, 2)], [0, 1])
      // Position 1 in block 2: segment byte (2·16 + 1)·8 = 264; V at ((4 + 2)·16 + 1)·8 = 776 ← object byte 256.
      assert.deepStrictEqual([...k.ranges], [264, 0, 8])
      assert.deepStrictEqual([...v.ranges], [776, 256, 8])
    }))
})

describe("kvCompatibility", () => {
  it("needs the RoPE state's head size and a rotatable dtype", () => {
    assert.deepStrictEqual(kvCompatibility(2, geometry), { dtype: "float32" })
    assert.deepStrictEqual(kvCompatibility(4, geometry), {
      error: "head_size: 4 does not match the head size (2) of the instance's registered KV cache"
    })
    assert.deepStrictEqual(kvCompatibility(2, { ...geometry, dtype: "int8", elementBytes: 1 }), {
      error: "the instance's registered KV cache has dtype int8, which blend cannot re-rotate (float16, bfloat16 or float32)"
    })
  })
})
