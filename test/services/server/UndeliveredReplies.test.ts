import { assert, describe, it } from "@effect/vitest"
import { Effect, Fiber } from "effect"
import { TestClock } from "effect/testing"
import { makeUndeliveredReplies } from "../../../src/services/server/internal/UndeliveredReplies.ts"
import { captureLogs, type CapturedLog } from "../../support/FakeMqClient.ts"

describe("UndeliveredReplies", () => {
  it.effect("one WARNING per peer and window, with the count and every errno seen; nothing when nothing failed", () => {
    const logs: Array<CapturedLog> = []
    return Effect.gen(function*() {
      const tally = makeUndeliveredReplies(5_000)
      const reporter = yield* Effect.forkChild(tally.reportForever)
      tally.record("aa", "EHOSTUNREACH")
      tally.record("aa", "EHOSTUNREACH")
      tally.record("bb", "EAGAIN")
      tally.record("aa", "EAGAIN")
      yield* TestClock.adjust("4999 millis")
      assert.deepStrictEqual(logs, [])
      yield* TestClock.adjust("1 millis")
      assert.deepStrictEqual(logs.map((l) => [l.level, l.text]), [
        ["Warn", "3 replies to peer aa could not be delivered (EHOSTUNREACH, EAGAIN: the peer is gone or its pipe is full) in the last 5 s"],
        ["Warn", "1 reply to peer bb could not be delivered (EAGAIN: the peer is gone or its pipe is full) in the last 5 s"]
      ])
      yield* TestClock.adjust("5 seconds")
      assert.strictEqual(logs.length, 2)
      tally.record("cc", "EHOSTUNREACH")
      yield* Fiber.interrupt(reporter)
      assert.deepStrictEqual(logs.map((l) => l.text).slice(2), [
        "1 reply to peer cc could not be delivered (EHOSTUNREACH: the peer is gone or its pipe is full) in the last 5 s"
      ])
    }).pipe(Effect.provide(captureLogs(logs)))
  })
})
