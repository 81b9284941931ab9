/**
 * Test support for blend: vLLM-style cos/sin tables (in memory and in real
 * shared memory), and a reference RoPE re-rotation written independently of
 * `src/services/server/internal/Rope.ts` — its own float16/bfloat16 codecs (V8's
 * Float16Array for float16, float64 arithmetic for bfloat16) and float64
 * math with cos/sin computed directly from the angle — for checking the
 * module to within 1 ulp of the data type.
 */
import { randomUUID } from "node:crypto"
import { Effect } from "effect"
import { NativeMemory } from "../../src/native/Native.ts"
import type { TensorDescriptor } from "../../src/schema/TensorDescriptor.ts"

export type TestDtype = "float16" | "bfloat16" | "float32"

/** RoPE frequency of pair i: base^(−2i / rotaryDim) (vLLM's inv_freq, base 10000). */
export const theta = (i: number, rotaryDim: number, base = 10000): number => base ** (-(2 * i) / rotaryDim)

/** Row p of vLLM's cos_sin_cache: float32 cos(p·θᵢ) for i < d/2, then sin(p·θᵢ). */
export const tableRow = (p: number, rotaryDim: number): Float32Array => {
  const half = rotaryDim / 2
  const row = new Float32Array(rotaryDim)
  for (let i = 0; i < half; i++) {
    row[i] = Math.cos(p * theta(i, rotaryDim))
    row[half + i] = Math.sin(p * theta(i, rotaryDim))
  }
  return row
}

/** The whole table `[maxPosition, rotaryDim]` float32, row-major. */
export const tableBytes = (maxPosition: number, rotaryDim: number): Uint8Array => {
  const all = new Float32Array(maxPosition * rotaryDim)
  for (let p = 0; p < maxPosition; p++) all.set(tableRow(p, rotaryDim), p * rotaryDim)
  return new Uint8Array(all.buffer)
}

/**
 * A cos/sin table in a fresh shared-memory segment (created in the current
 * Scope, unlinked when it closes), `offsetElems` float32 values into it;
 * returns its descriptor. The writing mapping is closed before returning,
 * so every later mapping of the segment is the server's.
 */
export const makeTableSegment = (maxPosition: number, rotaryDim: number, offsetElems = 0) =>
  Effect.gen(function*() {
    const native = yield* NativeMemory
    const name = `mpcache-test-rope-${randomUUID()}`
    const bytes = tableBytes(maxPosition, rotaryDim)
    const nbytes = bytes.length + offsetElems * 4
    yield* Effect.acquireRelease(native.createSegment(name, nbytes), () => Effect.ignore(native.unlinkSegment(name)))
    yield* Effect.scoped(Effect.gen(function*() {
      const mapping = yield* native.map(name, nbytes)
      yield* native.scatter(mapping, Float64Array.of(offsetElems * 4, 0, bytes.length), bytes)
    }))
    const descriptor: TensorDescriptor = {
      kind: "cpu_shm",
      shm_name: name,
      device_uuid: "cpu",
      nbytes,
      dtype: "float32",
      shape: [maxPosition, rotaryDim],
      stride: [rotaryDim, 1],
      storage_offset: offsetElems
    }
    return descriptor
  })

// ---------------------------------------------------------------------------
// independent codecs
// ---------------------------------------------------------------------------

interface F16Globals {
  readonly Float16Array: new(buffer: ArrayBuffer) => { [i: number]: number; length: number }
  readonly Math: { readonly f16round: (x: number) => number }
}
const g = globalThis as unknown as F16Globals

/** V8's float16 rounding (IEEE round-to-nearest-even), applied to a float32 value. */
export const f16round = (x: number): number => g.Math.f16round(Math.fround(x))

/** float16 bits → value, via V8's Float16Array. */
export const refF16Decode = (bits: number): number => new g.Float16Array(Uint16Array.of(bits).buffer)[0]!

const f16Scratch = new ArrayBuffer(2)
const f16View = new g.Float16Array(f16Scratch)
const f16Bits = new Uint16Array(f16Scratch)

/** value → float16 bits, via V8's Float16Array (rounding the float32 of `x`). */
export const refF16Encode = (x: number): number => {
  f16View[0] = Math.fround(x)
  return f16Bits[0]!
}

const view = new DataView(new ArrayBuffer(4))

/** bfloat16 bits → value (the top half of a float32). */
export const refBf16Decode = (bits: number): number => {
  view.setUint32(0, (bits & 0xffff) << 16)
  return view.getFloat32(0)
}

/** Rounds to an integer, ties to even (float64; exact for |q| < 2^52). */
const roundHalfEven = (q: number): number => {
  const f = Math.floor(q)
  const r = q - f
  return r > 0.5 || (r === 0.5 && f % 2 !== 0) ? f + 1 : f
}

/**
 * A float32 value rounded to bfloat16 (8 significant bits, exponent range of
 * float32), round-to-nearest-even, by float64 arithmetic: the nearest
 * multiple of the bfloat16 ulp at the value's binade.
 */
export const refBf16Round = (x: number): number => {
  const v = Math.fround(x)
  if (!Number.isFinite(v) || v === 0) return v
  const a = Math.abs(v)
  let e = Math.floor(Math.log2(a))
  if (2 ** e > a) e--
  if (2 ** (e + 1) <= a) e++
  const ulp = 2 ** (Math.max(e, -126) - 7)
  const r = roundHalfEven(a / ulp) * ulp
  return Math.sign(v) * (r >= 2 ** 128 ? Infinity : r)
}

/** bfloat16 value → bits (the value must be a bfloat16). */
export const refBf16Encode = (x: number): number => {
  if (Number.isNaN(x)) return 0x7fc0
  view.setFloat32(0, refBf16Round(x))
  return view.getUint32(0) >>> 16
}

/** Element bytes of a test dtype. */
export const elementBytes = (dtype: TestDtype): number => (dtype === "float32" ? 4 : 2)

/** Decodes element `i` of little-endian `bytes`. */
export const decodeAt = (dtype: TestDtype, bytes: Uint8Array, i: number): number => {
  const dv = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength)
  if (dtype === "float32") return dv.getFloat32(4 * i, true)
  const bits = dv.getUint16(2 * i, true)
  return dtype === "float16" ? refF16Decode(bits) : refBf16Decode(bits)
}

/** Bit pattern of `x` rounded to `dtype`. */
export const encodeBits = (dtype: TestDtype, x: number): number => {
  if (dtype === "float16") return refF16Encode(x)
  if (dtype === "bfloat16") return refBf16Encode(x)
  view.setFloat32(0, x)
  return view.getUint32(0)
}

/** Writes `values` (each rounded to `dtype`) as little-endian bytes. */
export const encodeAll = (dtype: TestDtype, values: ArrayLike<number>): Uint8Array => {
  const out = new Uint8Array(values.length * elementBytes(dtype))
  const dv = new DataView(out.buffer)
  for (let i = 0; i < values.length; i++) {
    const bits = encodeBits(dtype, values[i]!)
    if (dtype === "float32") dv.setUint32(4 * i, bits, true)
    else dv.setUint16(2 * i, bits, true)
  }
  return out
}

/** Distance in representable values between two bit patterns of `dtype` (sign-magnitude → ordered ints). */
export const ulpDistance = (dtype: TestDtype, a: number, b: number): number => {
  const bits = dtype === "float32" ? 32 : 16
  const signBit = 2 ** (bits - 1)
  const ordered = (u: number) => (u >= signBit ? -(u - signBit) : u)
  return Math.abs(ordered(a) - ordered(b))
}

/** Bit pattern of element `i` of little-endian `bytes`. */
export const bitsAt = (dtype: TestDtype, bytes: Uint8Array, i: number): number => {
  const dv = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength)
  return dtype === "float32" ? dv.getUint32(4 * i, true) : dv.getUint16(2 * i, true)
}

/** A deterministic generator of values ~ N(0, scale²) (xorshift32 + Box–Muller). */
export const gaussian = (seed: number, scale = 1) => {
  let s = seed >>> 0 || 1
  const next = () => {
    s ^= s << 13
    s >>>= 0
    s ^= s >>> 17
    s ^= s << 5
    s >>>= 0
    return (s + 0.5) / 2 ** 32
  }
  return () => scale * Math.sqrt(-2 * Math.log(next())) * Math.cos(2 * Math.PI * next())
}

export interface ReferenceRotation {
  readonly dtype: TestDtype
  readonly numHeads: number
  readonly headSize: number
  readonly rotaryOffset: number
  readonly rotaryDim: number
  readonly isNeoxStyle: boolean
}

/**
 * The reference: `tokens` tokens of K (little-endian `dtype`) rotated by the
 * position shift `delta`, in float64 with cos/sin of `delta·θᵢ` computed
 * directly; returns the exact (unrounded) result per element — dims
 * outside the rotary slice keep their value.
 */
export const referenceRotate = (spec: ReferenceRotation, k: Uint8Array, tokens: number, delta: number): Float64Array => {
  const { numHeads, headSize, rotaryOffset, rotaryDim, isNeoxStyle, dtype } = spec
  const n = tokens * numHeads * headSize
  const out = new Float64Array(n)
  for (let i = 0; i < n; i++) out[i] = decodeAt(dtype, k, i)
  const x = Float64Array.from(out)
  const half = rotaryDim / 2
  for (let t = 0; t < tokens; t++) {
    for (let h = 0; h < numHeads; h++) {
      const base = (t * numHeads + h) * headSize + rotaryOffset
      for (let i = 0; i < half; i++) {
        const a = base + (isNeoxStyle ? i : 2 * i)
        const b = base + (isNeoxStyle ? i + half : 2 * i + 1)
        const x1 = x[a]!
        const x2 = x[b]!
        const angle = delta * theta(i, rotaryDim)
        out[a] = x1 * Math.cos(angle) - x2 * Math.sin(angle)
        out[b] = x2 * Math.cos(angle) + x1 * Math.sin(angle)
      }
    }
  }
  return out
}

/**
 * Compares rotated bytes with the reference: the largest ulp distance
 * between each element and the reference value rounded to the dtype, and
 * where it is.
 */
export const worstUlp = (dtype: TestDtype, got: Uint8Array, reference: Float64Array): { readonly ulps: number; readonly at: number } => {
  let worst = { ulps: 0, at: -1 }
  const dv = new DataView(got.buffer, got.byteOffset, got.byteLength)
  for (let i = 0; i < reference.length; i++) {
    const bits = dtype === "float32" ? dv.getUint32(4 * i, true) : dv.getUint16(2 * i, true)
    const d = ulpDistance(dtype, bits, encodeBits(dtype, reference[i]!))
    if (d > worst.ulps) worst = { ulps: d, at: i }
  }
  return worst
}
