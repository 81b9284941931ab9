/**
 * The shapes bench:soak's load processes share (bench/soak/load.ts,
 * bench/soak/worker.ts): a tiny model, so that the run measures the
 * server's bookkeeping per request and not its copies. 2 layers × 2 heads ×
 * 16 head size, float16, 16-token blocks and chunks: one chunk object is
 * 2 × 2 × 16 × 32 × 2 B = 4 KiB.
 */

/** The lmcache-driven model: the sessions' stored prefixes, the register cycles, the killed workers. */
export const MODEL_LM = "soak-lm-2x2x16"
/** The engine-driven context's model (PREPARE_STORE). */
export const MODEL_ED = "soak-ed-2x2x16"
/** A model no one registers: LOOKUPs for it take the path of issue 18 defect 3. */
export const MODEL_NOBODY = "soak-nobody"

export const NUM_LAYERS = 2
export const NUM_HEADS = 2
export const HEAD_SIZE = 16
export const DTYPE = "float16" as const
export const BLOCK_TOKENS = 16
/** The server's `--chunk-size`. */
export const CHUNK_TOKENS = 16
/** Tokens of one stored prefix: 4 chunks. */
export const PREFIX_TOKENS = 64
/** Prefixes stored once by the sessions process; every LOOKUP of the run hits one of them. */
export const PREFIXES = 8
/** Block 0 (vLLM's null block, unused) + one prefix's blocks. */
export const NUM_BLOCKS = 1 + PREFIX_TOKENS / BLOCK_TOKENS

/** The paged KV cache geometry of every lmcache-driven process of the soak. */
export const KV_GEOMETRY = {
  numLayers: NUM_LAYERS,
  numBlocks: NUM_BLOCKS,
  blockSizeTokens: BLOCK_TOKENS,
  numHeads: NUM_HEADS,
  headSize: HEAD_SIZE,
  dtype: DTYPE
} as const

/** Token ids of stored prefix `i` (0 ≤ i < PREFIXES). */
export const prefixTokens = (i: number): Array<number> =>
  Array.from({ length: PREFIX_TOKENS }, (_, j) => (j === 0 ? 1_000 + i : (j * 31 + 7) % 32_000))

/** `length` token ids no other call returns for another (`space`, `n`): fresh keys, never stored. */
export const freshTokens = (space: number, n: number, length: number): Array<number> =>
  Array.from({ length }, (_, j) => (j === 0 ? 10_000_000 * (space + 1) + n : (j * 17 + 3) % 32_000))
