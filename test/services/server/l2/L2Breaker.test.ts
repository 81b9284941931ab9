/**
 * The L2 circuit breaker (issue 15 item 6) on TestClock: it opens at the
 * N-th failure within the window, not before and not for failures spread
 * wider; probes with PING after a jittered, doubling delay; closes when the
 * store answers.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { TestClock } from "effect/testing"
import { makeBreaker } from "../../../../src/services/server/l2/L2Breaker.ts"
import { L2Error, L2Store, makeMemoryL2 } from "../../../../src/services/server/l2/L2Store.ts"

const settings = { breakerFailures: 3, breakerWindowMs: 1000, breakerProbeMs: 400, breakerProbeMaxMs: 1000 }
const failure = new L2Error({ op: "GET", reason: "timeout", message: "GET did not answer within 50 ms" })

const setup = Effect.gen(function*() {
  const memory = makeMemoryL2()
  const store = yield* L2Store.pipe(Effect.provide(L2Store.layerTest(memory)))
  const breaker = yield* makeBreaker(settings, store.ping(100))
  // It starts probing; its first PING (sent at once) closes it. The tests below count the PINGs after that one.
  yield* Effect.yieldNow
  assert.strictEqual(breaker.state(), "ok")
  const pings = () => memory.log.filter((l) => l === "PING").length - 1
  return { memory, breaker, pings }
})

describe("L2Breaker", () => {
  it.effect("starts probing: ok only once its first PING answers; a store down at start reads open, then ok when it answers", () =>
    Effect.gen(function*() {
      const memory = makeMemoryL2()
      memory.down = true
      memory.delayMs = 30
      const store = yield* L2Store.pipe(Effect.provide(L2Store.layerTest(memory)))
      const breaker = yield* makeBreaker(settings, store.ping(100))
      assert.strictEqual(breaker.state(), "probing")
      assert.isFalse(breaker.isClosed())
      yield* TestClock.adjust("29 millis")
      assert.strictEqual(breaker.state(), "probing")
      yield* TestClock.adjust("1 millis") // the first PING fails
      assert.strictEqual(breaker.state(), "open")
      assert.strictEqual(breaker.lastError(), "connection refused (in-memory store is down)")
      assert.deepStrictEqual(breaker.transitions(), { opened: 1, closed: 0 })
      memory.down = false
      // The next probe comes within [200, 400] ms (+ its 30 ms answer) and closes it.
      yield* TestClock.adjust("199 millis")
      assert.strictEqual(breaker.state(), "open")
      yield* TestClock.adjust("231 millis")
      assert.strictEqual(breaker.state(), "ok")
      assert.isTrue(breaker.isClosed())
      assert.deepStrictEqual(breaker.transitions(), { opened: 1, closed: 1 })
      assert.deepStrictEqual(memory.log, ["PING", "PING"])
    }))

  it.effect("a store that answers at start: probing until the PING answers, then ok; that first close is not a transition", () =>
    Effect.gen(function*() {
      const memory = makeMemoryL2()
      memory.delayMs = 30
      const store = yield* L2Store.pipe(Effect.provide(L2Store.layerTest(memory)))
      const breaker = yield* makeBreaker(settings, store.ping(100))
      yield* TestClock.adjust("29 millis")
      assert.strictEqual(breaker.state(), "probing")
      yield* TestClock.adjust("1 millis")
      assert.strictEqual(breaker.state(), "ok")
      assert.deepStrictEqual(breaker.transitions(), { opened: 0, closed: 0 })
    }))

  it.effect("failures spread wider than the window never open it; the 3rd within 1000 ms does", () =>
    Effect.gen(function*() {
      const { breaker } = yield* setup
      yield* breaker.onFailure(failure)
      yield* TestClock.adjust("600 millis")
      yield* breaker.onFailure(failure)
      yield* TestClock.adjust("600 millis") // the first is now 1200 ms old
      yield* breaker.onFailure(failure)
      assert.strictEqual(breaker.state(), "ok")
      yield* TestClock.adjust("100 millis")
      yield* breaker.onFailure(failure) // three within 700 ms
      assert.strictEqual(breaker.state(), "open")
      assert.isFalse(breaker.isClosed())
      assert.deepStrictEqual(breaker.transitions(), { opened: 1, closed: 0 })
      assert.strictEqual(breaker.lastError(), "GET did not answer within 50 ms")
    }))

  it.effect("open: no PING before half the probe delay, one by the full delay; a failed probe doubles it; an answer closes", () =>
    Effect.gen(function*() {
      const { memory, breaker, pings } = yield* setup
      memory.down = true
      for (let i = 0; i < 3; i++) yield* breaker.onFailure(failure)
      assert.strictEqual(breaker.state(), "open")
      yield* TestClock.adjust("199 millis")
      assert.strictEqual(pings(), 0)
      // The first probe comes between 200 and 400 ms, and fails.
      while (pings() === 0) yield* TestClock.adjust("10 millis")
      assert.strictEqual(breaker.state(), "open")
      assert.strictEqual(breaker.lastError(), "connection refused (in-memory store is down)")
      // The next delay is drawn from [400, 800] ms.
      yield* TestClock.adjust("390 millis")
      assert.strictEqual(pings(), 1)
      memory.down = false
      yield* TestClock.adjust("420 millis")
      assert.strictEqual(pings(), 2)
      assert.strictEqual(breaker.state(), "ok")
      assert.isTrue(breaker.isClosed())
      assert.deepStrictEqual(breaker.transitions(), { opened: 2, closed: 1 })
      // Closed: no more probes.
      yield* TestClock.adjust("10 seconds")
      assert.strictEqual(pings(), 2)
    }))

  it.effect("each probe delay is drawn from [½, 1] of probeMs doubled per failed probe, capped at probeMaxMs", () =>
    Effect.gen(function*() {
      const { memory, breaker, pings } = yield* setup
      memory.down = true
      for (let i = 0; i < 3; i++) yield* breaker.onFailure(failure)
      // Walk the clock in 10 ms steps and note when each probe ran (to 10 ms).
      const at: Array<number> = []
      for (let t = 10; t <= 6000; t += 10) {
        yield* TestClock.adjust("10 millis")
        while (at.length < pings()) at.push(t)
      }
      const gaps = at.map((t, i) => t - (i === 0 ? 0 : at[i - 1]!))
      const bounds = [[200, 400], [400, 800], [500, 1000], [500, 1000], [500, 1000]] as const
      bounds.forEach(([lo, hi], i) => {
        const gap = gaps[i]!
        assert.isTrue(gap >= lo && gap <= hi + 10, `probe ${i + 1} came ${gap} ms after the previous, expected ${lo} to ${hi}`)
      })
      assert.strictEqual(breaker.state(), "open")
    }))
})
