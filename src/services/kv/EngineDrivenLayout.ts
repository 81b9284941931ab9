/**
 * The L1 object layout of an engine-driven context (DESIGN §3.2
 * RegisterEngineDrivenContext, §4; reference §4 "the server builds the
 * layout (single group: `[2, L, chunk, hidden]`, MLA `[L, chunk, hidden]`)"):
 * one chunk of one kv rank. Pure, shared by the server module and the
 * engine-driven worker adapter, which must agree on it byte for byte.
 */
import { type Dtype, dtypeBytes } from "../../schema/Dtype.ts"
import type { RegisterEngineDrivenContext } from "../../schema/EngineDriven.ts"

/** The L1 object layout of an engine-driven context: one chunk of one rank. */
export interface EngineDrivenLayout {
  readonly numLayers: number
  /** num_heads × head_size (MLA: the latent width). */
  readonly hiddenDim: number
  readonly dtype: Dtype
  readonly useMla: boolean
  /** Tokens per engine block; divides the chunk size. */
  readonly blockSizeTokens: number
  /** `[2, num_layers, chunk_size, hidden]`, or `[num_layers, chunk_size, hidden]` with MLA. */
  readonly objectShape: ReadonlyArray<number>
  /** Bytes of one L1 object. */
  readonly chunkBytes: number
}

/**
 * The L1 object layout a registration describes, for `chunkSizeTokens`-token
 * chunks; `{error}` names the first field that cannot be honoured (the
 * object must also fit in `capacityBytes`). Shared with the worker adapter,
 * which computes the same layout.
 */
export const validateLayout = (
  p: Pick<RegisterEngineDrivenContext, "block_size" | "num_layers" | "hidden_dim_size" | "dtype_str" | "use_mla">,
  chunkSizeTokens: number,
  capacityBytes: number = Number.MAX_SAFE_INTEGER
): EngineDrivenLayout | { readonly error: string } => {
  for (const [field, n] of [["block_size", p.block_size], ["num_layers", p.num_layers], ["hidden_dim_size", p.hidden_dim_size]] as const) {
    if (!Number.isSafeInteger(n) || n < 1) return { error: `${field}: must be an integer ≥ 1, got ${n}` }
  }
  if (chunkSizeTokens % p.block_size !== 0) {
    return { error: `block_size: ${p.block_size} tokens must divide the server's chunk size (${chunkSizeTokens} tokens)` }
  }
  const objectShape = p.use_mla
    ? [p.num_layers, chunkSizeTokens, p.hidden_dim_size]
    : [2, p.num_layers, chunkSizeTokens, p.hidden_dim_size]
  const chunkBytes = objectShape.reduce((a, b) => a * b, dtypeBytes(p.dtype_str))
  if (!(chunkBytes <= capacityBytes)) {
    return {
      error: `num_layers, hidden_dim_size: one chunk object [${objectShape.join(", ")}] of ${p.dtype_str} takes ${chunkBytes} bytes, more than the L1 capacity (${capacityBytes} bytes)`
    }
  }
  return {
    numLayers: p.num_layers,
    hiddenDim: p.hidden_dim_size,
    dtype: p.dtype_str,
    useMla: p.use_mla,
    blockSizeTokens: p.block_size,
    objectShape,
    chunkBytes
  }
}
