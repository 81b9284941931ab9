/**
 * The one-pass integer arrays (src/schema/IntArrays.ts) against the
 * element-wise schemas they replace: for any input — valid ids, negatives,
 * fractions, -0, out-of-range numbers, bigints, strings, nested arrays,
 * non-arrays — the same decoded value or the same error message and path.
 */
import { assert, describe, it } from "@effect/vitest"
import { Arbitrary, Exit, Schema } from "effect"
import fc from "fast-check"
import { TokenId, Uint } from "../../src/schema/Integer.ts"
import { TokenIds, UintArray } from "../../src/schema/IntArrays.ts"

/** What a decode gives: the value, or the failure's message. */
const outcome = (schema: Schema.Decoder<unknown>, input: unknown): { readonly ok: unknown } | { readonly error: string } => {
  const exit = Schema.decodeUnknownExit(schema)(input)
  if (Exit.isSuccess(exit)) return { ok: exit.value }
  const failure = exit.cause.reasons.find((r) => r._tag === "Fail")
  return { error: failure !== undefined && failure._tag === "Fail" ? (failure.error as Schema.SchemaError).message : "no failure" }
}

const element = fc.oneof(
  fc.integer({ min: 0, max: 0xffff_ffff }),
  fc.integer({ min: 0, max: 0xffff_ffff }),
  fc.constantFrom(-1, -0, 0.5, 2 ** 32, 2 ** 53, 2 ** 53 - 1, -(2 ** 53), Number.NaN, Infinity),
  fc.double(),
  fc.bigInt({ min: -5n, max: 2n ** 64n }),
  fc.constantFrom(0n, 7n, 2n ** 53n - 1n, 2n ** 53n),
  fc.string({ maxLength: 3 }),
  fc.constantFrom(null, undefined, true, [1], { a: 1 })
)
/** Arrays that are mostly valid, with now and then one bad element somewhere, or no array at all. */
const input = fc.oneof(
  fc.array(fc.integer({ min: 0, max: 0xffff_ffff }), { maxLength: 40 }),
  fc.array(element, { maxLength: 12 }),
  fc.tuple(fc.array(fc.nat(), { maxLength: 20 }), element, fc.array(fc.nat(), { maxLength: 5 })).map(([a, e, b]) => [...a, e, ...b]),
  element
)

describe("TokenIds and UintArray", () => {
  it("TokenIds decodes as Schema.Array(TokenId) does: same value or same message", () => {
    fc.assert(fc.property(input, (u) => assert.deepStrictEqual(outcome(TokenIds, u), outcome(Schema.Array(TokenId), u))), {
      numRuns: 2000,
      seed: 16
    })
  })

  it("UintArray decodes as Schema.Array(Uint) does: same value (bigints made numbers) or same message", () => {
    fc.assert(fc.property(input, (u) => assert.deepStrictEqual(outcome(UintArray, u), outcome(Schema.Array(Uint), u))), {
      numRuns: 2000,
      seed: 16
    })
  })

  it("names the first bad element's index, and copies the input only to turn bigints into numbers", () => {
    assert.deepStrictEqual(outcome(Schema.Struct({ token_ids: TokenIds }), { token_ids: [1, 2, -3, 4.5] }), {
      error: `Expected a value between 0 and 4294967295\n  at ["token_ids"][2]`
    })
    const plain = [1, 2, 3]
    const decoded = Schema.decodeUnknownSync(UintArray)(plain)
    assert.strictEqual(decoded, plain)
    assert.deepStrictEqual(Schema.decodeUnknownSync(UintArray)([1, 2n, 3]), [1, 2, 3])
  })

  it("encodes its values unchanged", () => {
    assert.deepStrictEqual(Schema.encodeSync(TokenIds)([0, 4294967295]), [0, 4294967295])
    assert.deepStrictEqual(Schema.encodeSync(UintArray)([0, Number.MAX_SAFE_INTEGER]), [0, Number.MAX_SAFE_INTEGER])
  })

  it.prop("derives arbitraries whose values decode", [Arbitrary.schema(TokenIds), Arbitrary.schema(UintArray)], ([tokens, uints]) => {
    assert.isTrue(Exit.isSuccess(Schema.decodeUnknownExit(TokenIds)(tokens)))
    assert.isTrue(Exit.isSuccess(Schema.decodeUnknownExit(UintArray)(uints)))
  })
})
