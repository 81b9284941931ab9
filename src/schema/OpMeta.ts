/**
 * Where an op's payload holds what the server's guards and logs look at
 * (issue 25 item 3: one copy of the rule, used by the MQ server and by
 * tenancy), derived once per op from Op.ts's field names:
 *
 * - the instance: the `instance_id` frame, or `context.instance_id` of a
 *   `context` frame (REGISTER_KV_CACHE_ENGINE_DRIVEN_CONTEXT);
 * - the CacheKeys: every `key` frame;
 * - the bare request ids: every `request_id` frame;
 * - the mapped descriptors: the frame Op.ts's `maps` names.
 *
 * Which ops register and unregister (and which kind) is Op.ts's
 * `registers` / `unregisters`, declared with the op.
 */
import type { InstanceId } from "./InstanceId.ts"
import { type Op, opById } from "./Op.ts"

/** The payload positions of one op. */
export interface OpFields {
  /** Where the instance id sits: frame `index`, itself (`nested` false) or its `instance_id` member. */
  readonly instance: { readonly index: number; readonly nested: boolean } | undefined
  /** Frames holding a CacheKey. */
  readonly keys: ReadonlyArray<number>
  /** Frames holding a bare request id. */
  readonly requestIds: ReadonlyArray<number>
  /** The frame of the descriptors a REGISTER maps (`Op.maps`). */
  readonly mapped: number | undefined
}

const fieldsOfOp = (op: Op): OpFields => {
  const names = op.payload.map(([name]) => name)
  const direct = names.indexOf("instance_id")
  const nested = names.indexOf("context")
  const mapped = op.maps === undefined ? -1 : names.indexOf(op.maps)
  return {
    instance: direct >= 0 ? { index: direct, nested: false } : nested >= 0 ? { index: nested, nested: true } : undefined,
    keys: names.flatMap((n, i) => (n === "key" ? [i] : [])),
    requestIds: names.flatMap((n, i) => (n === "request_id" ? [i] : [])),
    mapped: mapped >= 0 ? mapped : undefined
  }
}

const byId = new Map([...opById.values()].map((op) => [op.id, fieldsOfOp(op)] as const))

/** The payload positions of `op` (computed once per op of the table; an op outside it is derived on the spot). */
export const opFields = (op: Op): OpFields => byId.get(op.id) ?? fieldsOfOp(op)

/** The instance a decoded payload of `op` names, if any (a nil PING names none). */
export const instanceIdOf = (op: Op, payload: ReadonlyArray<unknown>): InstanceId | undefined => {
  const at = opFields(op).instance
  if (at === undefined) return undefined
  const v = at.nested ? (payload[at.index] as { readonly instance_id?: unknown } | undefined)?.instance_id : payload[at.index]
  return typeof v === "bigint" ? v as InstanceId : undefined
}
