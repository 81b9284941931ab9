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

/** Why -0 is refused: MessagePack can carry it as a float, which is no integer. */
export const MINUS_ZERO_MESSAGE = "must be an integer, not the float -0"
/** The largest token id (uint32). */
export const MAX_TOKEN_ID = 0xffff_ffff

const notMinusZero = Schema.makeFilter((n: number) => Object.is(n, -0) ? MINUS_ZERO_MESSAGE : undefined)

const SafeUint = Schema.Int.check(
  Schema.isGreaterThanOrEqualTo(0),
  Schema.isLessThanOrEqualTo(Number.MAX_SAFE_INTEGER),
  notMinusZero
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
  Schema.isBetween({ minimum: 0, maximum: MAX_TOKEN_ID }),
  notMinusZero
)
