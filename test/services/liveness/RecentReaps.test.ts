/** The reaper's ring of the last reaps (issue 17: `recent_reaps`, at most 50, oldest first). */
import { assert, describe, it } from "@effect/vitest"
import { makeRecentReaps, RECENT_REAPS_CAPACITY, type RecentReap } from "../../../src/services/liveness/RecentReaps.ts"

const reap = (n: number): RecentReap => ({
  instance_id: String(n),
  reason: "disconnect",
  reaped_at_ms: 1_000 * n,
  silent_seconds: 2.5,
  window_seconds: 2,
  module: "lmcache_driven_transfer"
})

describe("RecentReaps", () => {
  it("keeps the last 50, oldest first: the 51st reap drops the first", () => {
    const ring = makeRecentReaps()
    assert.strictEqual(RECENT_REAPS_CAPACITY, 50)
    assert.deepStrictEqual(ring.list(), [])
    for (let n = 1; n <= 50; n++) ring.add(reap(n))
    assert.deepStrictEqual(ring.list().map((r) => r.instance_id), Array.from({ length: 50 }, (_, i) => String(i + 1)))
    ring.add(reap(51))
    assert.deepStrictEqual(ring.list().map((r) => r.instance_id), Array.from({ length: 50 }, (_, i) => String(i + 2)))
    for (let n = 52; n <= 175; n++) ring.add(reap(n))
    assert.deepStrictEqual(ring.list().map((r) => r.instance_id), Array.from({ length: 50 }, (_, i) => String(i + 126)))
    assert.deepStrictEqual(ring.list()[49], reap(175))
  })

  it("a ring of 3 wraps exactly", () => {
    const ring = makeRecentReaps(3)
    ring.add(reap(1))
    ring.add(reap(2))
    assert.deepStrictEqual(ring.list().map((r) => r.instance_id), ["1", "2"])
    ring.add(reap(3))
    ring.add(reap(4))
    assert.deepStrictEqual(ring.list().map((r) => r.instance_id), ["2", "3", "4"])
  })
})
