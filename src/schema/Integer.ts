/**
 * Non-negative wire integers. DESIGN §3: integers are MessagePack ints.
 *
 * msgpackr unpacks any uint64/int64-encoded value as a `bigint` (a Python
 * client encodes values ≥ 2^32 that way, e.g. a segment's `nbytes`), and
 * every smaller int as a `number`. Sizes, offsets and counts are exact JS
 * numbers up to 2^53 − 1, so the wire form accepts both and decodes to a
 * safe-integer `number`; anything else is a `bad_request`.
 */
import { Schema, SchemaGetter } from "effect"

const SafeUint = Schema.Int.check(
  Schema.isGreaterThanOrEqualTo(0),
  Schema.isLessThanOrEqualTo(Number.MAX_SAFE_INTEGER),
  Schema.makeFilter((n: number) => Object.is(n, -0) ? "must be an integer, not the float -0" : undefined)
)

const BigUint = Schema.BigInt.check(
  Schema.isBetweenBigInt({ minimum: 0n, maximum: BigInt(Number.MAX_SAFE_INTEGER) })
)

/**
 * A non-negative integer ≤ 2^53 − 1, as a `number`. Wire: any MessagePack int
 * (fixint … uint64). Encodes as the smallest int msgpackr picks.
 */
export const Uint = Schema.Union([SafeUint, BigUint]).pipe(
  Schema.decodeTo(SafeUint, {
    decode: SchemaGetter.transform((n: number | bigint) => Number(n)),
    encode: SchemaGetter.transform((n: number) => n)
  })
)

/** Token id: a uint32 (DESIGN §3.2 hashes tokens as big-endian uint32). */
export const TokenId = Schema.Int.check(
  Schema.isBetween({ minimum: 0, maximum: 0xffff_ffff }),
  Schema.makeFilter((n: number) => Object.is(n, -0) ? "must be an integer, not the float -0" : undefined)
)
