/**
 * L1 object keys (DESIGN §3.2; upstream `ObjectKey`): one chunk of one kv
 * rank, identified by (chunk hash, model name, kv rank, cache salt).
 */
import { hashHex } from "../kv/TokenHasher.ts"

export interface ObjectKey {
  /** 32-byte prefix hash of the chunk. */
  readonly hash: Uint8Array
  readonly modelName: string
  /** The shard of the chunk (`worker_id` of a store; each rank for a lookup with nil). */
  readonly kvRank: number
  readonly cacheSalt: string
}

/**
 * The map key of an object: hex hash, rank, length-prefixed salt, then the
 * model name (which may hold any character), so distinct keys never collide.
 */
export const objectKeyString = (k: ObjectKey): string =>
  `${hashHex(k.hash)}:${k.kvRank}:${k.cacheSalt.length}:${k.cacheSalt}:${k.modelName}`
