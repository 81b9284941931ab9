/**
 * Deterministic synthesis of what an engine would hold for a trace request
 * (the replay issue): token ids derived from each 512-token block's hash id
 * (equal prefixes → equal tokens → equal chunk hashes at the server), and KV
 * bytes that are a function of (model, layer, K/V, token position, the
 * block's hash id) — and so of the prefix — so any retrieved byte can be
 * checked against what a worker would compute.
 */
import type { Dtype } from "../schema/Dtype.ts"
import { TRACE_BLOCK_TOKENS } from "./Trace.ts"

/** A model's KV shape (per rank). */
export interface ModelPreset {
  readonly name: string
  readonly numLayers: number
  readonly numHeads: number
  readonly headSize: number
  readonly dtype: Dtype
}

/** `small` runs in seconds here; `llama3-8b` is Llama-3-8B's KV (32 layers × 8 KV heads × 128, float16: 128 KiB per token). */
export const MODEL_PRESETS: Record<string, ModelPreset> = {
  small: { name: "replay-small", numLayers: 2, numHeads: 2, headSize: 16, dtype: "float16" },
  "llama3-8b": { name: "llama3-8b", numLayers: 32, numHeads: 8, headSize: 128, dtype: "float16" }
}

const VOCAB = 128_000

/** Token ids of a request: block i's tokens derive from hash id i. */
export const tokensFor = (hashIds: ReadonlyArray<number>, inputLength: number): Array<number> => {
  const out = new Array<number>(inputLength)
  for (let p = 0; p < inputLength; p++) {
    const h = hashIds[Math.floor(p / TRACE_BLOCK_TOKENS)]!
    out[p] = ((Math.imul(h + 1, 2654435761) ^ Math.imul((p % TRACE_BLOCK_TOKENS) + 1, 40503)) >>> 0) % VOCAB
  }
  return out
}

const mix = (a: number, b: number): number => {
  let x = (Math.imul(a ^ (a >>> 16), 0x85ebca6b) + b) | 0
  x = Math.imul(x ^ (x >>> 13), 0xc2b2ae35)
  return (x ^ (x >>> 16)) >>> 0
}

/**
 * Fills `out` (a whole number of tokens of `tokenBytes`) with the K (kv 0)
 * or V (kv 1) bytes of `layer` for the tokens at positions `firstPosition …`
 * of a request with `hashIds`.
 */
export const fillKv = (
  out: Uint8Array,
  modelSeed: number,
  layer: number,
  kv: 0 | 1,
  firstPosition: number,
  hashIds: ReadonlyArray<number>,
  tokenBytes: number
): void => {
  const words = new Uint32Array(out.buffer, out.byteOffset, out.byteLength >>> 2)
  const wordsPerToken = tokenBytes >>> 2
  const tokens = out.byteLength / tokenBytes
  for (let t = 0; t < tokens; t++) {
    const p = firstPosition + t
    let x = mix(mix(mix(modelSeed, layer * 2 + kv), p), hashIds[Math.floor(p / TRACE_BLOCK_TOKENS)]! + 1) || 1
    const base = t * wordsPerToken
    for (let w = 0; w < wordsPerToken; w++) {
      x ^= x << 13
      x ^= x >>> 17
      x ^= x << 5
      words[base + w] = x >>> 0
    }
  }
}

/** A stable seed for a model name. */
export const modelSeed = (name: string): number => {
  let h = 2166136261
  for (let i = 0; i < name.length; i++) h = Math.imul(h ^ name.charCodeAt(i), 16777619)
  return h >>> 0
}
