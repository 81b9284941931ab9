/**
 * REGISTER_KV_CACHE side structs (DESIGN §3.1, reference §3.1) and the
 * registration kinds PING_REGISTERED asks about (DESIGN §3.1, upstream #4732).
 */
import { Schema } from "effect"
import { Uint } from "./Integer.ts"

/** One engine KV group (hybrid / sliding-window models); one group today. */
export const EngineGroupInfo = Schema.Struct({
  engine_group_id: Uint,
  layer_indices: Schema.Array(Uint),
  tokens_per_block: Uint
})
export type EngineGroupInfo = typeof EngineGroupInfo.Type

/** Free-form layout hints (upstream `LayoutHints` TypedDict): a string-keyed map. */
export const LayoutHints = Schema.Record(Schema.String, Schema.Unknown)
export type LayoutHints = typeof LayoutHints.Type

/** The kinds of per-instance state a server can hold for one id. */
export const RegistrationKind = Schema.Literals(["kv_cache", "engine_driven", "cb_rope"])
export type RegistrationKind = typeof RegistrationKind.Type

/** Blend RoPE rotary slice of a KV group: `[offset_elems, width_elems]`, nil for the whole head. */
export const GroupRot = Schema.NullOr(Schema.Tuple([Uint, Uint]))
export type GroupRot = typeof GroupRot.Type
