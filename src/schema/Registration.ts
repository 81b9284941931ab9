/**
 * REGISTER_KV_CACHE side structs (DESIGN §3.1, reference §3.1) and the
 * registration kinds PING_REGISTERED asks about (DESIGN §3.1, upstream #4732).
 */
import { Schema } from "effect"
import { WireString } from "./Text.ts"
import { Uint } from "./Integer.ts"
import { atMostLength, MAX_LAYERS, MAX_LAYOUT_HINTS } from "./Limits.ts"

/** One engine KV group (hybrid / sliding-window models); one group today. */
export const EngineGroupInfo = Schema.Struct({
  engine_group_id: Uint,
  layer_indices: Schema.Array(Uint).check(atMostLength(MAX_LAYERS, "layers (MAX_LAYERS)")),
  tokens_per_block: Uint
})
export type EngineGroupInfo = typeof EngineGroupInfo.Type

/** msgpackr packs -0 as the int 0, so -0 cannot round-trip either. */
const HintNumber = Schema.Finite.check(Schema.makeFilter((n: number) => Object.is(n, -0) ? "must not be -0" : undefined))
const HintScalar = Schema.Union([Schema.Null, Schema.Boolean, HintNumber, WireString])

/**
 * Layout hints (upstream `LayoutHints` TypedDict, e.g. `{kv_layout: "NHD"}`):
 * a string-keyed map of scalars or lists of scalars, at most
 * `MAX_LAYOUT_HINTS` entries and list elements (issue 24 item 5).
 */
export const LayoutHints = Schema.Record(
  // msgpackr renames a "__proto__" key (prototype-pollution guard), so it cannot round-trip.
  WireString.check(Schema.makeFilter((k: string) => k === "__proto__" ? "must not be __proto__" : undefined)),
  Schema.Union([HintScalar, Schema.Array(HintScalar).check(atMostLength(MAX_LAYOUT_HINTS, "elements (MAX_LAYOUT_HINTS)"))])
).check(
  Schema.makeFilter((hints: object) =>
    Object.keys(hints).length > MAX_LAYOUT_HINTS ? `must have at most ${MAX_LAYOUT_HINTS} entries (MAX_LAYOUT_HINTS)` : undefined
  )
)
export type LayoutHints = typeof LayoutHints.Type

/** The kinds of per-instance state a server can hold for one id. */
export const RegistrationKind = Schema.Literals(["kv_cache", "engine_driven", "cb_rope"])
export type RegistrationKind = typeof RegistrationKind.Type

/** Blend RoPE rotary slice of a KV group: `[offset_elems, width_elems]`, nil for the whole head. */
export const GroupRot = Schema.NullOr(Schema.Tuple([Uint, Uint]))
export type GroupRot = typeof GroupRot.Type
