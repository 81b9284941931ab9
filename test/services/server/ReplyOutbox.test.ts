/**
 * The send path's rules (src/services/server/internal/ReplyOutbox.ts, issue 24 item 10) over a model of libzmq's
 * pipe to each peer: a pipe takes a message while fewer than H are unread in it (ROUTER_MANDATORY answers EAGAIN
 * otherwise), and a peer that reads takes messages from its front. Time is the TestClock's (the outbox's timers run
 * as Effect sleeps on it); the promise loop is let run with event-loop turns, never with sleeps.
 */
import { assert, describe, it } from "@effect/vitest"
import { Clock, Effect } from "effect"
import { TestClock } from "effect/testing"
import { decodeReplyHeader, encodeReply } from "../../../src/schema/Frame.ts"
import { PrepareRetrieve, Ping } from "../../../src/schema/Op.ts"
import {
  makeReplyOutbox,
  MAX_QUEUED_MESSAGES,
  OUTBOX_FULL_CODE,
  type OutboxClock,
  PROBE_FRAME,
  type ReplyOutbox
} from "../../../src/services/server/internal/ReplyOutbox.ts"
import { SMALL_REPLY_BYTES } from "../../../src/services/server/internal/OutboxPeer.ts"
import type { RefusalReason } from "../../../src/services/server/internal/ReplyRefusal.ts"

const H = 8
const LIMIT = 1_000_000
const WAIT_MS = 1_000

/** One peer's pipe as libzmq keeps it: unread messages, front first. */
interface Pipe {
  readonly unread: Array<Array<Uint8Array>>
  gone: boolean
  /** Messages the peer has taken out of it, in order. */
  readonly taken: Array<Array<Uint8Array>>
}

const bytesOf = (m: Array<Uint8Array>) => m.slice(1).reduce((n, f) => n + f.byteLength, 0)

/** The outbox over modelled pipes, its callbacks recorded, on the TestClock. */
const harness = Effect.gen(function*() {
  const context = yield* Effect.context<never>()
  // The test's TestClock: read synchronously by the outbox, its timers Effect sleeps on it.
  const testClock = yield* Clock.Clock
  const clock: OutboxClock = {
    nowMs: () => testClock.currentTimeMillisUnsafe(),
    after: (ms, run) => void Effect.runForkWith(context)(Effect.sleep(ms).pipe(Effect.andThen(Effect.sync(run))))
  }
  const pipes = new Map<string, Pipe>()
  const pipeOf = (key: string): Pipe => {
    let p = pipes.get(key)
    if (p === undefined) {
      p = { unread: [], gone: false, taken: [] }
      pipes.set(key, p)
    }
    return p
  }
  /** The most bytes any pipe held unread right after a send (the bound under test). */
  let maxUnreadBytes = 0
  const undeliverable: Array<[string, string]> = []
  const refusals: Array<[string, RefusalReason, number]> = []
  const outbox: ReplyOutbox = makeReplyOutbox({
    highWaterMark: H,
    maxQueuedBytesPerPeer: LIMIT,
    replyWaitMs: WAIT_MS,
    clock,
    send: (message) => {
      const pipe = pipeOf(Buffer.from(message[0]!).toString("hex"))
      if (pipe.gone) return Promise.resolve("EHOSTUNREACH")
      if (pipe.unread.length >= H) return Promise.resolve("EAGAIN")
      pipe.unread.push(message)
      maxUnreadBytes = Math.max(maxUnreadBytes, pipe.unread.reduce((n, m) => n + bytesOf(m), 0))
      return Promise.resolve(undefined)
    },
    onUndeliverable: (peer, code) => void undeliverable.push([peer, code]),
    onRefused: (peer, reason, bytes) => void refusals.push([peer, reason, bytes])
  })
  /** Lets the send loop run until it waits (event-loop turns only). */
  const settle = Effect.promise(async () => {
    for (let i = 0; i < 20; i++) await new Promise((resolve) => setImmediate(resolve))
  })
  /** The peer reads everything in its pipe, then the loop runs; repeated `times`. */
  const read = (key: string, times = 1) =>
    Effect.gen(function*() {
      for (let i = 0; i < times; i++) {
        const pipe = pipeOf(key)
        pipe.taken.push(...pipe.unread.splice(0))
        yield* settle
      }
    })
  /** `ms` of TestClock time, 1 ms at a time, the loop let run after each (and `reader`'s pipe read first, if given). */
  const advance = (ms: number, reader?: string) =>
    Effect.gen(function*() {
      for (let i = 0; i < ms; i++) {
        if (reader !== undefined) yield* read(reader)
        yield* TestClock.adjust("1 millis")
        yield* settle
      }
    })
  return { outbox, pipeOf, settle, read, advance, undeliverable, refusals, maxUnreadBytes: () => maxUnreadBytes }
})

const A = Buffer.from([0, 0, 0, 0, 1])
const B = Buffer.from([0, 0, 0, 0, 2])
const keyA = A.toString("hex")
const keyB = B.toString("hex")

/** A PREPARE_RETRIEVE reply of about `bytes` bytes with `uid`. */
const bigReply = (routingId: Buffer, uid: number, bytes: number): Array<Uint8Array> => {
  const frames = Effect.runSync(encodeReply(PrepareRetrieve, Buffer.from([uid]), Buffer.from([PrepareRetrieve.id]), {
    success: true,
    data: Buffer.alloc(bytes, uid),
    context: {}
  }))
  return [routingId, ...frames]
}
const pingReply = (routingId: Buffer, uid: number): Array<Uint8Array> =>
  [routingId, ...Effect.runSync(encodeReply(Ping, Buffer.from([uid]), Buffer.from([Ping.id]), true))]

/** The uids of the replies (not probes) a peer took, and the error codes among them. */
const repliesIn = (taken: ReadonlyArray<Array<Uint8Array>>) =>
  taken.filter((m) => !(m.length === 2 && m[1] === PROBE_FRAME)).map((m) => {
    const h = decodeReplyHeader(m.slice(1))!
    return h._tag === "Ok" ? { uid: h.uid, ok: true as const } : { uid: h.uid, ok: false as const, code: h.error.code, message: h.error.message }
  })

describe("ReplyOutbox", () => {
  it.effect("whenClear: clear at once without a large reply waiting; a reader's request waits for its drain; a non-reader's is not served once it stalls", () =>
    Effect.gen(function*() {
      const h = yield* harness
      assert.strictEqual(h.outbox.whenClear(A), undefined)
      // A fills its pipe with large replies and reads nothing: the next large reply waits for a drain that never comes.
      for (let uid = 0; uid < 5; uid++) {
        h.outbox.reply(bigReply(A, uid, 300_000))
        yield* h.settle
      }
      const waiting = h.outbox.whenClear(A)
      assert.isDefined(waiting)
      let verdict: string | undefined
      void waiting!.then((v) => (verdict = v))
      yield* h.advance(WAIT_MS - 10)
      assert.strictEqual(verdict, undefined)
      // The wait ends at the peer's next turn (its backoff is at most 64 ms).
      yield* h.advance(100)
      assert.strictEqual(verdict, "stalled")
      assert.strictEqual(yield* Effect.promise(() => h.outbox.whenClear(A)!), "stalled")
      // Its next request is not served: counted, answered overloaded naming the flag.
      const refusal = h.outbox.notServed(pingReply(A, 9))
      const header = decodeReplyHeader(refusal.slice(1))!
      assert.deepStrictEqual(header._tag === "Error" ? [header.error.code, header.error.field] : [], ["overloaded", "max-queued-reply-bytes-per-peer"])
      assert.strictEqual(h.outbox.stats().refused.not_served, 1)
      // B reads: its request waits only until its large reply has gone.
      for (let uid = 0; uid < 5; uid++) {
        h.outbox.reply(bigReply(B, uid, 300_000))
        yield* h.settle
      }
      const b = h.outbox.whenClear(B)
      let bVerdict: string | undefined
      if (b !== undefined) void b.then((v) => (bVerdict = v))
      yield* h.advance(200, keyB)
      assert.isTrue(b === undefined || bVerdict === "clear")
      assert.deepStrictEqual(h.refusals.filter(([peer]) => peer === keyB), [])
      assert.strictEqual(h.outbox.whenClear(B), undefined)
    }))

  it.effect("sweepIdle drops the records that hold nothing and keeps one whose window still tracks a large reply", () =>
    Effect.gen(function*() {
      const h = yield* harness
      h.outbox.reply(pingReply(A, 1))
      h.outbox.reply(bigReply(B, 2, 300_000))
      yield* h.settle
      yield* h.read(keyA)
      assert.strictEqual(h.outbox.stats().peers, 2)
      // A got a small reply only: its record is the same as none. B's large reply is still in its window.
      assert.strictEqual(h.outbox.sweepIdle(), 1)
      assert.strictEqual(h.outbox.stats().peers, 1)
      // H small replies later B's window holds nothing tracked either.
      for (let uid = 0; uid < H + 1; uid++) h.outbox.reply(pingReply(B, uid))
      yield* h.read(keyB, 3)
      assert.deepStrictEqual([h.outbox.sweepIdle(), h.outbox.stats().peers], [1, 0])
    }))

  it.effect("a peer that reads gets every large reply, 10 × the bound in all, in order, none refused: probes prove the drain", () =>
    Effect.gen(function*() {
      const h = yield* harness
      const size = 300_000
      for (let uid = 0; uid < 34; uid++) {
        h.outbox.reply(bigReply(A, uid, size))
        yield* h.read(keyA, 3)
      }
      yield* h.read(keyA, 5)
      assert.deepStrictEqual(repliesIn(h.pipeOf(keyA).taken), Array.from({ length: 34 }, (_, uid) => ({ uid, ok: true })))
      assert.deepStrictEqual(h.refusals, [])
      assert.deepStrictEqual(h.undeliverable, [])
      assert.isAbove(h.outbox.stats().drainProbes, 0)
      assert.isAtMost(h.maxUnreadBytes(), LIMIT + H * SMALL_REPLY_BYTES)
      assert.deepStrictEqual({ ...h.outbox.stats(), drainProbes: 0 }, {
        refused: { reply_too_large: 0, outbox_full: 0, not_drained: 0, not_served: 0 },
        drainProbes: 0,
        queuedBytes: 0,
        waitingPeers: 0,
        peers: 1
      })
    }))

  it.effect("a peer that never reads: what its pipe holds stays under the bound; the reply past it is refused after the wait, later ones at once", () =>
    Effect.gen(function*() {
      const h = yield* harness
      const size = 300_000
      for (let uid = 0; uid < 3; uid++) h.outbox.reply(bigReply(A, uid, size))
      yield* h.settle
      // 3 × 300 kB fit the bound of 1 MB; the 4th waits for proof of drain, which a full pipe never gives.
      h.outbox.reply(bigReply(A, 3, size))
      yield* h.settle
      assert.deepStrictEqual(h.refusals, [])
      assert.strictEqual(h.outbox.stats().waitingPeers, 1)
      yield* h.advance(WAIT_MS - 1)
      assert.deepStrictEqual(h.refusals, [])
      // Refused at its first turn past the wait: at most one backoff (64 ms) after it.
      yield* h.advance(64)
      assert.deepStrictEqual(h.refusals, [[keyA, "not_drained", bytesOf(bigReply(A, 3, size))]])
      // Stalled now: the next large replies are refused at their first failed probe, without waiting.
      for (let uid = 4; uid < 10; uid++) {
        h.outbox.reply(bigReply(A, uid, size))
        yield* h.settle
      }
      assert.deepStrictEqual(h.refusals.map(([, r]) => r), Array(7).fill("not_drained"))
      assert.isAtMost(h.maxUnreadBytes(), LIMIT + H * SMALL_REPLY_BYTES)
      // Their error replies could not get into the full pipe either: each dropped and counted.
      assert.deepStrictEqual(h.undeliverable, Array(7).fill([keyA, "EAGAIN"]))
      // What the peer finds once it reads: the 3 replies that fit, and probes; nothing else was kept for it.
      yield* h.read(keyA, 2)
      assert.deepStrictEqual(repliesIn(h.pipeOf(keyA).taken), [0, 1, 2].map((uid) => ({ uid, ok: true })))
      assert.deepStrictEqual(h.outbox.stats().queuedBytes, 0)
      assert.deepStrictEqual(h.outbox.stats().refused, { reply_too_large: 0, outbox_full: 0, not_drained: 7, not_served: 0 })
    }))

  it.effect("a refused reply is answered overloaded naming the flag, in its place among the peer's replies", () =>
    Effect.gen(function*() {
      const h = yield* harness
      h.outbox.reply(bigReply(A, 1, LIMIT + 1))
      h.outbox.reply(pingReply(A, 2))
      yield* h.settle
      const got = repliesIn(h.pipeOf(keyA).unread)
      assert.deepStrictEqual(got.map((r) => [r.uid, r.ok, r.ok ? undefined : r.code]), [[1, false, "overloaded"], [2, true, undefined]])
      const refusal = got[0]!
      assert.isFalse(refusal.ok)
      if (!refusal.ok) {
        assert.match(
          refusal.message,
          /^prepare_retrieve: refused: its reply of \d+ bytes is larger than one connection may have queued \(--max-queued-reply-bytes-per-peer 1000000\); ask for fewer chunks per request$/
        )
      }
      assert.deepStrictEqual(h.refusals.map(([, r]) => r), ["reply_too_large"])
    }))

  it.effect("while a large reply waits for its pipe, more than the bound waiting in the outbox is refused at once (outbox_full)", () =>
    Effect.gen(function*() {
      const h = yield* harness
      const size = 400_000
      for (let uid = 0; uid < 2; uid++) h.outbox.reply(bigReply(A, uid, size))
      yield* h.settle
      // Window: 800 kB. Each next one waits; the outbox takes 2 of them (800 kB), the third would pass 1 MB.
      for (let uid = 2; uid < 5; uid++) h.outbox.reply(bigReply(A, uid, size))
      assert.deepStrictEqual(h.refusals.map(([, r]) => r), ["outbox_full"])
      // Read now: the two that waited go out, in order, and the refusal after them.
      yield* h.advance(20, keyA)
      assert.deepStrictEqual(repliesIn(h.pipeOf(keyA).taken).map((r) => [r.uid, r.ok]), [[0, true], [1, true], [2, true], [3, true], [4, false]])
    }))

  it.effect("one peer waiting for its pipe never delays another: B's replies go out while A backs off", () =>
    Effect.gen(function*() {
      const h = yield* harness
      for (let uid = 0; uid < H; uid++) h.outbox.reply(pingReply(A, uid))
      yield* h.settle
      // A's pipe is full; its next reply waits (EAGAIN, backoff) …
      h.outbox.reply(pingReply(A, 100))
      yield* h.settle
      assert.strictEqual(h.outbox.stats().waitingPeers, 1)
      // … and B is served at once, many times over.
      for (let uid = 0; uid < 3 * H; uid++) {
        h.outbox.reply(pingReply(B, uid))
        yield* h.read(keyB)
      }
      assert.strictEqual(repliesIn(h.pipeOf(keyB).taken).length, 3 * H)
      // A reads within the wait: its waiting reply is delivered, nothing lost.
      yield* TestClock.adjust("10 millis")
      yield* h.read(keyA)
      yield* TestClock.adjust("64 millis")
      yield* h.read(keyA)
      assert.deepStrictEqual(repliesIn(h.pipeOf(keyA).taken).map((r) => r.uid), [...Array.from({ length: H }, (_, i) => i), 100])
      assert.deepStrictEqual(h.undeliverable, [])
    }))

  it.effect("replies queued while their peer backs off (nothing else to send) go out once it reads", () =>
    Effect.gen(function*() {
      const h = yield* harness
      for (let uid = 0; uid < H + 1; uid++) h.outbox.reply(pingReply(A, uid))
      yield* h.settle
      h.outbox.reply(pingReply(A, 20))
      h.outbox.reply(bigReply(A, 21, 5_000))
      yield* h.settle
      yield* h.advance(200, keyA)
      assert.deepStrictEqual(repliesIn(h.pipeOf(keyA).taken).map((r) => r.uid), [...Array.from({ length: H + 1 }, (_, i) => i), 20, 21])
      assert.deepStrictEqual(h.undeliverable, [])
      yield* Effect.promise(() => h.outbox.flushed())
    }))

  it.effect("small replies are never refused for bytes; one stuck behind a full pipe past the wait is dropped as undeliverable", () =>
    Effect.gen(function*() {
      const h = yield* harness
      for (let uid = 0; uid < H + 1; uid++) h.outbox.reply(pingReply(A, uid))
      yield* h.settle
      yield* h.advance(WAIT_MS - 1)
      assert.deepStrictEqual(h.undeliverable, [])
      yield* h.advance(64)
      assert.deepStrictEqual(h.undeliverable, [[keyA, "EAGAIN"]])
      assert.deepStrictEqual(h.refusals, [])
    }))

  it.effect("a gone peer (EHOSTUNREACH): everything waiting for it is dropped and counted; forget() does the same", () =>
    Effect.gen(function*() {
      const h = yield* harness
      for (let uid = 0; uid < H; uid++) h.outbox.reply(pingReply(A, uid))
      yield* h.settle
      h.outbox.reply(pingReply(A, 50))
      h.outbox.reply(pingReply(A, 51))
      yield* h.settle
      h.pipeOf(keyA).gone = true
      yield* TestClock.adjust("1 millis")
      yield* h.settle
      assert.deepStrictEqual(h.undeliverable, [[keyA, "EHOSTUNREACH"], [keyA, "EHOSTUNREACH"]])
      for (let uid = 0; uid < H; uid++) h.outbox.reply(pingReply(B, uid))
      h.outbox.reply(pingReply(B, 99))
      yield* h.settle
      h.outbox.forget(keyB)
      assert.deepStrictEqual(h.undeliverable.slice(2), [[keyB, "EHOSTUNREACH"]])
      yield* Effect.promise(() => h.outbox.flushed())
    }))

  it.effect(`an outbox holds at most its message cap; past it a reply is dropped (${OUTBOX_FULL_CODE})`, () =>
    Effect.gen(function*() {
      const h = yield* harness
      // None is sent before the loop runs: the outbox takes its cap, the 5 after it are dropped.
      for (let uid = 0; uid < MAX_QUEUED_MESSAGES + 5; uid++) h.outbox.reply(pingReply(A, uid % 128))
      assert.deepStrictEqual(h.undeliverable, Array(5).fill([keyA, OUTBOX_FULL_CODE]))
      // The peer reads as it goes: 8 (H) a millisecond.
      yield* h.advance(MAX_QUEUED_MESSAGES / H + 10, keyA)
      assert.strictEqual(repliesIn(h.pipeOf(keyA).taken).length, MAX_QUEUED_MESSAGES)
    }))

  it.effect("a connection probe answers false only for EHOSTUNREACH, and goes ahead of waiting replies", () =>
    Effect.gen(function*() {
      const h = yield* harness
      for (let uid = 0; uid < H + 1; uid++) h.outbox.reply(pingReply(A, uid))
      yield* h.settle
      // A full pipe (EAGAIN): still connected.
      assert.isTrue(yield* Effect.promise(() => h.outbox.probe(A)))
      h.pipeOf(keyA).gone = true
      assert.isFalse(yield* Effect.promise(() => h.outbox.probe(A)))
    }))
})
