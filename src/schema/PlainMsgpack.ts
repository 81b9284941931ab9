/**
 * The pre-scan every frame passes before msgpackr sees it (issue 24 item 3,
 * docs/security.md §3): one linear walk over the MessagePack type bytes that
 * builds nothing and accepts exactly one *plain* value spanning the frame.
 *
 * Threat: msgpackr decodes more than plain MessagePack whatever its options
 * (node_modules/msgpackr/unpack.js 1.12): ext `0x69`/`0x70` (structured-clone
 * ids and pointers) let a 345-byte frame describe a value with 2^26 leaves,
 * which the decoder's own trailing-byte error message, or any code that walks
 * the value, then visits leaf by leaf (28 s of a blocked event loop per frame);
 * ext `0x72` defines records that turn later fixints into objects, `0x62`
 * bundles strings, and the rest build Sets, Errors, RegExps, typed arrays and
 * Dates. The protocol (DESIGN §3) defines no extension type: ints are ints,
 * bytes are `bin`, structs are maps keyed by field name. So the scan refuses
 *
 * - every ext (`fixext 1…16`, `ext 8/16/32`) and the never-used byte `0xc1`;
 * - a map key that is not a string;
 * - a container nested deeper than {@link MAX_NESTING_DEPTH};
 * - a frame of more than {@link MAX_VALUES} values;
 * - a declared length (str, bin, array, map) longer than the bytes left, a
 *   frame that ends inside a value, and bytes after the value;
 *
 * each before anything is allocated for it, and msgpackr then decodes only
 * what passed: values it builds are at most as many as the frame's bytes.
 */

/**
 * The deepest nesting of containers a frame may hold. The protocol's deepest
 * value is 5 containers (PREPARE_STORE's answer: `{context: {slots: [{shape:
 * [int]}]}}`); 16 leaves room for growth while bounding every recursive walk
 * of a decoded value (msgpackr's reader, Schema's parser) to 16 frames.
 */
export const MAX_NESTING_DEPTH = 16

/**
 * The most values one frame may hold, counting every value (a container, each
 * element, each map key and map value). The largest legitimate frame is a
 * CacheKey's `token_ids` (the whole prompt) or a STORE's `block_ids` (one id
 * per block, up to one per token): 2^24 = 16,777,216 covers a 16M-token
 * prompt, beyond every model's context today (10M). A plain value needs at
 * least one byte per value, so this only bounds frames of more than 16 MiB.
 */
export const MAX_VALUES = 16_777_216

/**
 * Why a frame is not one plain MessagePack value: what the rule expected,
 * what the frame holds instead (by type, size and byte offset, never its
 * content), and the offset of the offending type byte.
 */
export interface FrameProblem {
  readonly expected: string
  readonly actual: string
  readonly offset: number
}

/** msgpackr's names for the ext types it decodes (unpack.js `currentExtensions`), for the error message. */
const MSGPACKR_EXT: Readonly<Record<number, string>> = {
  0x00: "undefined",
  0x42: "big integer",
  0x62: "bundled strings",
  0x65: "Error",
  0x69: "structured-clone id",
  0x70: "structured-clone pointer",
  0x72: "record definition",
  0x73: "Set",
  0x74: "typed array",
  0x78: "RegExp",
  0xff: "timestamp"
}

const NO_EXT = "plain MessagePack (the protocol defines no extension types)"

const hex = (b: number): string => `0x${b.toString(16).padStart(2, "0")}`
const count = (n: number): string => n.toLocaleString("en-US")

const extProblem = (frame: Uint8Array, offset: number, typeAt: number): FrameProblem => {
  const type = frame[typeAt]
  const name = type === undefined ? undefined : MSGPACKR_EXT[type]
  const what = type === undefined
    ? "an ext value"
    : `an ext value of type ${hex(type)}${name === undefined ? "" : ` (msgpackr's ${name})`}`
  return { expected: NO_EXT, actual: `${what} at byte ${offset}`, offset }
}

const truncated = (what: string, offset: number, needed: number, left: number, atLeast = false): FrameProblem => ({
  expected: "a value that fits the frame",
  actual: `${what} at byte ${offset} needs ${atLeast ? "at least " : ""}${count(needed)} byte(s), ${count(left)} left`,
  offset
})

// The walk's stack, reused: values still to read per open container, and whether it is a map. The scan is
// synchronous, so one copy serves every call.
const remaining = new Float64Array(MAX_NESTING_DEPTH + 1)
const isMap = new Uint8Array(MAX_NESTING_DEPTH + 1)

/**
 * Checks that `frame` holds exactly one plain MessagePack value within the
 * limits above, without decoding it. Returns undefined when it does, else the
 * first problem found. Linear in the number of values (a `bin` or `str` is
 * skipped by its length), no allocation on success. Source: issue 24 item 3;
 * the MessagePack spec's formats (msgpack/spec.md).
 */
export const scanPlain = (frame: Uint8Array): FrameProblem | undefined => {
  const n = frame.length
  if (n === 0) return { expected: "one MessagePack value", actual: "an empty frame", offset: 0 }
  let pos = 0
  let values = 0
  let depth = 0
  remaining[0] = 1
  isMap[0] = 0
  for (;;) {
    while (remaining[depth] === 0) {
      if (depth === 0) {
        return pos === n
          ? undefined
          : { expected: "exactly one MessagePack value", actual: `${count(n - pos)} byte(s) after the value that ends at byte ${pos}`, offset: pos }
      }
      depth--
    }
    if (isMap[depth] === 0) {
      // The bulk of real frames: runs of unsigned ints in an array (token_ids, block_ids), skipped in a tight
      // loop. Anything else, a value that would not fit, and the value past the bound go the general way below.
      let left = remaining[depth]!
      const until = Math.min(left, MAX_VALUES - values)
      let run = 0
      while (run < until && pos < n) {
        const t = frame[pos]!
        const size = t <= 0x7f ? 1 : t === 0xcd ? 3 : t === 0xce ? 5 : t === 0xcc ? 2 : 0
        if (size === 0 || pos + size > n) break
        pos += size
        run++
      }
      if (run > 0) {
        values += run
        left -= run
        remaining[depth] = left
        if (left === 0) continue
      }
    }
    if (pos >= n) {
      return { expected: "a value that fits the frame", actual: `the frame ends at byte ${n} where a value was expected`, offset: n }
    }
    // In a map, keys and values alternate and `remaining` counts both: an even count left means a key is next.
    const isKey = isMap[depth] === 1 && remaining[depth]! % 2 === 0
    remaining[depth] = remaining[depth]! - 1
    if (++values > MAX_VALUES) {
      return { expected: `at most ${count(MAX_VALUES)} values in a frame`, actual: `value ${count(values)} at byte ${pos}`, offset: pos }
    }
    const at = pos
    const t = frame[pos]!
    const left = n - pos
    if (isKey && !(t >= 0xa0 && t <= 0xbf) && t !== 0xd9 && t !== 0xda && t !== 0xdb) {
      return { expected: "map keys that are strings (field names)", actual: `a key of type byte ${hex(t)} at byte ${at}`, offset: at }
    }
    // Scalars: `size` bytes in all. Containers: a header of `head` bytes and `children` values.
    let size = 0
    let head = 0
    let children = -1
    let map = 0
    if (t <= 0x7f || t >= 0xe0) size = 1
    else if (t <= 0x8f) {
      head = 1
      children = (t & 0x0f) * 2
      map = 1
    } else if (t <= 0x9f) {
      head = 1
      children = t & 0x0f
    } else if (t <= 0xbf) size = 1 + (t & 0x1f)
    else {
      switch (t) {
        case 0xc0:
        case 0xc2:
        case 0xc3:
          size = 1
          break
        case 0xc1:
          return { expected: "a MessagePack type byte", actual: `the never-used byte 0xc1 at byte ${at}`, offset: at }
        case 0xc4:
        case 0xd9:
          if (left < 2) return truncated(t === 0xc4 ? "a bin 8 header" : "a str 8 header", at, 2, left)
          size = 2 + frame[pos + 1]!
          break
        case 0xc5:
        case 0xda:
          if (left < 3) return truncated(t === 0xc5 ? "a bin 16 header" : "a str 16 header", at, 3, left)
          size = 3 + ((frame[pos + 1]! << 8) | frame[pos + 2]!)
          break
        case 0xc6:
        case 0xdb:
          if (left < 5) return truncated(t === 0xc6 ? "a bin 32 header" : "a str 32 header", at, 5, left)
          size = 5 + u32(frame, pos + 1)
          break
        case 0xc7:
          return extProblem(frame, at, pos + 2)
        case 0xc8:
          return extProblem(frame, at, pos + 3)
        case 0xc9:
          return extProblem(frame, at, pos + 5)
        case 0xd4:
        case 0xd5:
        case 0xd6:
        case 0xd7:
        case 0xd8:
          return extProblem(frame, at, pos + 1)
        case 0xca:
          size = 5
          break
        case 0xcb:
          size = 9
          break
        case 0xcc:
        case 0xd0:
          size = 2
          break
        case 0xcd:
        case 0xd1:
          size = 3
          break
        case 0xce:
        case 0xd2:
          size = 5
          break
        case 0xcf:
        case 0xd3:
          size = 9
          break
        case 0xdc:
        case 0xde:
          if (left < 3) return truncated(t === 0xdc ? "an array 16 header" : "a map 16 header", at, 3, left)
          head = 3
          map = t === 0xde ? 1 : 0
          children = ((frame[pos + 1]! << 8) | frame[pos + 2]!) * (map + 1)
          break
        default: // 0xdd, 0xdf: the only type bytes left
          if (left < 5) return truncated(t === 0xdd ? "an array 32 header" : "a map 32 header", at, 5, left)
          head = 5
          map = t === 0xdf ? 1 : 0
          children = u32(frame, pos + 1) * (map + 1)
      }
    }
    if (children < 0) {
      if (size > left) return truncated(scalarName(t, size), at, size, left)
      pos += size
      continue
    }
    if (depth + 1 > MAX_NESTING_DEPTH) {
      return {
        expected: `containers nested at most ${MAX_NESTING_DEPTH} deep`,
        actual: `${map === 1 ? "a map" : "an array"} nested ${depth + 1} deep at byte ${at}`,
        offset: at
      }
    }
    pos += head
    // Each value takes at least one byte: a declared count the rest of the frame cannot hold is refused here.
    if (children > n - pos) {
      const what = map === 1 ? `a map of ${count(children / 2)} entries` : `an array of ${count(children)} elements`
      return truncated(what, at, head + children, left, true)
    }
    depth++
    remaining[depth] = children
    isMap[depth] = map
  }
}

const u32 = (b: Uint8Array, i: number): number => ((b[i]! << 24) >>> 0) + ((b[i + 1]! << 16) | (b[i + 2]! << 8) | b[i + 3]!)

/** The MessagePack names of the fixed-size scalar formats, for a truncation message. */
const FIXED_NAMES: Readonly<Record<number, string>> = {
  0xca: "a float 32",
  0xcb: "a float 64",
  0xcc: "a uint 8",
  0xcd: "a uint 16",
  0xce: "a uint 32",
  0xcf: "a uint 64",
  0xd0: "an int 8",
  0xd1: "an int 16",
  0xd2: "an int 32",
  0xd3: "an int 64"
}

/** A scalar's format and, for a string or bin, its declared size: what a truncation message names. */
const scalarName = (t: number, size: number): string =>
  t >= 0xa0 && t <= 0xbf || t === 0xd9 || t === 0xda || t === 0xdb
    ? `a string of ${count(size - (t <= 0xbf ? 1 : t === 0xd9 ? 2 : t === 0xda ? 3 : 5))} bytes`
    : t === 0xc4 || t === 0xc5 || t === 0xc6
    ? `a bin of ${count(size - (t === 0xc4 ? 2 : t === 0xc5 ? 3 : 5))} bytes`
    : FIXED_NAMES[t] ?? `the type byte ${hex(t)}`
