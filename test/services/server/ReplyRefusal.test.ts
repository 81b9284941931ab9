/**
 * The refusal that replaces a reply the send path will not queue (src/services/server/internal/ReplyRefusal.ts,
 * issue 24 item 10): an `overloaded` error reply on the request's own routing id, uid and op, naming the flag,
 * the bound and what was refused, for each reason.
 */
import { assert, describe, it } from "@effect/vitest"
import { decodeReplyHeader, pack } from "../../../src/schema/Frame.ts"
import { PrepareRetrieve } from "../../../src/schema/Op.ts"
import { PEER_QUEUED_BYTES_FLAG, REFUSAL_REASONS, type RefusalReason, refusalOf } from "../../../src/services/server/internal/ReplyRefusal.ts"

const routingId = Buffer.from([0, 1, 2, 3, 4])
const request = (opId: number): Array<Uint8Array> => [routingId, pack(7), pack(opId), Buffer.alloc(5_000)]

const refusal = (reason: RefusalReason, opId = PrepareRetrieve.id) => {
  const message = refusalOf(request(opId), reason, 5_000, 9_000, 10_000)
  assert.strictEqual(message[0], routingId)
  const header = decodeReplyHeader(message.slice(1))!
  assert.strictEqual(header._tag, "Error")
  if (header._tag !== "Error") throw new Error("not an error reply")
  assert.deepStrictEqual([header.uid, header.opId], [7, opId])
  return header.error as unknown as { code: string; field: string; expected: string; actual: string; message: string }
}

describe("ReplyRefusal", () => {
  it("lists every reason once", () => {
    assert.deepStrictEqual(REFUSAL_REASONS, ["reply_too_large", "outbox_full", "not_drained", "not_served"])
  })

  it("reply_too_large names the reply's size and asks for fewer chunks", () => {
    const e = refusal("reply_too_large")
    assert.deepStrictEqual([e.code, e.field, e.expected, e.actual], [
      "overloaded",
      PEER_QUEUED_BYTES_FLAG,
      "at most 10000 bytes queued to one connection",
      "5000 bytes"
    ])
    assert.strictEqual(
      e.message,
      `${PrepareRetrieve.name}: refused: its reply of 5000 bytes is larger than one connection may have queued (--max-queued-reply-bytes-per-peer 10000); ask for fewer chunks per request`
    )
  })

  it("outbox_full and not_drained count what is held plus the reply", () => {
    for (const reason of ["outbox_full", "not_drained"] as const) {
      const e = refusal(reason)
      assert.strictEqual(e.actual, "14000 bytes")
      assert.isTrue(e.message.includes("9000 bytes"), e.message)
      assert.isTrue(e.message.endsWith("(--max-queued-reply-bytes-per-peer 10000); read the replies, then retry"), e.message)
    }
  })

  it("not_served names a stalled connection", () => {
    const e = refusal("not_served")
    assert.strictEqual(e.actual, "a stalled connection")
    assert.isTrue(e.message.startsWith(`${PrepareRetrieve.name}: refused: not served:`), e.message)
  })

  it("an op frame that names no op is called by its number", () => {
    assert.isTrue(refusal("reply_too_large", 999).message.startsWith("op 999: refused:"))
  })
})
