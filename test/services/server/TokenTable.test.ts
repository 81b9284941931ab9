/**
 * The one-time tokens of passed descriptors (issue 13 item 2): usable once,
 * only on the connection and for the instance they were issued for, and
 * gone after their time to live, on the Effect Clock (TestClock here); what
 * they hold is bounded in all and per connection, and nothing moves a
 * token's deadline (issue 24 item 8).
 */
import { assert, describe, it } from "@effect/vitest"
import { Clock, Effect } from "effect"
import { TestClock } from "effect/testing"
import { makeTokenTable } from "../../../src/services/server/internal/TokenTable.ts"

/** Deterministic token bytes: 16 bytes of `n`, then n+1 … */
const counter = () => {
  let n = 0
  return (size: number) => new Uint8Array(size).fill(++n)
}
const hexOf = (n: number) => Buffer.alloc(16, n).toString("hex")
const grant = (peer: string, instanceId: bigint, value: string) => ({ peer, instanceId, pid: 42, uid: 0, gid: 0, value })
/** A table whose tokens weigh their value's length (one character = one descriptor). */
const table = (ttlMs: number, maxHeld = 64, maxHeldPerPeer = 64) =>
  makeTokenTable<string>({ ttlMs, maxHeld, maxHeldPerPeer, weight: (v) => v.length, maxRemembered: 8, random: counter() })
/** The token of an issue that must succeed. */
const issued = (result: ReturnType<ReturnType<typeof table>["issue"]>) => {
  if (result._tag !== "Issued") throw new Error(`refused: ${result.reason}`)
  return result
}

describe("TokenTable", () => {
  it.effect("a token is claimed once, by its connection, for its instance; a replay says used", () =>
    Effect.gen(function*() {
      const tokens = table(30_000)
      const now = yield* Clock.currentTimeMillis
      const first = issued(tokens.issue(grant("peer-a", 7n, "fds-1"), now))
      assert.deepStrictEqual(Buffer.from(first.token).toString("hex"), hexOf(1))
      assert.strictEqual(first.pending.expiresAtMs, now + 30_000)
      // Another connection and another instance are refused, and the token stays for its owner.
      assert.deepStrictEqual(tokens.claim(hexOf(1), 7n, "peer-b", now), { _tag: "Refused", reason: "peer", token: undefined })
      assert.deepStrictEqual(tokens.claim(hexOf(1), 8n, "peer-a", now), { _tag: "Refused", reason: "instance", token: undefined })
      const claimed = tokens.claim(hexOf(1), 7n, "peer-a", now)
      assert.strictEqual(claimed._tag, "Claimed")
      assert.strictEqual(claimed._tag === "Claimed" ? claimed.token.value : undefined, "fds-1")
      assert.deepStrictEqual(tokens.claim(hexOf(1), 7n, "peer-a", now), { _tag: "Refused", reason: "used", token: undefined })
      assert.deepStrictEqual(tokens.claim(hexOf(99), 7n, "peer-a", now), { _tag: "Refused", reason: "unknown", token: undefined })
      assert.strictEqual(tokens.pending().length, 0)
    }))

  it.effect("past its time to live a token is swept (its value handed back) or refused as expired", () =>
    Effect.gen(function*() {
      const tokens = table(30_000)
      tokens.issue(grant("peer-a", 1n, "first"), yield* Clock.currentTimeMillis)
      yield* TestClock.adjust("10 seconds")
      tokens.issue(grant("peer-a", 2n, "second"), yield* Clock.currentTimeMillis)
      yield* TestClock.adjust("19999 millis")
      assert.deepStrictEqual(tokens.expire(yield* Clock.currentTimeMillis), [])
      yield* TestClock.adjust("1 millis")
      assert.deepStrictEqual(tokens.expire(yield* Clock.currentTimeMillis).map((t) => t.value), ["first"])
      assert.deepStrictEqual(tokens.claim(hexOf(1), 1n, "peer-a", yield* Clock.currentTimeMillis), {
        _tag: "Refused",
        reason: "expired",
        token: undefined
      })
      // The second, not swept yet, is refused at its deadline and handed back for closing.
      yield* TestClock.adjust("10 seconds")
      const late = tokens.claim(hexOf(2), 2n, "peer-a", yield* Clock.currentTimeMillis)
      assert.strictEqual(late._tag === "Refused" ? `${late.reason}:${late.token?.value}` : "claimed", "expired:second")
      assert.strictEqual(tokens.pending().length, 0)
    }))

  it.effect("a closed connection revokes its tokens only; the table holds at most maxHeld", () =>
    Effect.gen(function*() {
      const tokens = table(1_000, 2)
      const now = yield* Clock.currentTimeMillis
      tokens.issue(grant("peer-a", 1n, "a"), now)
      tokens.issue(grant("peer-b", 2n, "b"), now)
      assert.deepStrictEqual(tokens.issue(grant("peer-b", 3n, "c"), now), { _tag: "Refused", reason: "total", held: 2, cap: 2 })
      assert.deepStrictEqual(tokens.dropPeer("peer-a").map((t) => t.value), ["a"])
      assert.deepStrictEqual(tokens.pending().map((t) => t.value), ["b"])
      assert.deepStrictEqual(tokens.claim(hexOf(1), 1n, "peer-a", now), { _tag: "Refused", reason: "expired", token: undefined })
      assert.deepStrictEqual(tokens.drain().map((t) => t.value), ["b"])
    }))

  it.effect("the tokens' descriptors are bounded in all and per connection, and what a token frees is usable again", () =>
    Effect.gen(function*() {
      const tokens = table(30_000, 10, 6)
      const now = yield* Clock.currentTimeMillis
      issued(tokens.issue(grant("peer-a", 1n, "aaaa"), now))
      // peer-a holds 4 of its 6: 3 more are refused for the peer, 2 are taken.
      assert.deepStrictEqual(tokens.issue(grant("peer-a", 1n, "aaa"), now), { _tag: "Refused", reason: "peer", held: 4, cap: 6 })
      const second = issued(tokens.issue(grant("peer-a", 2n, "aa"), now))
      issued(tokens.issue(grant("peer-b", 3n, "bbbb"), now))
      assert.strictEqual(tokens.held(), 10)
      // 10 of 10 in all: even a peer with room of its own is refused.
      assert.deepStrictEqual(tokens.issue(grant("peer-c", 4n, "c"), now), { _tag: "Refused", reason: "total", held: 10, cap: 10 })
      assert.strictEqual(tokens.claim(Buffer.from(second.token).toString("hex"), 2n, "peer-a", now)._tag, "Claimed")
      assert.strictEqual(tokens.held(), 8)
      issued(tokens.issue(grant("peer-c", 4n, "cc"), now))
      assert.deepStrictEqual(tokens.dropPeer("peer-b").map((t) => t.value), ["bbbb"])
      assert.strictEqual(tokens.held(), 6)
      assert.deepStrictEqual(tokens.expire(now + 30_000).map((t) => t.value), ["aaaa", "cc"])
      assert.strictEqual(tokens.held(), 0)
      issued(tokens.issue(grant("peer-a", 5n, "aaaaaa"), now + 30_000))
    }))

  it.effect("a token's deadline is fixed at its issue: refused claims and new requests of its connection do not move it", () =>
    Effect.gen(function*() {
      const tokens = table(30_000, 1_000, 1_000)
      const start = yield* Clock.currentTimeMillis
      issued(tokens.issue(grant("peer-a", 7n, "first"), start))
      for (let s = 1; s < 30; s++) {
        yield* TestClock.adjust("1 second")
        const now = yield* Clock.currentTimeMillis
        // Every second: a claim from another connection, one for another instance, and a fresh request.
        assert.strictEqual(tokens.claim(hexOf(1), 7n, "peer-b", now)._tag, "Refused")
        assert.strictEqual(tokens.claim(hexOf(1), 8n, "peer-a", now)._tag, "Refused")
        issued(tokens.issue(grant("peer-a", 7n, `again-${s}`), now))
        assert.deepStrictEqual(tokens.expire(now), [])
      }
      yield* TestClock.adjust("1 second")
      const end = yield* Clock.currentTimeMillis
      assert.strictEqual(end - start, 30_000)
      // Exactly 30 s after its issue the first token goes, and only it: each renewal is a token of its own.
      assert.deepStrictEqual(tokens.expire(end).map((t) => `${t.value}@${t.expiresAtMs - start}`), ["first@30000"])
      assert.strictEqual(tokens.pending().length, 29)
    }))
})
