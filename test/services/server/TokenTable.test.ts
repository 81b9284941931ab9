/**
 * The one-time tokens of passed descriptors (issue 13 item 2): usable once,
 * only on the connection and for the instance they were issued for, and
 * gone after their time to live, on the Effect Clock (TestClock here).
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

describe("TokenTable", () => {
  it.effect("a token is claimed once, by its connection, for its instance; a replay says used", () =>
    Effect.gen(function*() {
      const table = makeTokenTable<string>({ ttlMs: 30_000, maxPending: 8, maxRemembered: 8, random: counter() })
      const now = yield* Clock.currentTimeMillis
      const issued = table.issue(grant("peer-a", 7n, "fds-1"), now)!
      assert.deepStrictEqual(Buffer.from(issued.token).toString("hex"), hexOf(1))
      assert.strictEqual(issued.pending.expiresAtMs, now + 30_000)
      // Another connection and another instance are refused, and the token stays for its owner.
      assert.deepStrictEqual(table.claim(hexOf(1), 7n, "peer-b", now), { _tag: "Refused", reason: "peer", token: undefined })
      assert.deepStrictEqual(table.claim(hexOf(1), 8n, "peer-a", now), { _tag: "Refused", reason: "instance", token: undefined })
      const claimed = table.claim(hexOf(1), 7n, "peer-a", now)
      assert.strictEqual(claimed._tag, "Claimed")
      assert.strictEqual(claimed._tag === "Claimed" ? claimed.token.value : undefined, "fds-1")
      assert.deepStrictEqual(table.claim(hexOf(1), 7n, "peer-a", now), { _tag: "Refused", reason: "used", token: undefined })
      assert.deepStrictEqual(table.claim(hexOf(99), 7n, "peer-a", now), { _tag: "Refused", reason: "unknown", token: undefined })
      assert.strictEqual(table.pending().length, 0)
    }))

  it.effect("past its time to live a token is swept (its value handed back) or refused as expired", () =>
    Effect.gen(function*() {
      const table = makeTokenTable<string>({ ttlMs: 30_000, maxPending: 8, maxRemembered: 8, random: counter() })
      table.issue(grant("peer-a", 1n, "first"), yield* Clock.currentTimeMillis)
      yield* TestClock.adjust("10 seconds")
      table.issue(grant("peer-a", 2n, "second"), yield* Clock.currentTimeMillis)
      yield* TestClock.adjust("19999 millis")
      assert.deepStrictEqual(table.expire(yield* Clock.currentTimeMillis), [])
      yield* TestClock.adjust("1 millis")
      assert.deepStrictEqual(table.expire(yield* Clock.currentTimeMillis).map((t) => t.value), ["first"])
      assert.deepStrictEqual(table.claim(hexOf(1), 1n, "peer-a", yield* Clock.currentTimeMillis), {
        _tag: "Refused",
        reason: "expired",
        token: undefined
      })
      // The second, not swept yet, is refused at its deadline and handed back for closing.
      yield* TestClock.adjust("10 seconds")
      const late = table.claim(hexOf(2), 2n, "peer-a", yield* Clock.currentTimeMillis)
      assert.strictEqual(late._tag === "Refused" ? `${late.reason}:${late.token?.value}` : "claimed", "expired:second")
      assert.strictEqual(table.pending().length, 0)
    }))

  it.effect("a closed connection revokes its tokens only; the table holds at most maxPending", () =>
    Effect.gen(function*() {
      const table = makeTokenTable<string>({ ttlMs: 1_000, maxPending: 2, maxRemembered: 8, random: counter() })
      const now = yield* Clock.currentTimeMillis
      table.issue(grant("peer-a", 1n, "a"), now)
      table.issue(grant("peer-b", 2n, "b"), now)
      assert.strictEqual(table.issue(grant("peer-b", 3n, "c"), now), undefined)
      assert.deepStrictEqual(table.dropPeer("peer-a").map((t) => t.value), ["a"])
      assert.deepStrictEqual(table.pending().map((t) => t.value), ["b"])
      assert.deepStrictEqual(table.claim(hexOf(1), 1n, "peer-a", now), { _tag: "Refused", reason: "expired", token: undefined })
      assert.deepStrictEqual(table.drain().map((t) => t.value), ["b"])
    }))
})
