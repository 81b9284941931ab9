/**
 * Worker instance ids: 63 random bits (DESIGN §3, §6; upstream
 * `uuid4().int & ((1 << 63) - 1)`), always `bigint` in TypeScript so that the
 * full range round-trips exactly.
 */
import { Schema, SchemaGetter } from "effect"

/** The largest instance id, 2^63 − 1. */
export const MAX_INSTANCE_ID = (1n << 63n) - 1n

/** A decoded instance id: a branded bigint in [0, 2^63 − 1]. */
export const InstanceId = Schema.BigInt.pipe(
  Schema.check(Schema.isBetweenBigInt({ minimum: 0n, maximum: MAX_INSTANCE_ID })),
  Schema.brand("InstanceId")
)
export type InstanceId = typeof InstanceId.Type

/**
 * Wire form: a MessagePack int. Other stacks send small ids as plain ints
 * (msgpackr gives a `number`) and large ones as int64/uint64 (a `bigint`); both
 * decode to {@link InstanceId}. Encodes as a bigint, which msgpackr packs as
 * int64 — exact for every id. A float, a negative or ≥ 2^63 value fails.
 */
export const InstanceIdWire = Schema.Union([Schema.BigInt, Schema.Int]).pipe(
  Schema.decodeTo(InstanceId, {
    decode: SchemaGetter.transform((n: bigint | number) => BigInt(n)),
    encode: SchemaGetter.transform((b: bigint) => b)
  })
)

/** Builds an {@link InstanceId}; throws on a value outside [0, 2^63 − 1]. For tests and constants. */
export const makeInstanceId = (n: bigint | number): InstanceId => InstanceId.make(BigInt(n))

/** Formats an id as upstream logs it: a decimal string. */
export const formatInstanceId = (id: bigint): string => id.toString(10)
