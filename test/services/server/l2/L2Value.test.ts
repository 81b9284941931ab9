/**
 * L2 keys and values (issue 15 item 3): the key form, the header, and every
 * corruption a read must refuse.
 */
import { assert, describe, it } from "@effect/vitest"
import { randomBytes } from "node:crypto"
import { createXXHash3 } from "hash-wasm"
import { decodeValue, encodeValue, frameValue, HEADER_BYTES, l2KeyOf, layoutFingerprint } from "../../../../src/services/server/l2/L2Value.ts"

const layout = { numLayers: 2, hiddenDim: 8, elementBytes: 2, dtype: "float16", chunkBytes: 2 * 2 * 256 * 8 * 2 }
const hash = Uint8Array.from({ length: 32 }, (_, i) => i)

describe("L2 keys", () => {
  it("prefix:v1:model~fingerprint@rank@hash[@salt]", () => {
    const fp = layoutFingerprint(layout, 256)
    assert.match(fp, /^[0-9a-f]{16}$/)
    const hex = Buffer.from(hash).toString("hex")
    assert.strictEqual(l2KeyOf("mpc", fp, { hash, modelName: "m", kvRank: 3, cacheSalt: "" }), `mpc:v1:m~${fp}@3@${hex}`)
    assert.strictEqual(l2KeyOf("mpc", fp, { hash, modelName: "m", kvRank: 0, cacheSalt: "t1" }), `mpc:v1:m~${fp}@0@${hex}@t1`)
  })
  it("another dtype, chunk size or shape is another fingerprint", () => {
    const fps = new Set([
      layoutFingerprint(layout, 256),
      layoutFingerprint({ ...layout, dtype: "bfloat16" }, 256),
      layoutFingerprint({ ...layout, chunkBytes: layout.chunkBytes / 2 }, 128),
      layoutFingerprint({ ...layout, numLayers: 4, chunkBytes: layout.chunkBytes * 2 }, 256),
      layoutFingerprint({ ...layout, hiddenDim: 16, chunkBytes: layout.chunkBytes * 2 }, 256)
    ])
    assert.strictEqual(fps.size, 5)
  })
})

describe("L2 values", () => {
  const fp = layoutFingerprint(layout, 256)
  const payload = Uint8Array.from({ length: 4096 }, (_, i) => (i * 7) & 255)
  const value = encodeValue(fp, payload)

  it("framed in an object's headroom: the same value as a view of the extent, the payload untouched", () => {
    const extent = Buffer.alloc(64 + 4096, 0xee)
    extent.set(payload, 64)
    const framed = frameValue(fp, extent, 4096)!
    assert.isTrue(framed.equals(value))
    assert.strictEqual(framed.byteOffset, extent.byteOffset + 32)
    assert.strictEqual(framed.buffer, extent.buffer)
    assert.isTrue(extent.subarray(0, 32).equals(Buffer.alloc(32, 0xee)))
    assert.strictEqual(frameValue(fp, extent.subarray(33), 4096), undefined)
    assert.strictEqual(frameValue(fp, extent.subarray(32), 4096)!.length, HEADER_BYTES + 4096)
  })

  it("the checksum is xxHash3-64 (seed 0), the same from the native hasher as from hash-wasm's, its fallback", async () => {
    const wasm = await createXXHash3()
    for (const n of [0, 1, 16, 17, 128, 129, 240, 241, 4096, 100_003, 2 ** 20 + 7]) {
      const bytes = randomBytes(n)
      wasm.init()
      wasm.update(bytes)
      assert.strictEqual(encodeValue(fp, bytes).toString("hex", 24, 32), wasm.digest("hex"), `${n} bytes`)
    }
  })

  it("round-trips: header then the bytes", () => {
    assert.strictEqual(value.length, HEADER_BYTES + 4096)
    assert.strictEqual(value.toString("latin1", 0, 4), "MPL2")
    const r = decodeValue(value, fp, 4096)
    assert.isTrue("payload" in r && Buffer.from(r.payload).equals(Buffer.from(payload)))
  })
  it("each mismatch names its reason", () => {
    const flip = (at: number) => {
      const v = Buffer.from(value)
      v[at] = v[at]! ^ 1
      return v
    }
    assert.deepStrictEqual(decodeValue(value.subarray(0, 31), fp, 4096), { corrupt: "short" })
    assert.deepStrictEqual(decodeValue(flip(0), fp, 4096), { corrupt: "magic" })
    assert.deepStrictEqual(decodeValue(flip(4), fp, 4096), { corrupt: "version" })
    assert.deepStrictEqual(decodeValue(value, layoutFingerprint({ ...layout, dtype: "bfloat16" }, 256), 4096), { corrupt: "fingerprint" })
    assert.deepStrictEqual(decodeValue(value, fp, 4095), { corrupt: "length" })
    assert.deepStrictEqual(decodeValue(value.subarray(0, value.length - 1), fp, 4096), { corrupt: "length" })
    assert.deepStrictEqual(decodeValue(flip(HEADER_BYTES + 100), fp, 4096), { corrupt: "checksum" })
  })
})
