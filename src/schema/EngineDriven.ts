/**
 * Engine-driven transfer structs (DESIGN §3.2, §4; reference §4): the
 * registration payload, the server pool's answer, and the slot descriptors
 * PREPARE_* hands out (byte offsets into the server's shared-memory pool).
 */
import { Schema } from "effect"
import { WireString } from "./Text.ts"
import { Dtype } from "./Dtype.ts"
import { InstanceIdWire } from "./InstanceId.ts"
import { Uint } from "./Integer.ts"
import { ModelName, WorldSize } from "./CacheKey.ts"
import { atMost, MAX_CHUNK_SIZE_TOKENS, MAX_HIDDEN_DIM, MAX_LAYERS } from "./Limits.ts"

/**
 * upstream RegisterEngineDrivenContextPayload (single KV group). Its counts
 * are bounded (issue 24 item 5, src/schema/Limits.ts).
 */
export const RegisterEngineDrivenContext = Schema.Struct({
  instance_id: InstanceIdWire,
  model_name: ModelName,
  world_size: WorldSize,
  /** Tokens per engine block: 1 … `MAX_CHUNK_SIZE_TOKENS`. */
  block_size: Uint.check(Schema.isGreaterThanOrEqualTo(1), atMost(MAX_CHUNK_SIZE_TOKENS, "tokens, MAX_CHUNK_SIZE_TOKENS")),
  /** 1 … `MAX_LAYERS`. */
  num_layers: Uint.check(Schema.isGreaterThanOrEqualTo(1), atMost(MAX_LAYERS, "layers, MAX_LAYERS")),
  /** num_heads × head_size: 1 … `MAX_HIDDEN_DIM`. */
  hidden_dim_size: Uint.check(Schema.isGreaterThanOrEqualTo(1), atMost(MAX_HIDDEN_DIM, "elements, MAX_HIDDEN_DIM")),
  dtype_str: Dtype,
  use_mla: Schema.Boolean
})
export type RegisterEngineDrivenContext = typeof RegisterEngineDrivenContext.Type

/** Answer to REGISTER_KV_CACHE_ENGINE_DRIVEN_CONTEXT: the pool to map. */
export const EngineDrivenPool = Schema.Struct({
  /** POSIX name of the server's L1 slot pool ("" when the pool is not shared: inline bytes). */
  shm_name: WireString,
  /** Pool size in bytes. */
  pool_size: Uint
})
export type EngineDrivenPool = typeof EngineDrivenPool.Type

/** One chunk's place in the pool: `length` bytes at byte `offset`, viewed as `shape` of `dtype`. */
export const Slot = Schema.Struct({
  offset: Uint,
  length: Uint,
  shape: Schema.Array(Uint),
  dtype: Dtype
})
export type Slot = typeof Slot.Type

/** Slots in chunk order, and which chunks of the key's range they stand for. */
export const TransferContext = Schema.Struct({
  slots: Schema.Array(Slot),
  chunk_indices: Schema.Array(Uint)
})
export type TransferContext = typeof TransferContext.Type

export const PrepareStoreResponse = Schema.Struct({ context: TransferContext })
export type PrepareStoreResponse = typeof PrepareStoreResponse.Type

/** `data` carries inline chunk bytes (inline strategy); `context` the slots (shm strategy). */
export const PrepareRetrieveResponse = Schema.Struct({
  success: Schema.Boolean,
  data: Schema.Uint8Array,
  context: Schema.Struct({
    slots: Schema.optionalKey(Schema.Array(Slot)),
    chunk_indices: Schema.optionalKey(Schema.Array(Uint))
  })
})
export type PrepareRetrieveResponse = typeof PrepareRetrieveResponse.Type
