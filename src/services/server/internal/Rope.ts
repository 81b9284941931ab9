/**
 * RoPE re-rotation for blend (DESIGN §4 "Blend"; reference §5): the pure
 * parts of CB_RETRIEVE_PRE_COMPUTED — float16/bfloat16 ↔ float32
 * conversion, validation of CB_REGISTER_ROPE's cos/sin tables and group
 * maps, and the kernel that rotates cached K by a position difference.
 *
 * **Rotary embedding.** A key at position p is stored rotated: for each
 * rotary pair (x₁, x₂) of each head, `R(pθᵢ)·(x₁, x₂)` with
 * `R(a) = [[cos a, −sin a], [sin a, cos a]]` and θᵢ the pair's frequency.
 * Rotations compose, so a key cached at position `old` is moved to `cur` by
 * `R((cur − old)θᵢ)`: no inverse rotation is needed. The pairs are, over the
 * rotary slice `x[0 … d)` of a head (d = rotary_dim; vLLM
 * `RotaryEmbedding._apply_rotary_emb`):
 * - neox style: `(x[i], x[i + d/2])`, i < d/2;
 * - GPT-J style: `(x[2i], x[2i + 1])`, i < d/2.
 *
 * **Table layout** (vLLM's `cos_sin_cache`): a float32 tensor
 * `[max_position, rotary_dim]`, contiguous, where row p holds
 * `cos(p·θᵢ)` in columns `[0, d/2)` and `sin(p·θᵢ)` in `[d/2, d)`. Pair i uses
 * column i of each half in both styles. A shift Δ reads row |Δ|; for Δ < 0
 * the sines are negated (sin(−a) = −sin(a); cos is even). |Δ| must be below
 * max_position.
 *
 * **Arithmetic.** Elements are widened to float32, rotated with float32
 * products and sums (each operation rounded to float32 with `Math.fround`,
 * no fused multiply-add: what torch does elementwise), and rounded back to
 * the KV dtype with round-to-nearest-even. Dims of a head outside the rotary
 * slice are copied byte for byte. A NaN element gives NaN (the canonical
 * quiet NaN of the dtype: its payload and sign are not kept); ±inf and
 * subnormals convert exactly.
 *
 * Cost: this runs on the JS thread, about 25–35 ns per rotated pair once
 * the JIT has warmed up (measured on the development host; several times
 * that for the first calls); see `Blend.ts` for how the AFFINITY lane keeps
 * PING responsive meanwhile.
 */
import type { Dtype } from "../../../schema/Dtype.ts"
import type { GroupRot } from "../../../schema/Registration.ts"
import type { TensorDescriptor } from "../../../schema/TensorDescriptor.ts"

// ---------------------------------------------------------------------------
// float16 / bfloat16 ↔ float32
// ---------------------------------------------------------------------------

const scratchF32 = new Float32Array(1)
const scratchU32 = new Uint32Array(scratchF32.buffer)

/** The float32 bit pattern of `x` (rounded to float32 first). */
export const f32Bits = (x: number): number => {
  scratchF32[0] = x
  return scratchU32[0]!
}

/** The float32 whose bit pattern is `bits`. */
export const f32FromBits = (bits: number): number => {
  scratchU32[0] = bits >>> 0
  return scratchF32[0]!
}

/**
 * The value of an IEEE binary16 bit pattern (exact: every float16 is a
 * float32). Subnormals are `mantissa · 2⁻²⁴`; exponent 31 is ±inf (mantissa
 * 0) or NaN.
 */
export const f16ToF32 = (bits: number): number => {
  const sign = bits & 0x8000 ? -1 : 1
  const exponent = (bits >>> 10) & 0x1f
  const mantissa = bits & 0x3ff
  if (exponent === 0) return sign * mantissa * 2 ** -24
  if (exponent === 0x1f) return mantissa === 0 ? sign * Infinity : NaN
  return sign * (1024 + mantissa) * 2 ** (exponent - 25)
}

/** Rounds `m / 2^shift` to the nearest integer, ties to even (m < 2³², 1 ≤ shift ≤ 31). */
const shiftRoundEven = (m: number, shift: number): number => {
  const q = m >>> shift
  const rest = m & ((1 << shift) - 1)
  const half = 1 << (shift - 1)
  return rest > half || (rest === half && (q & 1) === 1) ? q + 1 : q
}

/**
 * The binary16 bit pattern nearest to `x` rounded to float32 first,
 * round-to-nearest-even. Magnitudes ≥ 65520 (the midpoint between the
 * largest finite half, 65504, and 2¹⁶) become ±inf; values below 2⁻¹⁴
 * become subnormals (down to ±0); NaN becomes 0x7e00. The sign of zero is
 * kept.
 */
export const f32ToF16 = (x: number): number => f32BitsToF16(f32Bits(x))

/** {@link f32ToF16} of the float32 whose bit pattern is `u` (integer arithmetic only). */
export const f32BitsToF16 = (u: number): number => {
  const sign = (u >>> 16) & 0x8000
  const exponent = (u >>> 23) & 0xff
  const mantissa = u & 0x7fffff
  if (exponent === 0xff) return mantissa === 0 ? sign | 0x7c00 : 0x7e00
  const e = exponent - 127 + 15
  if (e >= 31) return sign | 0x7c00
  if (e <= 0) {
    // Half subnormal: value = m16 · 2⁻²⁴ with m16 = significand24 · 2^(e − 14).
    if (e < -10) return sign // below half the smallest subnormal (float32 subnormals included)
    return sign | shiftRoundEven(mantissa | 0x800000, 14 - e)
  }
  // Normal: keep 10 of the 23 mantissa bits; a carry may roll into the exponent (up to inf), which is right.
  return sign | shiftRoundEven((e << 23) | mantissa, 13)
}

/** The value of a bfloat16 bit pattern: the top half of a float32. */
export const bf16ToF32 = (bits: number): number => f32FromBits((bits & 0xffff) << 16)

/**
 * The bfloat16 bit pattern nearest to `x` rounded to float32 first,
 * round-to-nearest-even (a carry may reach ±inf, which is right); NaN
 * becomes 0x7fc0.
 */
export const f32ToBf16 = (x: number): number => f32BitsToBf16(f32Bits(x))

/** {@link f32ToBf16} of the float32 whose bit pattern is `u`. */
export const f32BitsToBf16 = (u: number): number =>
  (u & 0x7fffffff) > 0x7f800000 ? 0x7fc0 : ((u + 0x7fff + ((u >>> 16) & 1)) >>> 16) & 0xffff

let f16Table: Float32Array | undefined
let bf16Table: Float32Array | undefined

/** float16 bits → float32, by a 65,536-entry table built on first use (256 KiB). */
const f16Lookup = (): Float32Array => {
  if (f16Table === undefined) {
    f16Table = new Float32Array(65536)
    for (let b = 0; b < 65536; b++) f16Table[b] = f16ToF32(b)
  }
  return f16Table
}

/** bfloat16 bits → float32, by a 65,536-entry table built on first use (256 KiB). */
const bf16Lookup = (): Float32Array => {
  if (bf16Table === undefined) {
    bf16Table = new Float32Array(65536)
    for (let b = 0; b < 65536; b++) bf16Table[b] = bf16ToF32(b)
  }
  return bf16Table
}

/** The KV dtypes blend can re-rotate. */
export type RotatableDtype = "float16" | "bfloat16" | "float32"

export const isRotatableDtype = (d: Dtype): d is RotatableDtype => d === "float16" || d === "bfloat16" || d === "float32"

// ---------------------------------------------------------------------------
// the kernel
// ---------------------------------------------------------------------------

/** Where and how one KV group's keys are rotated. */
export interface RotationSpec {
  readonly dtype: RotatableDtype
  readonly numHeads: number
  readonly headSize: number
  /** First rotated dim of each head (elements). */
  readonly rotaryOffset: number
  /** Rotated dims per head (elements, even): the table's row width. */
  readonly rotaryDim: number
  readonly isNeoxStyle: boolean
}

/**
 * cos and sin of a shift Δ from table row |Δ| (`rotaryDim` float32 values:
 * cosines then sines); the sines are negated for Δ < 0.
 */
export const shiftCosSin = (row: Float32Array, delta: number): { readonly cos: Float32Array; readonly sin: Float32Array } => {
  const half = row.length / 2
  const cos = row.subarray(0, half)
  const sin = row.slice(half)
  if (delta < 0) for (let i = 0; i < half; i++) sin[i] = -sin[i]!
  return { cos, sin }
}

/** Two float32 results and their bit patterns (for rounding to a half type without a call per element). */
const pairF32 = new Float32Array(2)
const pairBits = new Uint32Array(pairF32.buffer)

/** Rotates the rotary slice of `tokens × numHeads` heads of half-type elements in place. */
const rotateHalfInPlace = (spec: RotationSpec, cos: Float32Array, sin: Float32Array, data: Uint16Array, tokens: number): void => {
  const { numHeads, headSize, rotaryOffset, rotaryDim, isNeoxStyle } = spec
  const bf16 = spec.dtype === "bfloat16"
  const decode = bf16 ? bf16Lookup() : f16Lookup()
  const half = rotaryDim / 2
  const fround = Math.fround
  for (let head = 0; head < tokens * numHeads; head++) {
    const base = head * headSize + rotaryOffset
    for (let i = 0; i < half; i++) {
      const a = isNeoxStyle ? base + i : base + 2 * i
      const b = isNeoxStyle ? a + half : a + 1
      const x1 = decode[data[a]!]!
      const x2 = decode[data[b]!]!
      const c = cos[i]!
      const s = sin[i]!
      pairF32[0] = fround(x1 * c) - fround(x2 * s)
      pairF32[1] = fround(x2 * c) + fround(x1 * s)
      if (bf16) {
        data[a] = f32BitsToBf16(pairBits[0]!)
        data[b] = f32BitsToBf16(pairBits[1]!)
      } else {
        data[a] = f32BitsToF16(pairBits[0]!)
        data[b] = f32BitsToF16(pairBits[1]!)
      }
    }
  }
}

/** Rotates the rotary slice of `tokens × numHeads` heads of float32 elements in place. */
const rotateF32InPlace = (spec: RotationSpec, cos: Float32Array, sin: Float32Array, data: Float32Array, tokens: number): void => {
  const { numHeads, headSize, rotaryOffset, rotaryDim, isNeoxStyle } = spec
  const half = rotaryDim / 2
  const fround = Math.fround
  for (let head = 0; head < tokens * numHeads; head++) {
    const base = head * headSize + rotaryOffset
    for (let i = 0; i < half; i++) {
      const a = isNeoxStyle ? base + i : base + 2 * i
      const b = isNeoxStyle ? a + half : a + 1
      const x1 = data[a]!
      const x2 = data[b]!
      const c = cos[i]!
      const s = sin[i]!
      data[a] = fround(x1 * c) - fround(x2 * s)
      data[b] = fround(x2 * c) + fround(x1 * s)
    }
  }
}

/**
 * Rotates `numTokens` key tokens by the shift whose `cos`/`sin`
 * (`rotaryDim / 2` values each) are given: reads them from `src` at
 * `srcOffsetBytes` and writes them to `dst` at `dstOffsetBytes`, each token
 * `numHeads × headSize` elements of `dtype` in the host's byte order
 * (little-endian on every supported host, as L1 objects are). Dims outside
 * the rotary slice are copied unchanged. `src` and `dst` must not overlap.
 *
 * Implementation: the tokens are copied to `dst`, then rotated in place
 * through a typed view (an aligned temporary when `dst` is not aligned to
 * the element size); per pair, two table lookups (half → float32), four
 * float32 products, two float32 sums and two integer roundings.
 */
export const rotateTokens = (
  spec: RotationSpec,
  cos: Float32Array,
  sin: Float32Array,
  src: Uint8Array,
  srcOffsetBytes: number,
  dst: Uint8Array,
  dstOffsetBytes: number,
  numTokens: number
): void => {
  const elementBytes = spec.dtype === "float32" ? 4 : 2
  const elements = numTokens * spec.numHeads * spec.headSize
  const bytes = elements * elementBytes
  const region = src.subarray(srcOffsetBytes, srcOffsetBytes + bytes)
  const at = dst.byteOffset + dstOffsetBytes
  const aligned = at % elementBytes === 0
  const work = aligned ? dst.subarray(dstOffsetBytes, dstOffsetBytes + bytes) : new Uint8Array(bytes)
  work.set(region)
  if (spec.dtype === "float32") {
    rotateF32InPlace(spec, cos, sin, new Float32Array(work.buffer, work.byteOffset, elements), numTokens)
  } else {
    rotateHalfInPlace(spec, cos, sin, new Uint16Array(work.buffer, work.byteOffset, elements), numTokens)
  }
  if (!aligned) dst.set(work, dstOffsetBytes)
}

// ---------------------------------------------------------------------------
// CB_REGISTER_ROPE validation
// ---------------------------------------------------------------------------

/** One cos/sin table: a float32 `[max_position, rotary_dim]` view in a segment. */
export interface CosSinTable {
  readonly shmName: string
  readonly segmentBytes: number
  /** Byte offset of row 0 in the segment. */
  readonly baseOffsetBytes: number
  /** Rows: the largest |Δ| plus one. */
  readonly maxPosition: number
  /** Row width in float32 values: cosines then sines. */
  readonly rotaryDim: number
}

/** How KV group g is rotated: with table `cacheIndex`, over dims [offset, offset + width) of each head. */
export interface GroupRotation {
  readonly cacheIndex: number
  readonly rotaryOffset: number
  readonly rotaryDim: number
}

export interface ValidatedRope {
  readonly tables: ReadonlyArray<CosSinTable>
  /** One entry per KV group. */
  readonly groups: ReadonlyArray<GroupRotation>
  /** Distinct segments and the size each claims. */
  readonly segments: ReadonlyMap<string, number>
}

const fmt = (a: ReadonlyArray<number>) => `[${a.join(", ")}]`

/**
 * Checks CB_REGISTER_ROPE's tables and group maps for heads of `headSize`
 * elements. Rules (a violation returns a message naming the field):
 * - `cos_sin_caches`: at least one; each `cpu_shm` (`cuda_ipc`: CUDA IPC
 *   backend not available on this host), float32, shape
 *   `[max_position, rotary_dim]` with both ≥ 1 and rotary_dim even, strides
 *   `[rotary_dim, 1]`, the view inside `nbytes`; descriptors sharing a
 *   segment claim the same `nbytes`.
 * - KV groups: G = max(len(group_to_cache), len(group_rot), 1); each list is
 *   empty or has G entries. Group g uses table `group_to_cache[g]` (empty:
 *   table 0), which must exist.
 * - Rotary slice of group g: `group_rot[g] = [offset, width]` rotates dims
 *   [offset, offset + width) of each head, width = the table's rotary_dim,
 *   offset + width ≤ head_size; nil (or an empty list) rotates the whole
 *   head, which then needs rotary_dim = head_size.
 */
export const validateRope = (
  caches: ReadonlyArray<TensorDescriptor>,
  headSize: number,
  groupToCache: ReadonlyArray<number>,
  groupRot: ReadonlyArray<GroupRot>
): ValidatedRope | { readonly error: string } => {
  if (caches.length === 0) return { error: "cos_sin_caches: expected at least one cos/sin table, got none" }
  if (headSize < 1) return { error: `head_size: expected ≥ 1, got ${headSize}` }
  const tables: Array<CosSinTable> = []
  const segments = new Map<string, number>()
  for (let i = 0; i < caches.length; i++) {
    const d = caches[i]!
    const at = `cos_sin_caches[${i}]`
    if (d.kind === "cuda_ipc") return { error: `${at}.kind: cuda_ipc: CUDA IPC backend not available on this host` }
    if (d.kind === "cpu_memfd") return { error: `${at}.kind: cpu_memfd is not taken for cos/sin tables; expected cpu_shm (docs/memfd.md covers kv_caches only)` }
    if (d.shm_name === undefined || d.shm_name.length === 0) return { error: `${at}.shm_name: required for a cpu_shm descriptor` }
    if (d.shm_name.includes("/")) {
      return { error: `${at}.shm_name: expected a POSIX name without slashes (as listed in /dev/shm), got "${d.shm_name}"` }
    }
    if (d.dtype !== "float32") return { error: `${at}.dtype: expected float32 (vLLM's cos_sin_cache), got ${d.dtype}` }
    if (d.shape.length !== 2 || d.shape[0]! < 1 || d.shape[1]! < 2 || d.shape[1]! % 2 !== 0) {
      return {
        error: `${at}.shape: expected [max_position, rotary_dim] with max_position ≥ 1 and rotary_dim even and ≥ 2, got ${fmt(d.shape)}`
      }
    }
    const [maxPosition, rotaryDim] = d.shape as [number, number]
    if (fmt(d.stride) !== fmt([rotaryDim, 1])) {
      return { error: `${at}.stride: expected the contiguous strides ${fmt([rotaryDim, 1])} (elements), got ${fmt(d.stride)}` }
    }
    const extentBytes = (d.storage_offset + maxPosition * rotaryDim) * 4
    if (extentBytes > d.nbytes) {
      return {
        error: `${at}.nbytes: the view ends at byte ${extentBytes} (storage_offset ${d.storage_offset} + ${maxPosition * rotaryDim} float32 values) but the segment is ${d.nbytes} bytes`
      }
    }
    const claimed = segments.get(d.shm_name)
    if (claimed !== undefined && claimed !== d.nbytes) {
      return { error: `${at}.nbytes: segment ${d.shm_name} is claimed as ${claimed} bytes by another table and ${d.nbytes} by this one` }
    }
    segments.set(d.shm_name, d.nbytes)
    tables.push({ shmName: d.shm_name, segmentBytes: d.nbytes, baseOffsetBytes: d.storage_offset * 4, maxPosition, rotaryDim })
  }
  const numGroups = Math.max(groupToCache.length, groupRot.length, 1)
  if (groupToCache.length !== 0 && groupToCache.length !== numGroups) {
    return { error: `group_to_cache: expected ${numGroups} entries (one per KV group, as group_rot has), got ${groupToCache.length}` }
  }
  if (groupRot.length !== 0 && groupRot.length !== numGroups) {
    return { error: `group_rot: expected ${numGroups} entries (one per KV group, as group_to_cache has), got ${groupRot.length}` }
  }
  const groups: Array<GroupRotation> = []
  for (let g = 0; g < numGroups; g++) {
    const cacheIndex = groupToCache[g] ?? 0
    const table = tables[cacheIndex]
    if (table === undefined) {
      return { error: `group_to_cache[${g}]: table ${cacheIndex} does not exist (${tables.length} cos_sin_caches)` }
    }
    const rot = groupRot[g] ?? null
    if (rot === null) {
      if (table.rotaryDim !== headSize) {
        return {
          error: `cos_sin_caches[${cacheIndex}].shape[1]: rotary_dim ${table.rotaryDim} must equal head_size ${headSize} when group ${g} has no group_rot slice (a partial rotary needs group_rot[${g}] = [offset, width])`
        }
      }
      groups.push({ cacheIndex, rotaryOffset: 0, rotaryDim: headSize })
      continue
    }
    const [offset, width] = rot
    if (width !== table.rotaryDim) {
      return { error: `group_rot[${g}]: width ${width} must equal the rotary_dim (${table.rotaryDim}) of cos_sin_caches[${cacheIndex}]` }
    }
    if (offset + width > headSize) {
      return { error: `group_rot[${g}]: dims [${offset}, ${offset + width}) exceed head_size ${headSize}` }
    }
    groups.push({ cacheIndex, rotaryOffset: offset, rotaryDim: width })
  }
  return { tables, groups, segments }
}
