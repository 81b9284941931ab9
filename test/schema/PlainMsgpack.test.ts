/**
 * The pre-scan of every frame (issue 24 item 3, src/schema/PlainMsgpack.ts):
 * plain MessagePack passes and round-trips; extension types, the never-used
 * byte, non-string map keys, nesting past the bound, frames of too many
 * values, declared lengths past the frame and bytes after the value are each
 * refused with their own problem, before anything is built.
 */
import { assert, describe, it } from "@effect/vitest"
import fc from "fast-check"
import { pack, unpack } from "../../src/schema/Frame.ts"
import { type FrameProblem, MAX_NESTING_DEPTH, MAX_VALUES, scanPlain } from "../../src/schema/PlainMsgpack.ts"
import { nestedArrays, referenceBomb } from "../support/MsgpackBomb.ts"

const NO_EXT = "plain MessagePack (the protocol defines no extension types)"
const FITS = "a value that fits the frame"

/** Plain values as the protocol's peers send them: every MessagePack type but ext, maps keyed by strings. */
const plainValue: fc.Arbitrary<unknown> = fc.letrec<{ value: unknown }>((tie) => ({
  value: fc.oneof(
    { maxDepth: 6, depthSize: "small" },
    fc.constant(null),
    fc.boolean(),
    fc.integer(),
    fc.maxSafeInteger(),
    // msgpackr packs -0 as the int 0 (src/schema/Registration.ts), so it cannot round-trip.
    fc.double().filter((d) => !Object.is(d, -0)),
    fc.bigInt({ min: -(2n ** 63n), max: 2n ** 64n - 1n }),
    fc.string({ unit: "grapheme", maxLength: 40 }),
    fc.string({ unit: "grapheme", minLength: 300, maxLength: 70_000 }),
    fc.uint8Array({ maxLength: 300 }).map((a) => Buffer.from(a)),
    fc.array(tie("value"), { maxLength: 20 }),
    fc.dictionary(fc.string({ unit: "grapheme", maxLength: 12 }).filter((k) => k !== "__proto__"), tie("value"), { maxKeys: 8 })
  )
})).value

/** The problem scanPlain reports for `bytes` (fails the test when it accepts them). */
const problemOf = (bytes: Uint8Array | ReadonlyArray<number>): FrameProblem => {
  const problem = scanPlain(bytes instanceof Uint8Array ? bytes : Uint8Array.from(bytes))
  if (problem === undefined) return assert.fail(`accepted ${Buffer.from(bytes).toString("hex").slice(0, 80)}`)
  return problem
}

describe("plain MessagePack passes", () => {
  it("every plain value packs to a frame the scan accepts and unpack round-trips", () => {
    fc.assert(fc.property(plainValue, (value) => {
      const frame = pack(value)
      assert.strictEqual(scanPlain(frame), undefined)
      assert.deepStrictEqual(unpack(frame), { value })
    }), { numRuns: 300 })
  })

  it("every strict prefix of a frame is refused as not fitting (MessagePack is prefix-free)", () => {
    fc.assert(fc.property(plainValue, fc.nat(), (value, cut) => {
      const frame = pack(value)
      const prefix = frame.subarray(0, cut % frame.length)
      const problem = scanPlain(prefix)
      if (prefix.length === 0) return assert.deepStrictEqual(problem, { expected: "one MessagePack value", actual: "an empty frame", offset: 0 })
      assert.strictEqual(problem?.expected, FITS)
      assert.isAtMost(problem!.offset, prefix.length)
    }), { numRuns: 300 })
  })

  it("bytes after the value are refused, at the value's end", () => {
    fc.assert(fc.property(plainValue, fc.uint8Array({ minLength: 1, maxLength: 9 }), (value, extra) => {
      const frame = pack(value)
      assert.deepStrictEqual(scanPlain(Buffer.concat([frame, extra])), {
        expected: "exactly one MessagePack value",
        actual: `${extra.length} byte(s) after the value that ends at byte ${frame.length}`,
        offset: frame.length
      })
    }), { numRuns: 200 })
  })

  it("the fixints 0x40-0x7f are ints (no record reading without a record definition)", () => {
    for (let b = 0x40; b <= 0x7f; b++) assert.deepStrictEqual(unpack(Uint8Array.of(b)), { value: b })
  })
})

describe("extension types are refused (the protocol defines none)", () => {
  it("the reference bomb at depths 20-26, with and without the trailing byte: refused at its first byte, in well under a millisecond", () => {
    for (let depth = 20; depth <= 26; depth++) {
      for (const trailing of [true, false]) {
        const bomb = referenceBomb(depth, trailing)
        assert.strictEqual(bomb.length, 9 + 13 * (depth - 1) + (trailing ? 1 : 0))
        assert.deepStrictEqual(scanPlain(bomb), {
          expected: NO_EXT,
          actual: "an ext value of type 0x69 (msgpackr's structured-clone id) at byte 0",
          offset: 0
        })
        assert.strictEqual(unpack(bomb), undefined)
      }
    }
  })

  it("inside a container the offset is the ext's own (a bomb under an array, a pointer under a map)", () => {
    assert.deepStrictEqual(problemOf(Buffer.concat([Buffer.from([0x91]), referenceBomb(22, false)])), {
      expected: NO_EXT,
      actual: "an ext value of type 0x69 (msgpackr's structured-clone id) at byte 1",
      offset: 1
    })
    // {"a": 1, "k": <pointer 0>}
    assert.deepStrictEqual(problemOf([0x82, 0xa1, 0x61, 0x01, 0xa1, 0x6b, 0xd6, 0x70, 0, 0, 0, 0]), {
      expected: NO_EXT,
      actual: "an ext value of type 0x70 (msgpackr's structured-clone pointer) at byte 6",
      offset: 6
    })
  })

  it("every ext type in every ext format (fixext 1/2/4/8/16, ext 8/16/32), msgpackr's record, bundle and undefined among them", () => {
    const formats: ReadonlyArray<readonly [string, (type: number) => Array<number>]> = [
      ["fixext 1", (t) => [0xd4, t, 0]],
      ["fixext 2", (t) => [0xd5, t, 0, 0]],
      ["fixext 4", (t) => [0xd6, t, 0, 0, 0, 0]],
      ["fixext 8", (t) => [0xd7, t, ...new Array<number>(8).fill(0)]],
      ["fixext 16", (t) => [0xd8, t, ...new Array<number>(16).fill(0)]],
      ["ext 8", (t) => [0xc7, 1, t, 0]],
      ["ext 16", (t) => [0xc8, 0, 1, t, 0]],
      ["ext 32", (t) => [0xc9, 0, 0, 0, 1, t, 0]]
    ]
    const named: Record<number, string> = { 0x00: "undefined", 0x62: "bundled strings", 0x72: "record definition", 0xff: "timestamp" }
    for (const [format, bytes] of formats) {
      for (let type = 0; type <= 0xff; type++) {
        const problem = problemOf(bytes(type))
        assert.strictEqual(problem.expected, NO_EXT, format)
        assert.strictEqual(problem.offset, 0, format)
        assert.match(problem.actual, new RegExp(`^an ext value of type 0x${type.toString(16).padStart(2, "0")}( \\(msgpackr's [^)]+\\))? at byte 0$`), format)
        const name = named[type]
        if (name !== undefined) assert.include(problem.actual, `(msgpackr's ${name})`, format)
      }
    }
    // What msgpackr itself packs as an ext is refused too, so it never reaches the wire unnoticed.
    assert.strictEqual(problemOf(pack(undefined)).actual, "an ext value of type 0x00 (msgpackr's undefined) at byte 0")
    assert.strictEqual(problemOf(pack(new Date(0))).actual, "an ext value of type 0xff (msgpackr's timestamp) at byte 0")
  })

  it("an ext header cut short is refused as an ext all the same", () => {
    assert.deepStrictEqual(problemOf([0xd6]), { expected: NO_EXT, actual: "an ext value at byte 0", offset: 0 })
  })
})

describe("the other rules", () => {
  it("the never-used byte 0xc1, at the top or nested", () => {
    assert.deepStrictEqual(problemOf([0xc1]), { expected: "a MessagePack type byte", actual: "the never-used byte 0xc1 at byte 0", offset: 0 })
    assert.deepStrictEqual(problemOf([0x92, 0x01, 0xc1]), { expected: "a MessagePack type byte", actual: "the never-used byte 0xc1 at byte 2", offset: 2 })
  })

  it("map keys must be strings: an int, nil, array or map key is refused", () => {
    for (const [key, byte] of [[[0x01], "0x01"], [[0xc0], "0xc0"], [[0x90], "0x90"], [[0x80], "0x80"]] as const) {
      assert.deepStrictEqual(problemOf([0x81, ...key, 0x01]), {
        expected: "map keys that are strings (field names)",
        actual: `a key of type byte ${byte} at byte 1`,
        offset: 1
      })
    }
    // The second key of a map16: keys and values alternate.
    assert.deepStrictEqual(problemOf([0xde, 0x00, 0x02, 0xa1, 0x61, 0x01, 0x05, 0x01]), {
      expected: "map keys that are strings (field names)",
      actual: "a key of type byte 0x05 at byte 6",
      offset: 6
    })
    assert.strictEqual(scanPlain(pack({ a: 1, b: { c: [1, 2] } })), undefined)
  })

  it(`nesting: ${MAX_NESTING_DEPTH} containers pass, ${MAX_NESTING_DEPTH + 1} are refused at the innermost; a million-deep frame the same`, () => {
    assert.strictEqual(scanPlain(nestedArrays(MAX_NESTING_DEPTH)), undefined)
    assert.deepStrictEqual(unpack(nestedArrays(2)), { value: [[0]] })
    const deep = { expected: `containers nested at most ${MAX_NESTING_DEPTH} deep`, actual: `an array nested 17 deep at byte 16`, offset: 16 }
    assert.deepStrictEqual(scanPlain(nestedArrays(MAX_NESTING_DEPTH + 1)), deep)
    assert.deepStrictEqual(scanPlain(nestedArrays(1_000_000)), deep)
    // Empty containers count as nesting too, and maps as well as arrays.
    assert.deepStrictEqual(scanPlain(Buffer.concat([Buffer.alloc(16, 0x91), Buffer.from([0x80])])), {
      expected: `containers nested at most ${MAX_NESTING_DEPTH} deep`,
      actual: "a map nested 17 deep at byte 16",
      offset: 16
    })
  })

  it("declared lengths past the frame: an array 32 of 2^32-1 elements, a map 32, a str 32 and a bin 32 in a few bytes", () => {
    assert.deepStrictEqual(problemOf([0xdd, 0xff, 0xff, 0xff, 0xff, 0x01]), {
      expected: FITS,
      actual: "an array of 4,294,967,295 elements at byte 0 needs at least 4,294,967,300 byte(s), 6 left",
      offset: 0
    })
    assert.deepStrictEqual(problemOf([0xdf, 0x80, 0x00, 0x00, 0x00]), {
      expected: FITS,
      actual: "a map of 2,147,483,648 entries at byte 0 needs at least 4,294,967,301 byte(s), 5 left",
      offset: 0
    })
    assert.deepStrictEqual(problemOf([0x91, 0xdb, 0x00, 0x10, 0x00, 0x00, 0x61]), {
      expected: FITS,
      actual: "a string of 1,048,576 bytes at byte 1 needs 1,048,581 byte(s), 6 left",
      offset: 1
    })
    assert.deepStrictEqual(problemOf([0xc6, 0x01, 0x00, 0x00, 0x00]), {
      expected: FITS,
      actual: "a bin of 16,777,216 bytes at byte 0 needs 16,777,221 byte(s), 5 left",
      offset: 0
    })
    assert.deepStrictEqual(problemOf([0xcd, 0x01]), { expected: FITS, actual: "a uint 16 at byte 0 needs 3 byte(s), 2 left", offset: 0 })
    assert.deepStrictEqual(problemOf([0xcb, 0x01]), { expected: FITS, actual: "a float 64 at byte 0 needs 9 byte(s), 2 left", offset: 0 })
    // A run of ints in an array cut short: [1, <uint 16 missing a byte>].
    assert.deepStrictEqual(problemOf([0x92, 0x01, 0xcd, 0x01]), { expected: FITS, actual: "a uint 16 at byte 2 needs 3 byte(s), 2 left", offset: 2 })
    assert.deepStrictEqual(problemOf([0xdc, 0x00]), { expected: FITS, actual: "an array 16 header at byte 0 needs 3 byte(s), 2 left", offset: 0 })
    assert.deepStrictEqual(problemOf([0x92, 0x01]), { expected: FITS, actual: "an array of 2 elements at byte 0 needs at least 3 byte(s), 2 left", offset: 0 })
    // Each count fits what is left, the values together do not: [[1], <missing>].
    assert.deepStrictEqual(problemOf([0x92, 0x91, 0x01]), { expected: FITS, actual: "the frame ends at byte 3 where a value was expected", offset: 3 })
  })

  it(`values: a frame of ${MAX_VALUES.toLocaleString("en-US")} values passes, one more is refused at that value`, () => {
    // An array 32 of n fixint zeros: n + 1 values in 5 + n bytes.
    const arrayOf = (n: number) => {
      const b = Buffer.alloc(5 + n)
      b[0] = 0xdd
      b.writeUInt32BE(n, 1)
      return b
    }
    assert.strictEqual(scanPlain(arrayOf(MAX_VALUES - 1)), undefined)
    assert.deepStrictEqual(scanPlain(arrayOf(MAX_VALUES)), {
      expected: "at most 16,777,216 values in a frame",
      actual: `value 16,777,217 at byte ${5 + MAX_VALUES - 1}`,
      offset: 5 + MAX_VALUES - 1
    })
  })

  it("an empty frame", () => {
    assert.deepStrictEqual(scanPlain(new Uint8Array(0)), { expected: "one MessagePack value", actual: "an empty frame", offset: 0 })
  })
})
