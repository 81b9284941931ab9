/**
 * How an error message names a value that arrived (issue 24 item 3): by its
 * type and size, never by serialising it. Threat: a small frame that decodes
 * into a large or deeply shared value (or a plain 16 MiB one) turned into a
 * message by `JSON.stringify` or `String()`, which walks every element on the
 * event loop and copies it into the reply and the log.
 */

/** Strings up to this many UTF-16 units are quoted in full; longer ones are described by their length. */
export const QUOTED_STRING_MAX = 32

const plural = (n: number, one: string, many: string): string => `${n.toLocaleString("en-US")} ${n === 1 ? one : many}`

/**
 * A short description of `value` for the `actual` of an error: a scalar as
 * itself (`-1`, `5n`, `true`, `nil`, `"NHD"` up to {@link QUOTED_STRING_MAX}
 * characters), anything else by type and size ("a string of 1,048,576
 * characters", "a bin of 4 bytes", "an array of 4,096 elements", "a map of 3
 * keys"). It reads a length (or counts a map's keys), never an element's content.
 */
export const describeValue = (value: unknown): string => {
  switch (typeof value) {
    case "undefined":
      return "undefined"
    case "boolean":
      return String(value)
    case "number":
      return Object.is(value, -0) ? "-0" : String(value)
    case "bigint":
      return `${value}n`
    case "string":
      return value.length <= QUOTED_STRING_MAX ? JSON.stringify(value) : `a string of ${plural(value.length, "character", "characters")}`
    case "object":
      if (value === null) return "nil"
      if (value instanceof Uint8Array) return `a bin of ${plural(value.length, "byte", "bytes")}`
      if (Array.isArray(value)) return `an array of ${plural(value.length, "element", "elements")}`
      if (Object.getPrototypeOf(value) === Object.prototype || Object.getPrototypeOf(value) === null) {
        let keys = 0
        for (const _ in value) keys++
        return `a map of ${plural(keys, "key", "keys")}`
      }
      return `an object (${value.constructor?.name ?? "no constructor"})`
    default:
      return `a ${typeof value}`
  }
}
