/**
 * CBMatch (DESIGN §3.2; upstream CBMatchResult): a cached token range
 * `[old_st, old_ed)` of the chunk with `hash`, to be placed at the new
 * positions `[cur_st, cur_ed)` by CB_RETRIEVE_PRE_COMPUTED.
 */
import { Schema } from "effect"
import { Uint } from "./Integer.ts"

export const CbMatch = Schema.Struct({
  old_st: Uint,
  old_ed: Uint,
  cur_st: Uint,
  cur_ed: Uint,
  hash: Schema.Uint8Array
})
export type CbMatch = typeof CbMatch.Type
