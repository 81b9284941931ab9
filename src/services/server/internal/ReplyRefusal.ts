/**
 * Why the send path refuses a reply, and the `overloaded` error reply that takes its place (issue 24 item 10;
 * ReplyOutbox.ts holds the rules that decide it). The reply names the flag, the bound and what the client can do.
 */
import { decodeHeaderInt, encodeErrorReply } from "../../../schema/Frame.ts"
import { opById } from "../../../schema/Op.ts"
import { Overloaded } from "../../../schema/WireError.ts"

/** The flag that bounds the bytes queued to one peer (named in refusals). */
export const PEER_QUEUED_BYTES_FLAG = "max-queued-reply-bytes-per-peer"

/**
 * Why a reply was refused: one reply over the flag; the outbox of its peer would pass it; its peer's pipe never
 * drained; or the request was not served at all, its peer being stalled (see ReplyOutbox's `whenClear`).
 */
export type RefusalReason = "reply_too_large" | "outbox_full" | "not_drained" | "not_served"

/** The reasons, for metrics and status. */
export const REFUSAL_REASONS: ReadonlyArray<RefusalReason> = ["reply_too_large", "outbox_full", "not_drained", "not_served"]

/** The op's name from its header frame, or `op <id>` where the frame names none. */
const opNameOf = (opFrame: Uint8Array | undefined): string => {
  const id = opFrame === undefined ? undefined : decodeHeaderInt(opFrame)
  return (id === undefined ? undefined : opById.get(id)?.name) ?? `op ${String(id)}`
}

/**
 * The `overloaded` error reply that takes the place of a refused reply `message` (`[routing id, uid, op, ...]`;
 * same routing id, uid and op frames). `bytes`: the refused reply's frames; `held`: bytes already queued to the
 * peer (window or outbox, by reason); `limit`: the flag's value. Its message says what was refused, the bound,
 * and what the client can do.
 */
export const refusalOf = (
  message: Array<Uint8Array>,
  reason: RefusalReason,
  bytes: number,
  held: number,
  limit: number
): Array<Uint8Array> => {
  const op = opNameOf(message[2])
  const what = reason === "reply_too_large"
    ? `its reply of ${bytes} bytes is larger than one connection may have queued`
    : reason === "not_served"
    ? `not served: this connection has not read its earlier replies (its replies are being refused: up to ${held} bytes may still be queued to it)`
    : reason === "outbox_full"
    ? `${held} bytes of earlier replies to this connection are still waiting to be sent, and with this reply of ${bytes} bytes that is more than one connection may have queued`
    : `this connection has not read its earlier replies (up to ${held} bytes may still be queued to it), and with this reply of ${bytes} bytes that is more than one connection may have queued`
  const advice = reason === "reply_too_large" ? "ask for fewer chunks per request" : "read the replies, then retry"
  const error = new Overloaded({
    op,
    field: PEER_QUEUED_BYTES_FLAG,
    expected: `at most ${limit} bytes queued to one connection`,
    actual: reason === "reply_too_large" ? `${bytes} bytes` : reason === "not_served" ? "a stalled connection" : `${held + bytes} bytes`,
    message: `${op}: refused: ${what} (--${PEER_QUEUED_BYTES_FLAG} ${limit}); ${advice}`
  })
  return [message[0]!, ...encodeErrorReply(message[1]!, message[2]!, error)]
}
