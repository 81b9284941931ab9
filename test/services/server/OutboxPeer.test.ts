/**
 * One peer's record in the send path (src/services/server/internal/OutboxPeer.ts, issue 24 item 10): its own
 * counts of queued and large bytes, its window of the last H+1 sends, its verdict and waiters, exact values.
 */
import { assert, describe, it } from "@effect/vitest"
import {
  bytesOf,
  evictWindow,
  exactFrames,
  holdsNothing,
  keyOf,
  newPeer,
  pushQueued,
  queueLength,
  recordSent,
  replaceHead,
  shiftQueued,
  SMALL_REPLY_BYTES,
  type Verdict,
  verdictOf
} from "../../../src/services/server/internal/OutboxPeer.ts"

const routingId = Buffer.from([0, 0xff, 0x41])
const fresh = () => newPeer(keyOf(routingId), routingId)
const queued = (bytes: number) => ({ message: [routingId, Buffer.alloc(bytes)], bytes })

describe("OutboxPeer", () => {
  it("keys a routing id by its bytes as latin1 and names it in hex", () => {
    const p = fresh()
    assert.strictEqual(p.key, "\u0000\u00ffA")
    assert.strictEqual(p.hex, "00ff41")
    assert.isTrue(holdsNothing(p))
  })

  it("bytesOf counts the frames after the routing id", () => {
    assert.strictEqual(bytesOf([routingId, Buffer.alloc(3), Buffer.alloc(4)]), 7)
  })

  it("queues count all bytes and large bytes apart; a large head leaving tells the waiters", () => {
    const p = fresh()
    const told: Array<Verdict> = []
    pushQueued(p, queued(10))
    pushQueued(p, queued(SMALL_REPLY_BYTES + 1))
    assert.deepStrictEqual([queueLength(p), p.queuedBytes, p.queuedLargeBytes], [2, 10 + SMALL_REPLY_BYTES + 1, SMALL_REPLY_BYTES + 1])
    assert.strictEqual(verdictOf(p), undefined)
    p.clearWaiters.push((v) => told.push(v))
    assert.strictEqual(shiftQueued(p).bytes, 10)
    assert.deepStrictEqual(told, [])
    assert.strictEqual(shiftQueued(p).bytes, SMALL_REPLY_BYTES + 1)
    assert.deepStrictEqual(told, ["clear"])
    assert.deepStrictEqual([queueLength(p), p.queuedBytes, p.queuedLargeBytes, p.head, p.queue.length], [0, 0, 0, 0, 0])
  })

  it("a stalled peer's verdict is stalled; a gone one is clear", () => {
    const p = fresh()
    p.stalled = true
    assert.strictEqual(verdictOf(p), "stalled")
    p.gone = true
    assert.strictEqual(verdictOf(p), "clear")
  })

  it("replaceHead swaps a large head for its refusal and returns the change in bytes", () => {
    const p = fresh()
    pushQueued(p, queued(5_000))
    assert.strictEqual(replaceHead(p, queued(100)), -4_900)
    assert.deepStrictEqual([queueLength(p), p.queuedBytes, p.queuedLargeBytes], [1, 100, 0])
  })

  it("the window holds the large messages among the last H+1 sends only", () => {
    const p = fresh()
    const windowSize = 3
    for (const bytes of [2_000, 10, 3_000, 4_000]) {
      p.sent++
      recordSent(p, bytes)
    }
    assert.strictEqual(p.windowBytes, 9_000)
    evictWindow(p, windowSize)
    // Sends 2..4 are the last three: the first (2,000 bytes) has left the window, the small one was never in it.
    assert.strictEqual(p.windowBytes, 7_000)
    p.sent += 2
    evictWindow(p, windowSize)
    assert.strictEqual(p.windowBytes, 4_000)
    p.sent++
    evictWindow(p, windowSize)
    assert.strictEqual(p.windowBytes, 0)
    assert.isTrue(holdsNothing(p))
  })

  it("exactFrames copies a large view into a larger buffer, and leaves small frames and exact buffers alone", () => {
    const backing = Buffer.alloc(10 * SMALL_REPLY_BYTES)
    const view = backing.subarray(0, 2 * SMALL_REPLY_BYTES)
    const exact = Buffer.allocUnsafeSlow(2 * SMALL_REPLY_BYTES)
    const small = backing.subarray(0, 10)
    const message: Array<Uint8Array> = [routingId, view, exact, small]
    exactFrames(message)
    assert.notStrictEqual(message[1], view)
    assert.deepStrictEqual([message[1]!.byteLength, message[1]!.buffer.byteLength], [2 * SMALL_REPLY_BYTES, 2 * SMALL_REPLY_BYTES])
    assert.strictEqual(message[2], exact)
    assert.strictEqual(message[3], small)
  })
})
