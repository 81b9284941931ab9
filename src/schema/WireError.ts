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
  "internal"
])
export type ErrorCode = typeof ErrorCode.Type

/** The error frame's body: a MessagePack map `{code, message}`. */
export const ErrorBody = Schema.Struct({ code: ErrorCode, message: Schema.String })
export type ErrorBody = typeof ErrorBody.Type

/** Wrong payload count, or a field that does not decode. The message names op, field, expected and actual. */
export class BadRequest extends Schema.TaggedError<BadRequest>()("BadRequest", { message: Schema.String }) {
  get code(): "bad_request" {
    return "bad_request"
  }
}

/** The op id has no handler on this server. */
export class UnknownOp extends Schema.TaggedError<UnknownOp>()("UnknownOp", { message: Schema.String }) {
  get code(): "unknown_op" {
    return "unknown_op"
  }
}

/** A transfer or PREPARE/COMMIT named an instance id the server does not hold. */
export class NotRegistered extends Schema.TaggedError<NotRegistered>()("NotRegistered", { message: Schema.String }) {
  get code(): "not_registered" {
    return "not_registered"
  }
}

/** The request decodes but cannot be honoured (missing segment, layout mismatch, CUDA unavailable …). */
export class InvalidArgument extends Schema.TaggedError<InvalidArgument>()("InvalidArgument", {
  message: Schema.String
}) {
  get code(): "invalid_argument" {
    return "invalid_argument"
  }
}

/** The server's queue for this pool is full; retry later. */
export class Overloaded extends Schema.TaggedError<Overloaded>()("Overloaded", { message: Schema.String }) {
  get code(): "overloaded" {
    return "overloaded"
  }
}

/** A server-side defect; the server logs it and keeps serving. */
export class Internal extends Schema.TaggedError<Internal>()("Internal", { message: Schema.String }) {
  get code(): "internal" {
    return "internal"
  }
}

/** Any error that travels as an error reply. */
export type WireError = BadRequest | UnknownOp | NotRegistered | InvalidArgument | Overloaded | Internal

/** Rebuilds the tagged error from a decoded error body (client side). */
export const fromErrorBody = (body: ErrorBody): WireError => {
  switch (body.code) {
    case "bad_request":
      return new BadRequest({ message: body.message })
    case "unknown_op":
      return new UnknownOp({ message: body.message })
    case "not_registered":
      return new NotRegistered({ message: body.message })
    case "invalid_argument":
      return new InvalidArgument({ message: body.message })
    case "overloaded":
      return new Overloaded({ message: body.message })
    case "internal":
      return new Internal({ message: body.message })
  }
}

/** True for the tagged errors of this module. */
export const isWireError = (u: unknown): u is WireError =>
  u instanceof BadRequest || u instanceof UnknownOp || u instanceof NotRegistered ||
  u instanceof InvalidArgument || u instanceof Overloaded || u instanceof Internal
