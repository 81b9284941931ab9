/**
 * Wire strings. MessagePack strings are UTF-8, so a JavaScript string with a
 * lone surrogate cannot cross the wire intact (it would arrive as U+FFFD).
 * Such a string is refused when encoding rather than silently changed.
 */
import { Schema } from "effect"

/** A string that is well-formed UTF-16 (and so encodes to UTF-8 exactly). */
export const WireString = Schema.String.check(
  Schema.makeFilter((s: string) =>
    s.isWellFormed() ? undefined : "must be well-formed Unicode (no lone surrogates): MessagePack strings are UTF-8"
  )
)
