/**
 * Error replies (DESIGN §3): `[uid, op, "MPCACHE_ERR", {code, message}]`.
 * Each wire code has one tagged error, named noun + problem; handlers fail
 * with these and the server turns them into error replies, the client turns
 * error replies back into them. Upstream sends no reply on errors and its
 * clients hang until a timeout (reference §1.6); mpcache always answers.
 */
import { Schema } from "effect"

/** The wire error codes of DESIGN §3. */
export const ErrorCode = Schema.Literals([
  "bad_request",
  "unknown_op",
  "not_registered",
  "invalid_argument",
  "overloaded",
  "internal",
  "forbidden"
])
export type ErrorCode = typeof ErrorCode.Type

/**
 * What an error is about, as data (each key optional, absent when it does
 * not apply): the op, the instance (decimal id), the payload field, what was
 * expected and what arrived. A client in any language reads these keys of
 * the error body instead of parsing the message; the message is built from
 * them where they are given.
 */
export const ErrorDetail = Schema.Struct({
  op: Schema.optionalKey(Schema.String),
  instance_id: Schema.optionalKey(Schema.String),
  field: Schema.optionalKey(Schema.String),
  expected: Schema.optionalKey(Schema.String),
  actual: Schema.optionalKey(Schema.String)
})
export type ErrorDetail = typeof ErrorDetail.Type

/** The keys of {@link ErrorDetail}, in wire order. */
const DETAIL_KEYS = ["op", "instance_id", "field", "expected", "actual"] as const

/** The error frame's body: a MessagePack map `{code, message}` plus the detail keys that apply. */
export const ErrorBody = Schema.Struct({ code: ErrorCode, message: Schema.String, ...ErrorDetail.fields })
export type ErrorBody = typeof ErrorBody.Type

/** The fields of every wire error: its message and its detail. */
const errorFields = { message: Schema.String, ...ErrorDetail.fields }

/** Wrong payload count, or a field that does not decode. The detail names op, field, expected and actual. */
export class BadRequest extends Schema.TaggedError<BadRequest>()("BadRequest", errorFields) {
  get code(): "bad_request" {
    return "bad_request"
  }
}

/** The op id has no handler on this server. */
export class UnknownOp extends Schema.TaggedError<UnknownOp>()("UnknownOp", errorFields) {
  get code(): "unknown_op" {
    return "unknown_op"
  }
}

/** A transfer or PREPARE/COMMIT named an instance id the server does not hold. */
export class NotRegistered extends Schema.TaggedError<NotRegistered>()("NotRegistered", errorFields) {
  get code(): "not_registered" {
    return "not_registered"
  }
}

/** The request decodes but cannot be honoured (missing segment, layout mismatch, CUDA unavailable …). */
export class InvalidArgument extends Schema.TaggedError<InvalidArgument>()("InvalidArgument", errorFields) {
  get code(): "invalid_argument" {
    return "invalid_argument"
  }
}

/** The server's queue for this pool is full; retry later. */
export class Overloaded extends Schema.TaggedError<Overloaded>()("Overloaded", errorFields) {
  get code(): "overloaded" {
    return "overloaded"
  }
}

/** A server-side defect; the server logs it and keeps serving. */
export class Internal extends Schema.TaggedError<Internal>()("Internal", errorFields) {
  get code(): "internal" {
    return "internal"
  }
}

/**
 * The request names what its tenant may not touch (another tenant's
 * instance, CLEAR without `admin`), or its connection has not said HELLO
 * (`field: "hello"`) (docs/security.md). Nothing was changed.
 */
export class Forbidden extends Schema.TaggedError<Forbidden>()("Forbidden", errorFields) {
  get code(): "forbidden" {
    return "forbidden"
  }
}

/** Any error that travels as an error reply. */
export type WireError = BadRequest | UnknownOp | NotRegistered | InvalidArgument | Overloaded | Internal | Forbidden

/** The detail keys `error` carries (absent ones left out). */
export const detailOf = (error: ErrorDetail): ErrorDetail => {
  const out: { -readonly [K in keyof ErrorDetail]?: string } = {}
  for (const k of DETAIL_KEYS) {
    const v = error[k]
    if (v !== undefined) out[k] = v
  }
  return out
}

/** The error body of `error` (server side): code, message and its detail keys. */
export const errorBodyOf = (error: WireError): ErrorBody => ({ code: error.code, message: error.message, ...detailOf(error) })

/** Rebuilds the tagged error from a decoded error body (client side), detail included. */
export const fromErrorBody = (body: ErrorBody): WireError => {
  const fields = { message: body.message, ...detailOf(body) }
  switch (body.code) {
    case "bad_request":
      return new BadRequest(fields)
    case "unknown_op":
      return new UnknownOp(fields)
    case "not_registered":
      return new NotRegistered(fields)
    case "invalid_argument":
      return new InvalidArgument(fields)
    case "overloaded":
      return new Overloaded(fields)
    case "internal":
      return new Internal(fields)
    case "forbidden":
      return new Forbidden(fields)
  }
}

/** True for the tagged errors of this module. */
export const isWireError = (u: unknown): u is WireError =>
  u instanceof BadRequest || u instanceof UnknownOp || u instanceof NotRegistered ||
  u instanceof InvalidArgument || u instanceof Overloaded || u instanceof Internal || u instanceof Forbidden

// ---------------------------------------------------------------------------
// Errors built from their fields: the message is written once, here, per kind.
// ---------------------------------------------------------------------------

/** `<op>: expected <expected>, got <actual>`: a count or shape that does not match (`field` names what). */
export const mismatch = (d: { readonly op: string; readonly field: string; readonly expected: string; readonly actual: string }) =>
  new BadRequest({ ...d, message: `${d.op}: expected ${d.expected}, got ${d.actual}` })

/** `<op>: <field>: <expected>; actual: <actual>`: a payload or response value that does not decode. */
export const undecodable = (d: { readonly op: string; readonly field: string; readonly expected: string; readonly actual: string }) =>
  new BadRequest({ ...d, message: `${d.op}: ${d.field}: ${d.expected}; actual: ${d.actual}` })

/** `<op> (<id>) is not served by this server` (a known op no module serves). */
export const notServed = (op: string, opId: number) =>
  new UnknownOp({ op, actual: String(opId), message: `op ${op} (${opId}) is not served by this server` })
