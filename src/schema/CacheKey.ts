/**
 * CacheKey: upstream IPCCacheEngineKey (DESIGN §3.2; reference §3.4). A map on
 * the wire keyed by snake_case field names. `token_ids` is the full token
 * prefix, `[start, end)` the chunk-aligned range of this op; `request_id` is
 * session tracking only (not part of equality); `cache_salt` isolates tenants
 * and defaults to "" when absent (how upstream added it without breaking the
 * wire).
 */
import { Effect, Schema } from "effect"
import { WireString } from "./Text.ts"
import { Uint } from "./Integer.ts"
import { TokenIds } from "./IntArrays.ts"

/** Upstream's salt rule: at most 128 characters, none of `@ / \ NUL`. */
const CacheSalt = WireString.check(
  Schema.isMaxLength(128),
  Schema.makeFilter((s: string) => /[@/\\\0]/.test(s) ? "must not contain '@', '/', '\\' or NUL" : undefined)
)

/** The fields of a CacheKey (without the range rule). */
export const CacheKeyFields = {
  model_name: WireString,
  world_size: Uint.check(Schema.isGreaterThanOrEqualTo(1)),
  /** The kv rank this worker owns; nil for scheduler lookups (expands to every rank). */
  worker_id: Schema.NullOr(Uint),
  token_ids: TokenIds,
  start: Uint,
  end: Uint,
  request_id: WireString,
  cache_salt: CacheSalt.pipe(Schema.withDecodingDefaultKey(Effect.succeed("")))
}

export const CacheKey = Schema.Struct(CacheKeyFields).check(
  Schema.makeFilter((k) =>
    k.start > k.end
      ? `start (${k.start}) must not exceed end (${k.end})`
      : k.end > k.token_ids.length
      ? `end (${k.end}) must not exceed the number of token_ids (${k.token_ids.length})`
      : undefined
  )
)
export type CacheKey = typeof CacheKey.Type
