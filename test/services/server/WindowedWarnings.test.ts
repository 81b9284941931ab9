import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { TestClock } from "effect/testing"
import { makeWindowedWarnings } from "../../../src/services/server/internal/WindowedWarnings.ts"
import { captureLogs, type CapturedLog } from "../../support/FakeMqClient.ts"

describe("WindowedWarnings (issue 24 item 11: refusals logged rate-limited)", () => {
  it.effect("a key's first event is told at once; the rest of its 10 s window in one line at the window's end; a quiet window closes it", () => {
    const logs: Array<CapturedLog> = []
    return Effect.gen(function*() {
      const w = yield* makeWindowedWarnings<"a" | "b">({
        windowMs: 10_000,
        first: (k) => `first ${k}`,
        more: (k, n, ms) => `${n} more ${k} in ${ms / 1000} s`
      })
      const texts = () => logs.map((l) => `${l.level} ${l.text}`)
      // Lets the writer fibers run (no time passes).
      const turns = Effect.repeat(Effect.yieldNow, { times: 10 })
      w.record("a")
      yield* turns
      assert.deepStrictEqual(texts(), ["Warn first a"])
      for (let i = 0; i < 5; i++) w.record("a")
      w.record("b")
      yield* turns
      assert.deepStrictEqual(texts(), ["Warn first a", "Warn first b"])
      yield* TestClock.adjust("9999 millis")
      assert.strictEqual(logs.length, 2)
      yield* TestClock.adjust("1 millis")
      // a's window ends with its 5 counted events; b's had nothing more: no line.
      assert.deepStrictEqual(texts().slice(2), ["Warn 5 more a in 10 s"])
      w.record("a")
      yield* TestClock.adjust("10 seconds")
      assert.deepStrictEqual(texts().slice(3), ["Warn 1 more a in 10 s"])
      // A quiet window closed both keys: the next event is told at once again.
      yield* TestClock.adjust("10 seconds")
      w.record("b")
      yield* turns
      assert.deepStrictEqual(texts().slice(4), ["Warn first b"])
    }).pipe(Effect.provide(captureLogs(logs)))
  })
})
