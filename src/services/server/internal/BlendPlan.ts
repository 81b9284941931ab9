/**
 * @internal
 *
 * The computing half of CB_RETRIEVE_PRE_COMPUTED (DESIGN §4 "Blend";
 * reference §5): the rules a match plan is checked by
 * ({@link planMatches}), whether a KV context can be re-rotated
 * ({@link kvCompatibility}), and {@link planCopies}, which rotates K into a
 * staging buffer and plans the scatter into the worker's blocks (segment →
 * source buffer → merged ranges). Nothing here touches worker memory or L1:
 * `Blend.ts` holds the locks, reads the cos/sin rows and scatters. The
 * rules are the header of `Blend.ts`.
 */
import { Effect } from "effect"
import type { CbMatch } from "../../../schema/CbMatch.ts"
import type { LayerPlacement, PagedKvGeometry } from "../../kv/KvCacheLayout.ts"
import { HASH_BYTES, hashHex } from "../../kv/TokenHasher.ts"
import { isRotatableDtype, rotateTokens, type RotatableDtype, type RotationSpec, shiftCosSin } from "./Rope.ts"

/** One non-empty match, checked and resolved to object and block coordinates. */
export interface PlannedMatch {
  /** Its index in `matches`, for messages. */
  readonly index: number
  readonly hash: Uint8Array
  readonly hashHex: string
  /** Token offset of `old_st` inside the cached chunk: `old_st mod chunk`. */
  readonly objectTokenOffset: number
  /** First current position written. */
  readonly curSt: number
  readonly numTokens: number
  /** cur_st − old_st: the rotation applied to K. */
  readonly delta: number
}

/** What a match plan is checked against. */
export interface MatchLimits {
  readonly chunkSizeTokens: number
  readonly blockSizeTokens: number
  /** Blocks of the registered KV cache: every block id must be below it. */
  readonly numBlocks: number
  /** Rows of the cos/sin table: |Δ| must be below it. */
  readonly maxPosition: number
}

/**
 * Checks `matches` against the rules of the module header and resolves each
 * non-empty one. Returns the message of the first violation (naming
 * `matches[j]` or `block_ids`) instead.
 */
export const planMatches = (
  matches: ReadonlyArray<CbMatch>,
  blockList: ReadonlyArray<number>,
  limits: MatchLimits
): { readonly matches: ReadonlyArray<PlannedMatch> } | { readonly error: string } => {
  const { chunkSizeTokens: chunk, blockSizeTokens: bs, numBlocks, maxPosition } = limits
  const planned: Array<PlannedMatch> = []
  for (let j = 0; j < matches.length; j++) {
    const m = matches[j]!
    const at = `matches[${j}]`
    if (m.hash.length !== HASH_BYTES) return { error: `${at}.hash: expected ${HASH_BYTES} bytes (a chunk hash), got ${m.hash.length}` }
    if (m.old_ed < m.old_st) return { error: `${at}: old_ed (${m.old_ed}) is below old_st (${m.old_st})` }
    if (m.cur_ed < m.cur_st) return { error: `${at}: cur_ed (${m.cur_ed}) is below cur_st (${m.cur_st})` }
    const n = m.old_ed - m.old_st
    if (m.cur_ed - m.cur_st !== n) {
      return {
        error: `${at}: the old range [${m.old_st}, ${m.old_ed}) has ${n} tokens but the current range [${m.cur_st}, ${m.cur_ed}) has ${m.cur_ed - m.cur_st}; they must be equal`
      }
    }
    if (n === 0) continue
    const c = Math.floor(m.old_st / chunk)
    if (m.old_ed > (c + 1) * chunk) {
      return {
        error: `${at}: the old range [${m.old_st}, ${m.old_ed}) crosses the end of chunk ${c} (tokens [${c * chunk}, ${(c + 1) * chunk}), chunk size ${chunk}); a match covers tokens of one cached chunk`
      }
    }
    const lastBlock = Math.floor((m.cur_ed - 1) / bs)
    if (lastBlock >= blockList.length) {
      return {
        error: `${at}: the current range [${m.cur_st}, ${m.cur_ed}) ends in block ${lastBlock} (block size ${bs}) but block_ids[0] has ${blockList.length} ids`
      }
    }
    for (let b = Math.floor(m.cur_st / bs); b <= lastBlock; b++) {
      if (blockList[b]! >= numBlocks) {
        return { error: `block_ids[0][${b}] = ${blockList[b]} (used by ${at}) is outside the registered ${numBlocks} blocks` }
      }
    }
    const delta = m.cur_st - m.old_st
    if (Math.abs(delta) >= maxPosition) {
      return {
        error: `${at}: the shift ${delta} (cur_st − old_st) needs cos/sin row ${Math.abs(delta)}, but the table has ${maxPosition} rows (max_position)`
      }
    }
    planned.push({ index: j, hash: m.hash, hashHex: hashHex(m.hash), objectTokenOffset: m.old_st - c * chunk, curSt: m.cur_st, numTokens: n, delta })
  }
  const byStart = [...planned].sort((a, b) => a.curSt - b.curSt)
  for (let k = 1; k < byStart.length; k++) {
    const prev = byStart[k - 1]!
    const next = byStart[k]!
    if (next.curSt < prev.curSt + prev.numTokens) {
      return {
        error: `matches[${prev.index}] and matches[${next.index}] both write current position ${next.curSt}; the current ranges must not overlap`
      }
    }
  }
  return { matches: planned }
}

/** The KV dtype when a context can be re-rotated with heads of `headSize`, else why not. */
export const kvCompatibility = (headSize: number, g: PagedKvGeometry): { readonly dtype: RotatableDtype } | { readonly error: string } => {
  if (g.headSize !== headSize) {
    return { error: `head_size: ${headSize} does not match the head size (${g.headSize}) of the instance's registered KV cache` }
  }
  const dtype = g.dtype
  return isRotatableDtype(dtype)
    ? { dtype }
    : { error: `the instance's registered KV cache has dtype ${dtype}, which blend cannot re-rotate (float16, bfloat16 or float32)` }
}

/** Pairs of K elements rotated between two yields to the event loop. */
const PAIRS_PER_SLICE = 1 << 18

/** Lets I/O callbacks (the ROUTER's receive, PING) run before continuing. */
const yieldToEventLoop = Effect.callback<void>((resume) => {
  const handle = setImmediate(() => resume(Effect.void))
  return Effect.sync(() => clearImmediate(handle))
})

/** One copy of the scatter: `ranges` (triples segment offset, source offset, length in bytes) from `src` into `segment`. */
export interface CopyJob {
  readonly segment: string
  readonly src: Uint8Array
  readonly ranges: Float64Array
}

/** What {@link planCopies} plans from: the checked matches, their cached objects and cos/sin rows, the KV context's layout. */
export interface CopyInput {
  readonly plan: ReadonlyArray<PlannedMatch>
  /** Each match's cached chunk object (`[2, num_layers, chunk_size, hidden]`), by `hashHex`. */
  readonly objects: ReadonlyMap<string, { readonly bytes: Uint8Array }>
  /** cos/sin row |Δ| (`rotary_dim` float32) for every non-zero shift of the plan. */
  readonly rows: ReadonlyMap<number, Float32Array>
  readonly geometry: PagedKvGeometry
  readonly layers: ReadonlyArray<LayerPlacement>
  readonly spec: RotationSpec
  readonly chunkSizeTokens: number
  /** `block_ids[0]`: position p lives in block `blockList[⌊p / block_size⌋]`. */
  readonly blockList: ReadonlyArray<number>
}

/**
 * Rotates every shifted match's K (by Δ, with row |Δ|) into one staging
 * buffer and plans the copies of every layer's K and V into the worker's
 * blocks, merging runs that continue each other on both sides. Yields to
 * the event loop every {@link PAIRS_PER_SLICE} rotated pairs.
 */
export const planCopies = (input: CopyInput): Effect.Effect<ReadonlyArray<CopyJob>> =>
  Effect.gen(function*() {
    const { plan, objects, rows, geometry: g, layers, spec, chunkSizeTokens: chunk, blockList } = input
    const tokenBytes = g.hiddenDim * g.elementBytes
    const stagedTokens = plan.reduce((n, m) => n + (m.delta === 0 ? 0 : m.numTokens), 0)
    const staging = new Uint8Array(stagedTokens * g.numLayers * tokenBytes)
    let stagingCursor = 0
    let pairsSinceYield = 0
    const copies = new Map<string, Map<Uint8Array, Array<number>>>()
    const push = (segment: string, src: Uint8Array, segmentOffset: number, srcOffset: number, length: number) => {
      let bySrc = copies.get(segment)
      if (bySrc === undefined) copies.set(segment, bySrc = new Map())
      let list = bySrc.get(src)
      if (list === undefined) bySrc.set(src, list = [])
      const n = list.length
      if (n >= 3 && list[n - 3]! + list[n - 1]! === segmentOffset && list[n - 2]! + list[n - 1]! === srcOffset) {
        list[n - 1] = list[n - 1]! + length
      } else {
        list.push(segmentOffset, srcOffset, length)
      }
    }
    const bs = g.blockSizeTokens
    for (const m of plan) {
      const object = objects.get(m.hashHex)!.bytes
      const row = m.delta === 0 ? undefined : rows.get(Math.abs(m.delta))!
      const { cos, sin } = row === undefined ? { cos: undefined, sin: undefined } : shiftCosSin(row, m.delta)
      for (let l = 0; l < g.numLayers; l++) {
        const layer = layers[l]!
        for (const kv of [0, 1] as const) {
          const objectOffset = ((kv * g.numLayers + l) * chunk + m.objectTokenOffset) * tokenBytes
          let src: Uint8Array = object
          let srcOffset = objectOffset
          if (kv === 0 && cos !== undefined && sin !== undefined) {
            rotateTokens(spec, cos, sin, object, objectOffset, staging, stagingCursor, m.numTokens)
            src = staging
            srcOffset = stagingCursor
            stagingCursor += m.numTokens * tokenBytes
            pairsSinceYield += m.numTokens * g.numHeads * (spec.rotaryDim / 2)
            if (pairsSinceYield >= PAIRS_PER_SLICE) {
              pairsSinceYield = 0
              yield* yieldToEventLoop
            }
          }
          for (let t = 0; t < m.numTokens;) {
            const p = m.curSt + t
            const slot = p % bs
            const piece = Math.min(bs - slot, m.numTokens - t)
            const segmentOffset = layer.baseOffsetBytes + ((kv * g.numBlocks + blockList[Math.floor(p / bs)]!) * bs + slot) * tokenBytes
            push(layer.shmName, src, segmentOffset, srcOffset + t * tokenBytes, piece * tokenBytes)
            t += piece
          }
        }
      }
    }
    return [...copies].flatMap(([segment, bySrc]) => [...bySrc].map(([src, list]) => ({ segment, src, ranges: Float64Array.from(list) })))
  })
