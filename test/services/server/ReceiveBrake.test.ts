/**
 * The receive loop's brake (internal/ReceiveBrake.ts, issue 27 item 1): a token bucket over the messages of peers
 * whose replies back up; on a clock the test sets, exact.
 */
import { assert, describe, it } from "@effect/vitest"
import {
  BACKED_UP_BURST,
  BACKED_UP_MESSAGES_PER_SECOND,
  makeReceiveBrake
} from "../../../src/services/server/internal/ReceiveBrake.ts"

const brakeAt = (perSecond: number, burst: number) => {
  let now = 0
  const brake = makeReceiveBrake({ perSecond, burst, nowMs: () => now })
  return { brake, at: (ms: number) => void (now = ms) }
}

describe("ReceiveBrake", () => {
  it("lets a burst through at once, then makes the loop wait until the bucket is back at zero", () => {
    const { at, brake } = brakeAt(2_000, 3)
    // Three messages of the burst: no wait.
    assert.deepStrictEqual([brake.charge(), brake.charge(), brake.charge()], [0, 0, 0])
    // The fourth takes the bucket to -1: half a millisecond at 2 a ms, rounded up to the timers' 1 ms.
    assert.strictEqual(brake.charge(), 1)
    // After that millisecond the bucket holds 1: one more goes at once, the next waits again.
    at(1)
    assert.deepStrictEqual([brake.charge(), brake.charge()], [0, 1])
    assert.deepStrictEqual(brake.stats(), { charged: 6, pauses: 2, pausedMs: 2 })
  })

  it("waits as long as a deficit takes to refill, never less than 1 ms", () => {
    const { brake } = brakeAt(500, 0)
    // 0.5 a ms: the first message leaves -1, 2 ms to refill; the second -2, 4 ms.
    assert.deepStrictEqual([brake.charge(), brake.charge()], [2, 4])
    assert.deepStrictEqual(brake.stats(), { charged: 2, pauses: 2, pausedMs: 6 })
  })

  it("refills at its rate up to the burst and no further: an idle hour buys no bigger burst", () => {
    const { at, brake } = brakeAt(1_000, 2)
    at(3_600_000)
    assert.deepStrictEqual([brake.charge(), brake.charge(), brake.charge()], [0, 0, 1])
  })

  it("holds peers whose replies back up to the server's rate: 5,000 a second after the burst", () => {
    const { at, brake } = brakeAt(BACKED_UP_MESSAGES_PER_SECOND, BACKED_UP_BURST)
    let now = 0
    let taken = 0
    // The loop as the server runs it: charge, and when told to wait, the clock moves on by the wait.
    while (now < 1_000) {
      taken++
      const wait = brake.charge()
      if (wait > 0) at(now += wait)
    }
    // The burst and the one that empties it at 0 ms, then 5 a ms for the 999 ms after (4 at once, the 5th waits).
    assert.strictEqual(BACKED_UP_MESSAGES_PER_SECOND, 5_000)
    assert.strictEqual(taken, BACKED_UP_BURST + 1 + 999 * 5)
    assert.deepStrictEqual(brake.stats(), { charged: taken, pauses: 1_000, pausedMs: 1_000 })
  })
})
