/**
 * The MQ server's per-peer inbound FIFOs (src/services/server/internal/PeerQueues.ts, issue 27 item 1): peers
 * in turn, one message each per turn, each peer's own order kept, bounded per peer in messages and bytes, a
 * notification never refused, a peer pending until its message is done, idle peers forgotten.
 */
import { assert, describe, it } from "@effect/vitest"
import { makePeerQueues } from "../../../src/services/server/internal/PeerQueues.ts"

/** Everything `next` hands out until it has nothing, each marked done at once. */
const drain = (q: ReturnType<typeof makePeerQueues<string>>) => {
  const out: Array<string> = []
  for (let n = q.next(); n !== undefined; n = q.next()) {
    out.push(`${n.key}:${n.item}`)
    q.done(n.key)
  }
  return out
}

describe("PeerQueues", () => {
  it("a burst of one peer delays another's message by one of its own: peers in turn, each in its own order", () => {
    const q = makePeerQueues<string>()
    for (let i = 0; i < 5; i++) assert.isTrue(q.push("flood", `f${i}`, 10))
    assert.isTrue(q.push("fresh", "p0", 10))
    assert.isTrue(q.push("fresh", "p1", 10))
    assert.isTrue(q.push("third", "t0", 10))
    assert.deepStrictEqual(drain(q), ["flood:f0", "fresh:p0", "third:t0", "flood:f1", "fresh:p1", "flood:f2", "flood:f3", "flood:f4"])
    assert.deepStrictEqual(q.stats(), { queued: 0, queuedBytes: 0, peers: 0, refused: 0 })
  })

  it("a peer at its bound of messages or bytes gets nothing more queued (counted); one with nothing waiting always gets one in; a notification always", () => {
    const q = makePeerQueues<string>({ messages: 3, bytes: 100 })
    for (let i = 0; i < 3; i++) assert.isTrue(q.push("a", `a${i}`, 10))
    assert.isFalse(q.push("a", "a3", 10))
    assert.isTrue(q.push("a", "notify", 0, true))
    // Bytes: 60 + 50 > 100 is refused, but a first message larger than the bound gets in alone.
    assert.isTrue(q.push("b", "b0", 60))
    assert.isFalse(q.push("b", "b1", 50))
    assert.isTrue(q.push("c", "huge", 1_000))
    assert.isFalse(q.push("c", "c1", 1))
    assert.deepStrictEqual(q.stats(), { queued: 6, queuedBytes: 1_090, peers: 3, refused: 3 })
    assert.deepStrictEqual(drain(q), ["a:a0", "b:b0", "c:huge", "a:a1", "a:a2", "a:notify"])
  })

  it("a peer's message stays pending while it is handled; the peer is forgotten once idle", () => {
    const q = makePeerQueues<string>()
    assert.strictEqual(q.pending("a"), 0)
    q.push("a", "x", 1)
    q.push("a", "y", 1)
    assert.strictEqual(q.pending("a"), 2)
    const first = q.next()!
    assert.deepStrictEqual(first, { key: "a", item: "x" })
    assert.strictEqual(q.pending("a"), 2)
    q.done("a")
    assert.strictEqual(q.pending("a"), 1)
    q.next()
    assert.strictEqual(q.pending("a"), 1)
    assert.strictEqual(q.stats().peers, 1)
    q.done("a")
    assert.strictEqual(q.pending("a"), 0)
    assert.strictEqual(q.stats().peers, 0)
    assert.strictEqual(q.next(), undefined)
  })

  it("10,000 messages of 100 peers come out peers in turn, none lost or reordered within a peer", () => {
    const q = makePeerQueues<string>({ messages: 1_000, bytes: 1 << 30 })
    for (let i = 0; i < 100; i++) for (let p = 0; p < 100; p++) assert.isTrue(q.push(`p${p}`, String(i), 1))
    const out = drain(q)
    assert.strictEqual(out.length, 10_000)
    // Round r hands out message r of every peer, in the peers' first-seen order.
    assert.deepStrictEqual(out.slice(0, 3), ["p0:0", "p1:0", "p2:0"])
    assert.deepStrictEqual(out.slice(100, 102), ["p0:1", "p1:1"])
    assert.deepStrictEqual(out.at(-1), "p99:99")
    const perPeer = new Map<string, Array<number>>()
    for (const e of out) {
      const [k, v] = e.split(":")
      perPeer.set(k!, [...(perPeer.get(k!) ?? []), Number(v)])
    }
    for (const seq of perPeer.values()) assert.deepStrictEqual(seq, Array.from({ length: 100 }, (_, i) => i))
  })
})
