/**
 * The frame codec shared by the server and every client (DESIGN §3).
 *
 *   request  (DEALER → ROUTER)  [uid, op, p0, …, pn-1]
 *   reply                        [uid, op, response]   or [uid, op] when the op returns nothing
 *   error reply                  [uid, op, "MPCACHE_ERR" (raw ASCII), {code, message}]
 *
 * Every frame is its own MessagePack value (msgpackr, maps as plain objects,
 * int64 as bigint). Decoding is strict: a frame must hold exactly one plain
 * MessagePack value, which the pre-scan (`PlainMsgpack.ts`, issue 24 item 3)
 * checks before msgpackr builds anything: no extension types, string map
 * keys, bounded nesting and value count, lengths within the frame. An error
 * names a bad value by type and size (`ValueDescription.ts`), never by
 * serialising it. The server echoes the uid and op frames of a request byte
 * for byte.
 */
import { Cause, Exit, Option, Schema } from "effect"
import { Packr } from "msgpackr"
import type { InstanceId } from "./InstanceId.ts"
import type { Op, PayloadOf, ResponseOf, WireSchema } from "./Op.ts"
import { type FrameProblem, scanPlain } from "./PlainMsgpack.ts"
import { describeValue } from "./ValueDescription.ts"
import { BadRequest, ErrorBody, errorBodyOf, fromErrorBody, mismatch, undecodable, type WireError } from "./WireError.ts"

/** The marker frame of an error reply: raw ASCII, deliberately not MessagePack. */
export const ERROR_MARKER: Buffer = Buffer.from("MPCACHE_ERR", "ascii")

// What these options still decide once the pre-scan has passed a frame (docs/security.md §3): `useRecords:
// false` packs no record extension (our own frames must pass our own scan), `int64AsType` and `mapsAsObjects`
// shape the decoded value. No `structures`/`getStructures`: shared structures make msgpackr read the fixints
// 0x40–0x7f as records, which no scan of the frame alone can see.
const packr = new Packr({ useRecords: false, int64AsType: "bigint", mapsAsObjects: true })

/** Packs one value into one frame. */
export const pack = (value: unknown): Buffer => packr.pack(value)

/** A frame's one value, or why it is not one plain MessagePack value. */
export type Unpacked =
  | { readonly _tag: "Value"; readonly value: unknown }
  | { readonly _tag: "Problem"; readonly problem: FrameProblem }

/**
 * Unpacks one frame holding exactly one plain MessagePack value, checked by
 * `scanPlain` before msgpackr decodes it (issue 24 item 3); the problem
 * otherwise (by type, size and offset: never the frame's content).
 */
export const unpackFrame = (frame: Uint8Array): Unpacked => {
  const problem = scanPlain(frame)
  if (problem !== undefined) return { _tag: "Problem", problem }
  try {
    return { _tag: "Value", value: packr.unpack(frame) as unknown }
  } catch (e) {
    // Not reached for a frame the scan passed (kept so that a decoder upgrade fails closed, not open).
    const name = e instanceof Error ? e.name : typeof e
    return { _tag: "Problem", problem: { expected: "a value msgpackr decodes", actual: `a frame of ${frame.length} bytes it refused (${name})`, offset: 0 } }
  }
}

/** Unpacks one frame holding exactly one plain MessagePack value; undefined when it does not (see {@link unpackFrame}). */
export const unpack = (frame: Uint8Array): { readonly value: unknown } | undefined => {
  const u = unpackFrame(frame)
  return u._tag === "Value" ? { value: u.value } : undefined
}

/** Reads a non-negative MessagePack int (uid or op); undefined when the frame is anything else. */
export const decodeHeaderInt = (frame: Uint8Array): number | undefined => {
  // Every request carries two of these: the common encodings are read in place (no allocation);
  // anything else (signed int formats, malformed frames) goes through msgpackr.
  const n = frame.length
  const b0 = frame[0]
  if (n === 1 && b0 !== undefined && b0 <= 0x7f) return b0
  if (n === 2 && b0 === 0xcc) return frame[1]
  if (n === 3 && b0 === 0xcd) return (frame[1]! << 8) | frame[2]!
  if (n === 5 && b0 === 0xce) return ((frame[1]! << 24) >>> 0) + ((frame[2]! << 16) | (frame[3]! << 8) | frame[4]!)
  const u = unpack(frame)
  if (u === undefined) return undefined
  const v = u.value
  if (typeof v === "number") return Number.isSafeInteger(v) && v >= 0 ? v : undefined
  if (typeof v === "bigint") return v >= 0n && v <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(v) : undefined
  return undefined
}

/**
 * Reads an instance id frame in place (the MQ server's fast path for a named PING, issue 25 item 4): the
 * encodings of a non-negative int other stacks and msgpackr send (fixint, uint 8/16/32/64, int64), whole frame,
 * value in [0, 2^63 − 1]. Undefined for anything else, including valid ids in rarer encodings (the signed
 * 8/16/32-bit formats): the caller then decodes the frame with the op's Schema (`InstanceIdWire`), which
 * accepts exactly what this accepts and more, and answers its errors.
 */
export const decodeInstanceIdFrame = (frame: Uint8Array): InstanceId | undefined => {
  const n = frame.length
  const b0 = frame[0]
  if (n === 1 && b0 !== undefined && b0 <= 0x7f) return BigInt(b0) as InstanceId
  if (n === 2 && b0 === 0xcc) return BigInt(frame[1]!) as InstanceId
  if (n === 3 && b0 === 0xcd) return BigInt((frame[1]! << 8) | frame[2]!) as InstanceId
  if (n === 5 && b0 === 0xce) return BigInt(((frame[1]! << 24) >>> 0) + ((frame[2]! << 16) | (frame[3]! << 8) | frame[4]!)) as InstanceId
  // uint64 and int64 alike: the top bit clear is exactly [0, 2^63 − 1].
  if (n === 9 && (b0 === 0xcf || b0 === 0xd3) && frame[1]! < 0x80) {
    const hi = ((frame[1]! << 24) >>> 0) + ((frame[2]! << 16) | (frame[3]! << 8) | frame[4]!)
    const lo = ((frame[5]! << 24) >>> 0) + ((frame[6]! << 16) | (frame[7]! << 8) | frame[8]!)
    return ((BigInt(hi) << 32n) | BigInt(lo)) as InstanceId
  }
  return undefined
}

/** The most characters of a Schema failure's text kept in an error (its path may quote a map key of any length). */
const SCHEMA_TEXT_MAX = 300

const oneLine = (s: string): string => {
  const line = s.replace(/\s*\n\s*/g, " ")
  return line.length > SCHEMA_TEXT_MAX ? `${line.slice(0, SCHEMA_TEXT_MAX - 3)}...` : line
}

/** The `BadRequest` for a frame at `field` of `op` that is not one plain MessagePack value. */
const notPlain = (op: string, field: string, problem: FrameProblem): BadRequest =>
  new BadRequest({
    op,
    field,
    expected: problem.expected,
    actual: problem.actual,
    message: `${op}: ${field} is not a single plain MessagePack value: ${problem.actual}; expected ${problem.expected}`
  })

/** A request for `op` with `count` payload frames where the op table has another count (server and decoder). */
export const payloadCountMismatch = (op: Op, count: number): BadRequest =>
  mismatch({
    op: op.name,
    field: "payload",
    expected: `${op.payload.length} payload frame(s) (${op.payload.map(([n]) => n).join(", ") || "none"})`,
    actual: String(count)
  })

/**
 * Decodes the payload frames of a request for `op`.
 *
 * Fails with `BadRequest` when the frame count differs from the op table
 * ("<op>: expected N payload frames, got M"), a frame is not one plain
 * MessagePack value ("<op>: payload 0 (key) is not a single plain MessagePack
 * value: an ext value of type 0x69 … at byte 0; expected …", `expected` and
 * `actual` as fields), or its value does not fit the Schema ("<op>: payload 1
 * (instance_id): Expected …; actual: -1", the actual by type and size).
 */
export const decodePayload = <O extends Op>(
  op: O,
  frames: ReadonlyArray<Uint8Array>
): Exit.Exit<PayloadOf<O>, BadRequest> => {
  if (frames.length !== op.payload.length) {
    return Exit.fail(payloadCountMismatch(op, frames.length))
  }
  const out: Array<unknown> = new Array(frames.length)
  for (let i = 0; i < frames.length; i++) {
    const [name, schema] = op.payload[i]!
    const u = unpackFrame(frames[i]!)
    if (u._tag === "Problem") return Exit.fail(notPlain(op.name, `payload ${i} (${name})`, u.problem))
    const decoded = Schema.decodeUnknownExit(schema)(u.value)
    if (Exit.isFailure(decoded)) {
      return Exit.fail(undecodable({
        op: op.name,
        field: `payload ${i} (${name})`,
        expected: oneLine(errorMessage(decoded.cause)),
        actual: describeValue(u.value)
      }))
    }
    out[i] = decoded.value
  }
  return Exit.succeed(out as unknown as PayloadOf<O>)
}

/** The readable text of a Schema failure (Expected …, at [path]). */
const errorMessage = (cause: Cause.Cause<Schema.SchemaError>): string => {
  const found = Cause.findErrorOption(cause)
  return Option.isSome(found) ? found.value.message : "does not decode"
}

/**
 * Encodes one value against its Schema into a frame. Fails with `BadRequest`
 * when the value does not fit the Schema (a caller passed an out-of-range
 * id, say); the message names `what`.
 */
export const encodeFrame = (
  schema: WireSchema,
  value: unknown,
  what: string
): Exit.Exit<Buffer, BadRequest> => {
  const encoded = Schema.encodeUnknownExit(schema)(value)
  if (Exit.isFailure(encoded)) {
    const expected = oneLine(errorMessage(encoded.cause))
    return Exit.fail(new BadRequest({ field: what, expected, message: `${what}: ${expected}` }))
  }
  return Exit.succeed(pack(encoded.value))
}

/**
 * Encodes a request `[uid, op, p0 … pn-1]`. A payload whose length differs
 * from the op table fails at once, before anything is sent (reference §1.6:
 * a client/server version mismatch), and so does a value that does not fit.
 */
export const encodeRequest = <O extends Op>(
  op: O,
  uid: number,
  payload: PayloadOf<O>
): Exit.Exit<Array<Buffer>, BadRequest> => {
  const values = payload as ReadonlyArray<unknown>
  if (values.length !== op.payload.length) {
    const expected = `${op.payload.length} (${op.payload.map(([n]) => n).join(", ") || "none"})`
    return Exit.fail(
      new BadRequest({
        op: op.name,
        field: "payload",
        expected,
        actual: String(values.length),
        message: `${op.name}: this client sends ${values.length} payload frame(s) but the protocol defines ${expected}; the client and server versions differ`
      })
    )
  }
  const frames: Array<Buffer> = [pack(uid), pack(op.id)]
  for (let i = 0; i < values.length; i++) {
    const [name, schema] = op.payload[i]!
    const f = encodeFrame(schema, values[i], `${op.name}: payload ${i} (${name})`)
    if (Exit.isFailure(f)) return f as Exit.Exit<never, BadRequest>
    frames.push(f.value)
  }
  return Exit.succeed(frames)
}

/**
 * Encodes a success reply. `uidFrame` and `opFrame` are the request's own
 * frames, echoed byte for byte. An op without a response gets `[uid, op]`.
 */
export const encodeReply = <O extends Op>(
  op: O,
  uidFrame: Uint8Array,
  opFrame: Uint8Array,
  response: ResponseOf<O>
): Exit.Exit<Array<Uint8Array>, BadRequest> => {
  if (op.response === undefined) return Exit.succeed([uidFrame, opFrame])
  // A primitive response (PING's true, NOOP's "OK", GET_CHUNK_SIZE's int) encodes the same every time:
  // reuse the frame of the last one (frames are never written to after encoding).
  const primitive = response === null || typeof response !== "object"
  const memo = primitive ? lastPrimitiveReply.get(op.id) : undefined
  if (memo !== undefined && memo.value === response) return Exit.succeed([uidFrame, opFrame, memo.frame])
  const f = encodeFrame(op.response, response, `${op.name}: response`)
  if (Exit.isFailure(f)) return f as Exit.Exit<never, BadRequest>
  if (primitive) lastPrimitiveReply.set(op.id, { value: response, frame: f.value })
  return Exit.succeed([uidFrame, opFrame, f.value])
}

/** The last primitive response encoded per op id, and its frame. */
const lastPrimitiveReply = new Map<number, { readonly value: unknown; readonly frame: Buffer }>()

/** Encodes an error reply `[uid, op, "MPCACHE_ERR", {code, message}]`. */
export const encodeErrorReply = (
  uidFrame: Uint8Array,
  opFrame: Uint8Array,
  error: WireError
): Array<Uint8Array> => [uidFrame, opFrame, ERROR_MARKER, pack(errorBodyOf(error))]

/** A reply as the client first reads it: header plus either the response frames or the error. */
export type ReplyHeader =
  | { readonly _tag: "Ok"; readonly uid: number; readonly opId: number; readonly body: ReadonlyArray<Uint8Array> }
  | { readonly _tag: "Error"; readonly uid: number; readonly opId: number; readonly error: WireError }

/** Reads a reply's uid, op and kind; undefined for a message that is not a reply (logged by the caller). */
export const decodeReplyHeader = (frames: ReadonlyArray<Uint8Array>): ReplyHeader | undefined => {
  if (frames.length < 2) return undefined
  const uid = decodeHeaderInt(frames[0]!)
  const opId = decodeHeaderInt(frames[1]!)
  if (uid === undefined || opId === undefined) return undefined
  if (frames.length === 4 && Buffer.from(frames[2]!.buffer, frames[2]!.byteOffset, frames[2]!.length).equals(ERROR_MARKER)) {
    const u = unpack(frames[3]!)
    const body = u === undefined ? undefined : Schema.decodeUnknownExit(ErrorBody)(u.value)
    if (body === undefined || Exit.isFailure(body)) return undefined
    return { _tag: "Error", uid, opId, error: fromErrorBody(body.value) }
  }
  return { _tag: "Ok", uid, opId, body: frames.slice(2) }
}

/**
 * Decodes the response frames of a success reply for `op`: none for an op
 * without a response, exactly one otherwise. Fails with a message naming the
 * op when the server sent something else (a version mismatch).
 */
export const decodeResponse = <O extends Op>(
  op: O,
  body: ReadonlyArray<Uint8Array>
): Exit.Exit<ResponseOf<O>, BadRequest> => {
  if (op.response === undefined) {
    return body.length === 0
      ? Exit.succeed(undefined as ResponseOf<O>)
      : Exit.fail(mismatch({ op: op.name, field: "response", expected: "no response frame", actual: String(body.length) }))
  }
  if (body.length !== 1) {
    return Exit.fail(mismatch({ op: op.name, field: "response", expected: "1 response frame", actual: String(body.length) }))
  }
  const u = unpackFrame(body[0]!)
  if (u._tag === "Problem") return Exit.fail(notPlain(op.name, "response", u.problem))
  const decoded = Schema.decodeUnknownExit(op.response)(u.value)
  if (Exit.isFailure(decoded)) {
    return Exit.fail(undecodable({
      op: op.name,
      field: "response",
      expected: oneLine(errorMessage(decoded.cause)),
      actual: describeValue(u.value)
    }))
  }
  return Exit.succeed(decoded.value as ResponseOf<O>)
}
