/**
 * Worker instance ids (DESIGN §6; upstream #3631): 63 random bits of a v4
 * UUID drawn from the OS's crypto randomness — never the PID, which
 * collides across containers (PID 1 in every pod), and never a seeded PRNG.
 */
import { randomUUID } from "node:crypto"
import { Effect } from "effect"
import { type InstanceId, makeInstanceId, MAX_INSTANCE_ID } from "../../schema/InstanceId.ts"

/** A fresh instance id: `uuid4 & (2^63 − 1)`. */
export const newInstanceId: Effect.Effect<InstanceId> = Effect.sync(() =>
  makeInstanceId(BigInt(`0x${randomUUID().replaceAll("-", "")}`) & MAX_INSTANCE_ID)
)
