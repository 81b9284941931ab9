/**
 * When the KV event publisher drains (DrainSchedule.ts): on the turn after a wake, at most once per interval,
 * one pending run at most; on a fake clock and fake timers, exact.
 */
import { assert, describe, it } from "@effect/vitest"
import { type DrainTimers, makeDrainSchedule } from "../../../../src/services/server/kvevents/DrainSchedule.ts"

/** Fake timers: a clock the test sets, and the runs asked for, by kind, fired by hand. */
const fakeTimers = () => {
  let now = 0
  const queued: Array<{ kind: "turn" | number; f: () => void; cancelled: boolean }> = []
  const timers: DrainTimers = {
    now: () => now,
    nextTurn: (f) => {
      const q = { kind: "turn" as const, f, cancelled: false }
      queued.push(q)
      return () => void (q.cancelled = true)
    },
    after: (ms, f) => {
      const q = { kind: ms, f, cancelled: false }
      queued.push(q)
      return () => void (q.cancelled = true)
    }
  }
  return {
    timers,
    at: (ms: number) => void (now = ms),
    /** The kinds asked for and not yet fired or cancelled. */
    pending: () => queued.filter((q) => !q.cancelled).map((q) => q.kind),
    fire: () => {
      const q = queued.shift()!
      if (!q.cancelled) q.f()
    }
  }
}

describe("DrainSchedule", () => {
  it("a first wake drains on the next turn; a wake within 5 ms of a drain waits out the rest (rounded up to whole ms); extra wakes add nothing", () => {
    const t = fakeTimers()
    const drains: Array<number> = []
    const s = makeDrainSchedule(() => drains.push(t.timers.now()), 5, t.timers)
    s.wake()
    s.wake()
    assert.deepStrictEqual(t.pending(), ["turn"])
    t.at(0.5)
    t.fire()
    assert.deepStrictEqual(drains, [0.5])
    t.at(2)
    s.wake()
    s.wake()
    // 3.5 ms left, asked for in whole milliseconds (Node keeps a timer list per distinct duration).
    assert.deepStrictEqual(t.pending(), [4])
    t.at(5.5)
    t.fire()
    assert.deepStrictEqual(drains, [0.5, 5.5])
    t.at(20)
    s.wake()
    assert.deepStrictEqual(t.pending(), ["turn"])
    t.fire()
    assert.deepStrictEqual(drains, [0.5, 5.5, 20])
  })

  it("cancel drops the pending run; a wake after it schedules again", () => {
    const t = fakeTimers()
    let drains = 0
    const s = makeDrainSchedule(() => drains++, 5, t.timers)
    s.wake()
    s.cancel()
    assert.deepStrictEqual(t.pending(), [])
    t.fire()
    assert.strictEqual(drains, 0)
    s.wake()
    assert.deepStrictEqual(t.pending(), ["turn"])
    t.fire()
    assert.strictEqual(drains, 1)
  })
})
