/**
 * Wire limits (issue 24 item 5; DESIGN §3.2 "Limits"): the largest value of
 * every count in a payload that sizes an allocation or a loop on the server.
 * Threat: one small frame naming a huge count — a `world_size` of 10^8, a
 * million KV groups, a 1 MiB request id kept for minutes — makes the server
 * allocate or loop in proportion to the number instead of to the bytes it
 * received (issue 24: a LOOKUP with `world_size` 100,000,000 held the loop
 * 44 s, then the heap ran out).
 *
 * Each maximum is far above what a real engine sends (the reason is beside
 * it) and is checked by the Schema, so an over-large value is a `bad_request`
 * naming the field and its maximum before any handler runs. Lengths of
 * strings are in UTF-16 code units (JavaScript's `length`).
 */
import { Schema } from "effect"

/**
 * Kv ranks of one model (`world_size`): 1024. The largest tensor-parallel
 * worlds in use are one NVLink domain (72 GPUs of an NVL72 rack); 1024 is 14×
 * that. A LOOKUP with `worker_id` nil visits up to this many ranks per chunk.
 */
export const MAX_WORLD_SIZE = 1024

/**
 * Tokens in one CacheKey (`token_ids`): 2^24 = 16,777,216, above the longest
 * context window of any released model (10M tokens). Also bounds
 * `skip_first_n_tokens` and the block ids of one KV group (a block holds at
 * least one token).
 */
export const MAX_TOKEN_IDS = 1 << 24

/** Block ids of one KV group (`block_ids[g]`): one per block, a block at least one token. */
export const MAX_BLOCK_IDS = MAX_TOKEN_IDS

/**
 * KV groups of one model (`block_ids`, `engine_group_infos`, CB RoPE's
 * `cos_sin_caches`, `group_to_cache`, `group_rot`): 64. Hybrid and
 * sliding-window models have a handful (upstream serves one today).
 */
export const MAX_KV_GROUPS = 64

/**
 * Layers of one model (`kv_caches` descriptors, `num_layers`,
 * `layer_indices`): 1024, 8× the deepest model served today (126 layers).
 */
export const MAX_LAYERS = 1024

/** Dimensions of one tensor (`shape`, `stride`): 8. The protocol's tensors have 5 (KV) or 2 (RoPE tables). */
export const MAX_TENSOR_DIMS = 8

/**
 * Tokens per engine block (`block_size`) and per chunk (`--chunk-size`): 2^20.
 * A block divides the chunk, so it is never larger than the largest chunk.
 */
export const MAX_CHUNK_SIZE_TOKENS = 1 << 20

/**
 * Elements per token of one layer (`hidden_dim_size` = num_heads ×
 * head_size, RoPE's `head_size`): 2^20, 64× the widest KV row in use (128
 * heads × 128). The chunk object it sizes is also checked against L1.
 */
export const MAX_HIDDEN_DIM = 1 << 20

/**
 * CB_RETRIEVE_PRE_COMPUTED's `matches`: 65,536, one per 256-token chunk of a
 * 16M-token prompt. Each match is planned and checked on its own.
 */
export const MAX_CB_MATCHES = 1 << 16

/**
 * Characters of a `request_id`: 256. Upstream's ids are like
 * `cmpl-<uuid>-0` (43 characters); vLLM's longest add a second UUID. The
 * server keeps ids for a lookup's life and, under tenancy, prefixes them with
 * `<salt group>|` (at most 65 more characters, src/services/auth/Tenancy.ts).
 */
export const MAX_REQUEST_ID_LENGTH = 256

/**
 * Characters of a `model_name`: 512. It is part of the key of every L1 object
 * the model stores (src/services/server/ObjectKey.ts), so its length
 * multiplies with L1's object count. Hugging Face ids are at most 96 + 1 + 96
 * characters; a local model path rarely passes 200.
 */
export const MAX_MODEL_NAME_LENGTH = 512

/** Characters of an `engine_type` ("vllm", "sglang" …): 64. */
export const MAX_ENGINE_TYPE_LENGTH = 64

/** Characters of a `shm_name`: 255, the kernel's NAME_MAX for a /dev/shm entry. */
export const MAX_SHM_NAME_LENGTH = 255

/** Characters of a `device_uuid` ("cpu", or "GPU-" and a 36-character UUID): 64. */
export const MAX_DEVICE_UUID_LENGTH = 64

/** Entries of `layout_hints`, and elements of one hint's list: 64. Upstream sends one (`kv_layout`). */
export const MAX_LAYOUT_HINTS = 64

/** PING_REGISTERED's `expected` kinds: 16 (there are three kinds; repeats are harmless but bounded). */
export const MAX_EXPECTED_KINDS = 16

/** A number check `≤ max`, whose failure names the maximum and why (`what`). */
export const atMost = (max: number, what: string) =>
  Schema.isLessThanOrEqualTo(max, { message: `must be at most ${max} (${what})` })

/** A length check (array elements or string characters) `≤ max`, whose failure names the maximum and the unit. */
export const atMostLength = (max: number, unit: string) =>
  Schema.isMaxLength(max, { message: `must have at most ${max} ${unit}` })
