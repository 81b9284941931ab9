/**
 * CacheKey: upstream IPCCacheEngineKey (DESIGN §3.2; reference §3.4). A map on
 * the wire keyed by snake_case field names. `token_ids` is the full token
 * prefix, `[start, end)` the chunk-aligned range of this op; `request_id` is
 * session tracking only (not part of equality); `cache_salt` isolates tenants
 * and defaults to "" when absent (how upstream added it without breaking the
 * wire). Every count is bounded (issue 24 item 5, src/schema/Limits.ts):
 * `world_size` ≤ `MAX_WORLD_SIZE` with `worker_id` below it, at most
 * `MAX_TOKEN_IDS` tokens, `request_id` ≤ `MAX_REQUEST_ID_LENGTH` and
 * `model_name` ≤ `MAX_MODEL_NAME_LENGTH` characters.
 */
import { Effect, Schema } from "effect"
import { WireString } from "./Text.ts"
import { Uint } from "./Integer.ts"
import { TokenIds } from "./IntArrays.ts"
import { atMost, atMostLength, MAX_MODEL_NAME_LENGTH, MAX_REQUEST_ID_LENGTH, MAX_WORLD_SIZE } from "./Limits.ts"

/** Upstream's salt rule: at most 128 characters, none of `@ / \ NUL`. */
const CacheSalt = WireString.check(
  Schema.isMaxLength(128),
  Schema.makeFilter((s: string) => /[@/\\\0]/.test(s) ? "must not contain '@', '/', '\\' or NUL" : undefined)
)

/** A model's name (CacheKey, REGISTER, engine-driven context): at most `MAX_MODEL_NAME_LENGTH` characters. */
export const ModelName = WireString.check(atMostLength(MAX_MODEL_NAME_LENGTH, "characters (MAX_MODEL_NAME_LENGTH)"))

/** A world size: 1 … `MAX_WORLD_SIZE` kv ranks. */
export const WorldSize = Uint.check(Schema.isGreaterThanOrEqualTo(1), atMost(MAX_WORLD_SIZE, "kv ranks, MAX_WORLD_SIZE"))

/**
 * A request id (CacheKey, QUERY_PREFETCH_STATUS, END_SESSION): at most
 * `MAX_REQUEST_ID_LENGTH` characters; the server keeps it while the lookup
 * is pending (issue 24 item 6).
 */
export const RequestId = WireString.check(atMostLength(MAX_REQUEST_ID_LENGTH, "characters (MAX_REQUEST_ID_LENGTH)"))

/** The fields of a CacheKey (without the range and rank rules). */
export const CacheKeyFields = {
  model_name: ModelName,
  world_size: WorldSize,
  /** The kv rank this worker owns (below `world_size`); nil for scheduler lookups (expands to every rank). */
  worker_id: Schema.NullOr(Uint),
  token_ids: TokenIds,
  start: Uint,
  end: Uint,
  request_id: RequestId,
  cache_salt: CacheSalt.pipe(Schema.withDecodingDefaultKey(Effect.succeed("")))
}

export const CacheKey = Schema.Struct(CacheKeyFields).check(
  Schema.makeFilter((k) =>
    k.start > k.end
      ? `start (${k.start}) must not exceed end (${k.end})`
      : k.end > k.token_ids.length
      ? `end (${k.end}) must not exceed the number of token_ids (${k.token_ids.length})`
      : k.worker_id !== null && k.worker_id >= k.world_size
      ? `worker_id (${k.worker_id}) must be below world_size (${k.world_size})`
      : undefined
  )
)
export type CacheKey = typeof CacheKey.Type
