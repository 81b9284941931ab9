/**
 * RoPE re-rotation (src/services/server/internal/Rope.ts): float16/bfloat16 conversion
 * against independent codecs, the rotation kernel against a direct float64
 * reference (within 1 ulp of the data type) for both styles, both half
 * types, and shifts positive, negative, zero and large, and the
 * CB_REGISTER_ROPE validation rules.
 */
import { assert, describe, it } from "@effect/vitest"
import type { TensorDescriptor } from "../../../src/schema/TensorDescriptor.ts"
import {
  bf16ToF32,
  f16ToF32,
  f32Bits,
  f32FromBits,
  f32ToBf16,
  f32ToF16,
  rotateTokens,
  shiftCosSin,
  validateRope,
  type RotationSpec
} from "../../../src/services/server/internal/Rope.ts"
import {
  encodeAll,
  f16round,
  gaussian,
  refBf16Decode,
  refBf16Encode,
  refBf16Round,
  refF16Decode,
  referenceRotate,
  tableRow,
  type TestDtype,
  worstUlp
} from "../../support/RopeReference.ts"

const same = (a: number, b: number) => Object.is(a, b) || (Number.isNaN(a) && Number.isNaN(b))

/** Float32 values of every binade a half type can meet: random bit patterns plus the edges. */
const float32Samples = (): Array<number> => {
  const out: Array<number> = []
  let s = 12345
  for (let i = 0; i < 200_000; i++) {
    s = (s * 1103515245 + 12345) >>> 0
    const t = (s * 1103515245 + 12345) >>> 0
    // Exponents concentrated on the half range (2^-30 … 2^17), the sign and mantissa random.
    const exponent = 127 - 30 + (t % 48)
    out.push(f32FromBits(((s & 1) << 31) | (exponent << 23) | (t >>> 9)))
  }
  for (let i = 0; i < 2000; i++) out.push(f32FromBits(Math.floor(Math.random() * 2 ** 32)))
  out.push(
    0, -0, Infinity, -Infinity, NaN, 65504, 65505, 65519, 65519.99609375, 65520, 65536, 1e9, -65520,
    2 ** -14, 2 ** -24, 2 ** -25, 3 * 2 ** -26, 2 ** -25 + 2 ** -40, 1.5 * 2 ** -24, 2.5 * 2 ** -24, 2 ** -14 - 2 ** -25,
    1 + 2 ** -11, 1 + 3 * 2 ** -11, 2049, 2051, f32FromBits(1), f32FromBits(0x007fffff), f32FromBits(0x7f7fffff),
    f32FromBits(0x7f7f8000), f32FromBits(0x3f808000), f32FromBits(0x3f818000), 2 ** -126, 2 ** -133, 2 ** -134, 3 * 2 ** -135
  )
  return out
}

describe("float16 and bfloat16 conversion", () => {
  it("every float16 bit pattern decodes like V8's Float16Array and round-trips (NaN → 0x7e00)", () => {
    for (let b = 0; b < 65536; b++) {
      const x = f16ToF32(b)
      assert.isTrue(same(x, refF16Decode(b)), `bits ${b.toString(16)}`)
      const back = f32ToF16(x)
      if (Number.isNaN(x)) assert.strictEqual(back, 0x7e00)
      else assert.strictEqual(back, b, `bits ${b.toString(16)}`)
    }
  })

  it("float32 → float16 rounds to nearest even like IEEE (subnormals, ties, overflow to inf, signed zero)", () => {
    for (const x of float32Samples()) {
      const got = f16ToF32(f32ToF16(x))
      assert.isTrue(same(got, f16round(x)), `x = ${x} (bits ${f32Bits(x).toString(16)}): got ${got}, expected ${f16round(x)}`)
    }
    assert.strictEqual(f32ToF16(65520), 0x7c00)
    assert.strictEqual(f32ToF16(65519.99609375), 0x7bff)
    assert.strictEqual(f32ToF16(2 ** -25), 0)
    assert.strictEqual(f32ToF16(-(2 ** -25)), 0x8000)
    assert.strictEqual(f32ToF16(3 * 2 ** -26), 1)
    assert.strictEqual(f32ToF16(2049), f32ToF16(2048))
    assert.strictEqual(f32ToF16(NaN), 0x7e00)
  })

  it("every bfloat16 bit pattern decodes as the top half of a float32 and round-trips (NaN → 0x7fc0)", () => {
    for (let b = 0; b < 65536; b++) {
      const x = bf16ToF32(b)
      assert.isTrue(same(x, refBf16Decode(b)))
      const back = f32ToBf16(x)
      if (Number.isNaN(x)) assert.strictEqual(back, 0x7fc0)
      else assert.strictEqual(back, b)
    }
  })

  it("float32 → bfloat16 rounds to nearest even (subnormals, ties, overflow to inf)", () => {
    for (const x of float32Samples()) {
      const got = bf16ToF32(f32ToBf16(x))
      assert.isTrue(same(got, refBf16Round(x)), `x = ${x} (bits ${f32Bits(x).toString(16)}): got ${got}, expected ${refBf16Round(x)}`)
    }
    assert.strictEqual(f32ToBf16(f32FromBits(0x3f808000)), 0x3f80) // tie, even stays
    assert.strictEqual(f32ToBf16(f32FromBits(0x3f818000)), 0x3f82) // tie, odd rounds up
    assert.strictEqual(f32ToBf16(f32FromBits(0x7f7f8000)), 0x7f80) // rounds up to inf
    assert.strictEqual(f32ToBf16(-Infinity), 0xff80)
    assert.strictEqual(refBf16Encode(1), 0x3f80)
  })
})

describe("re-rotation", () => {
  const numHeads = 3
  const tokens = 24

  const check = (dtype: TestDtype, isNeoxStyle: boolean, delta: number, headSize = 32, rotaryOffset = 0, rotaryDim = headSize) => {
    const spec: RotationSpec = { dtype, numHeads, headSize, rotaryOffset, rotaryDim, isNeoxStyle }
    const next = gaussian(1000 + delta * 7 + headSize + (isNeoxStyle ? 1 : 0), 4)
    const k = encodeAll(dtype, Array.from({ length: tokens * numHeads * headSize }, next))
    const { cos, sin } = shiftCosSin(tableRow(Math.abs(delta), rotaryDim), delta)
    // Source and destination at offsets that fit no element size: the kernel must not need alignment.
    const padded = new Uint8Array(k.length + 3)
    padded.set(k, 3)
    const out = new Uint8Array(k.length + 5)
    rotateTokens(spec, cos, sin, padded, 3, out, 5, tokens)
    const reference = referenceRotate(spec, k, tokens, delta)
    const label = `${dtype} ${isNeoxStyle ? "neox" : "GPT-J"} Δ=${delta}`
    if (dtype === "float32") {
      // No rounding to a narrower type hides float32's own error (the table's cos/sin are float32 too), so
      // bound the absolute error by a few float32 ulps of the operands instead.
      const got = new Float32Array(out.slice(5).buffer)
      const bound = 2 ** -21 * reference.reduce((m, v) => Math.max(m, Math.abs(v)), 0)
      reference.forEach((r, i) => assert.isAtMost(Math.abs(got[i]! - r), bound, `${label}: element ${i}`))
    } else {
      const worst = worstUlp(dtype, out.subarray(5), reference)
      assert.isAtMost(worst.ulps, 1, `${label}: ${worst.ulps} ulps at element ${worst.at}`)
    }
    return { k, out: out.subarray(5) }
  }

  const shifts = [1, 5, -1, -37, 255, -256, 1000, -4095, 32767, -32767]
  for (const dtype of ["float16", "bfloat16", "float32"] as const) {
    for (const isNeoxStyle of [true, false]) {
      it(`${dtype}, ${isNeoxStyle ? "neox" : "GPT-J"} style: matches the float64 reference within 1 ulp for shifts ${shifts.join(", ")} and 0`, () => {
        for (const delta of shifts) check(dtype, isNeoxStyle, delta)
        const zero = check(dtype, isNeoxStyle, 0)
        assert.deepStrictEqual(zero.out, zero.k, "a zero shift changes nothing")
      })
    }
  }

  it("a partial rotary slice (group_rot [offset, width]) rotates only those dims of each head", () => {
    for (const dtype of ["float16", "bfloat16"] as const) {
      for (const isNeoxStyle of [true, false]) {
        const { k, out } = check(dtype, isNeoxStyle, -300, 32, 8, 16)
        for (let t = 0; t < tokens * numHeads; t++) {
          const head = (e: Uint8Array) => e.subarray(t * 64, (t + 1) * 64)
          assert.deepStrictEqual(head(out).subarray(0, 16), head(k).subarray(0, 16))
          assert.deepStrictEqual(head(out).subarray(48), head(k).subarray(48))
        }
      }
    }
  })

  it("rotating by Δ then by −Δ gives back the keys to within rounding; cos/sin of −Δ negate the sines only", () => {
    const row = tableRow(123, 8)
    const plus = shiftCosSin(row, 123)
    const minus = shiftCosSin(row, -123)
    assert.deepStrictEqual([...minus.cos], [...plus.cos])
    assert.deepStrictEqual([...minus.sin], [...plus.sin].map((s) => -s))
    const spec: RotationSpec = { dtype: "float32", numHeads: 1, headSize: 8, rotaryOffset: 0, rotaryDim: 8, isNeoxStyle: true }
    const k = encodeAll("float32", [1, 2, 3, 4, 5, 6, 7, 8])
    const there = new Uint8Array(32)
    const back = new Uint8Array(32)
    rotateTokens(spec, plus.cos, plus.sin, k, 0, there, 0, 1)
    rotateTokens(spec, minus.cos, minus.sin, there, 0, back, 0, 1)
    const values = new Float32Array(back.buffer)
    values.forEach((v, i) => assert.approximately(v, i + 1, 1e-5))
  })
})

describe("CB_REGISTER_ROPE validation", () => {
  const table = (over: Partial<TensorDescriptor> = {}): TensorDescriptor => ({
    kind: "cpu_shm",
    shm_name: "rope",
    device_uuid: "cpu",
    nbytes: 4096 * 64 * 4,
    dtype: "float32",
    shape: [4096, 64],
    stride: [64, 1],
    storage_offset: 0,
    ...over
  })
  const error = (result: ReturnType<typeof validateRope>) => ("error" in result ? result.error : "valid")

  it("accepts vLLM's table with the whole head rotated, or a partial slice named by group_rot", () => {
    const whole = validateRope([table()], 64, [], [])
    assert.deepStrictEqual("groups" in whole ? whole.groups : [], [{ cacheIndex: 0, rotaryOffset: 0, rotaryDim: 64 }])
    // Two tables in one segment: [4096, 64] at offset 0, then [4096, 32].
    const nbytes = 4096 * 96 * 4
    const second = table({ nbytes, shape: [4096, 32], stride: [32, 1], storage_offset: 4096 * 64 })
    const partial = validateRope([table({ nbytes }), second], 128, [1, 0], [[64, 32], [0, 64]])
    assert.strictEqual(error(partial), "valid")
    assert.deepStrictEqual("groups" in partial ? partial.groups : [], [
      { cacheIndex: 1, rotaryOffset: 64, rotaryDim: 32 },
      { cacheIndex: 0, rotaryOffset: 0, rotaryDim: 64 }
    ])
    assert.deepStrictEqual("segments" in partial ? [...partial.segments] : [], [["rope", nbytes]])
  })

  it("each violation names its field", () => {
    assert.strictEqual(error(validateRope([], 64, [], [])), "cos_sin_caches: expected at least one cos/sin table, got none")
    assert.strictEqual(
      error(validateRope([{ kind: "cuda_ipc", ipc_handle: new Uint8Array(64), device_uuid: "GPU-0", nbytes: 1, dtype: "float32", shape: [1, 2], stride: [2, 1], storage_offset: 0 }], 64, [], [])),
      "cos_sin_caches[0].kind: cuda_ipc: CUDA IPC backend not available on this host"
    )
    assert.strictEqual(
      error(validateRope([{ kind: "cpu_memfd", fd_token: new Uint8Array(16), fd_index: 0, device_uuid: "cpu", nbytes: 1, dtype: "float32", shape: [1, 2], stride: [2, 1], storage_offset: 0 }], 64, [], [])),
      "cos_sin_caches[0].kind: cpu_memfd is not taken for cos/sin tables; expected cpu_shm (docs/memfd.md covers kv_caches only)"
    )
    assert.include(error(validateRope([table({ dtype: "float16" })], 64, [], [])), "cos_sin_caches[0].dtype: expected float32")
    assert.include(error(validateRope([table({ shape: [4096, 63], stride: [63, 1] })], 64, [], [])), "cos_sin_caches[0].shape: expected [max_position, rotary_dim]")
    assert.include(error(validateRope([table({ shape: [2, 4096, 64] })], 64, [], [])), "cos_sin_caches[0].shape")
    assert.include(error(validateRope([table({ stride: [128, 1] })], 64, [], [])), "cos_sin_caches[0].stride: expected the contiguous strides [64, 1]")
    assert.include(error(validateRope([table({ nbytes: 1000 })], 64, [], [])), "cos_sin_caches[0].nbytes: the view ends at byte 1048576")
    assert.include(error(validateRope([table({ storage_offset: 1 })], 64, [], [])), "cos_sin_caches[0].nbytes")
    assert.include(error(validateRope([table({ shm_name: "a/b" })], 64, [], [])), "cos_sin_caches[0].shm_name")
    assert.include(error(validateRope([table(), table({ nbytes: 4096 * 64 * 8 })], 64, [], [])), "cos_sin_caches[1].nbytes: segment rope is claimed")
    assert.include(error(validateRope([table()], 128, [], [])), "cos_sin_caches[0].shape[1]: rotary_dim 64 must equal head_size 128")
    assert.include(error(validateRope([table()], 64, [1], [])), "group_to_cache[0]: table 1 does not exist")
    assert.include(error(validateRope([table()], 64, [0, 0], [null])), "group_rot: expected 2 entries")
    assert.include(error(validateRope([table()], 128, [], [[0, 32]])), "group_rot[0]: width 32 must equal the rotary_dim (64)")
    assert.include(error(validateRope([table()], 128, [], [[96, 64]])), "group_rot[0]: dims [96, 160) exceed head_size 128")
    assert.include(error(validateRope([table()], 0, [], [])), "head_size")
  })
})
