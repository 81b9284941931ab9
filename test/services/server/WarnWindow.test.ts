/**
 * Rate-limited WARNING lines (issue 24 item 11: refusals are logged,
 * rate-limited): one line per key and 10 s window on the TestClock, the
 * events inside a window counted into the next line of that key.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { TestClock } from "effect/testing"
import { makeWarnWindow } from "../../../src/services/server/internal/WarnWindow.ts"
import { captureLogs, type CapturedLog } from "../../support/FakeMqClient.ts"

describe("WarnWindow", () => {
  it.effect("one line per key and window; the events a window swallowed are counted into the next line", () => {
    const logs: Array<CapturedLog> = []
    return Effect.gen(function*() {
      const w = makeWarnWindow(10_000)
      yield* w.warn("uid", "refused a uid")
      // 4 more events (one of them counted as 3) within the window: no line.
      yield* w.warn("uid", "refused a uid")
      yield* w.warn("uid", "refused a uid", 3)
      // Another key has its own window.
      yield* w.warn("deadline", "cut a connection")
      yield* TestClock.adjust("9999 millis")
      yield* w.warn("uid", "refused a uid")
      assert.deepStrictEqual(logs.map((l) => `${l.level}: ${l.text}`), ["Warn: refused a uid", "Warn: cut a connection"])
      yield* TestClock.adjust("1 millis")
      yield* w.warn("uid", "refused a uid again")
      yield* w.warn("deadline", "cut a connection")
      assert.deepStrictEqual(logs.map((l) => l.text), [
        "refused a uid",
        "cut a connection",
        "refused a uid again; 5 more like it since the last warning",
        "cut a connection"
      ])
    }).pipe(Effect.provide(captureLogs(logs)))
  })
})
