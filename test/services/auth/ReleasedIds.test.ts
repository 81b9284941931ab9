/**
 * The bindings of released instance ids (issue 24 item 13,
 * src/services/auth/ReleasedIds.ts): held through the grace, gone 1 ms
 * after it; ended by the tenant's own REGISTER (`forget`); bounded, with
 * expired bindings swept first and then the oldest of the tenant holding
 * the most pushed out, so one tenant's churn never frees another's ids.
 * Times are plain Clock milliseconds: the module reads no clock.
 */
import { assert, describe, it } from "@effect/vitest"
import { makeInstanceId } from "../../../src/schema/InstanceId.ts"
import { makeReleasedIds } from "../../../src/services/auth/ReleasedIds.ts"

const id = (n: number) => makeInstanceId(BigInt(n))
const GRACE_MS = 3_600_000

describe("released instance ids", () => {
  it("a binding holds until released + grace inclusive and is gone 1 ms later", () => {
    const r = makeReleasedIds({ graceMs: GRACE_MS, maxRecords: 8 })
    r.remember(id(7), "tenantA", "unregister", 1_000)
    assert.deepStrictEqual(r.bindingOf(id(7), 1_000 + GRACE_MS), {
      tenant: "tenantA",
      reason: "unregister",
      releasedAtMs: 1_000,
      untilMs: 1_000 + GRACE_MS
    })
    assert.strictEqual(r.bindingOf(id(7), 1_001 + GRACE_MS), undefined)
    assert.strictEqual(r.size(), 0, "the expired binding was dropped when looked at")
    assert.strictEqual(r.bindingOf(id(8), 0), undefined, "an id never released has no binding")
  })

  it("forget ends a binding; a second release of the id replaces the first (new tenant, reason and times)", () => {
    const r = makeReleasedIds({ graceMs: GRACE_MS, maxRecords: 8 })
    r.remember(id(1), "tenantA", "unregister", 0)
    r.forget(id(1))
    assert.strictEqual(r.bindingOf(id(1), 0), undefined)
    r.remember(id(1), "tenantA", "unregister", 0)
    r.remember(id(1), "tenantB", "reap", 500)
    assert.deepStrictEqual(r.bindingOf(id(1), 600), { tenant: "tenantB", reason: "reap", releasedAtMs: 500, untilMs: 500 + GRACE_MS })
    assert.strictEqual(r.size(), 1)
  })

  it("past the bound one tenant's churn pushes out only its own oldest bindings; the others' stay", () => {
    const r = makeReleasedIds({ graceMs: GRACE_MS, maxRecords: 4 })
    r.remember(id(100), "tenantA", "unregister", 0)
    r.remember(id(101), "tenantA", "reap", 1)
    for (let i = 0; i < 10; i++) r.remember(id(200 + i), "tenantB", "unregister", 10 + i)
    assert.strictEqual(r.size(), 4)
    assert.strictEqual(r.dropped(), 8)
    assert.strictEqual(r.bindingOf(id(100), 20)?.tenant, "tenantA")
    assert.strictEqual(r.bindingOf(id(101), 20)?.tenant, "tenantA")
    // B keeps its two newest; its eight oldest were pushed out early (and so are free).
    assert.deepStrictEqual(
      Array.from({ length: 10 }, (_, i) => r.bindingOf(id(200 + i), 20)?.tenant ?? null),
      [null, null, null, null, null, null, null, null, "tenantB", "tenantB"]
    )
  })

  it("past the bound expired bindings go first: no live binding is pushed out while an expired one is held", () => {
    const r = makeReleasedIds({ graceMs: 1_000, maxRecords: 3 })
    r.remember(id(1), "tenantA", "unregister", 0)
    r.remember(id(2), "tenantA", "unregister", 0)
    r.remember(id(3), "tenantB", "unregister", 1_500)
    // At 1,600 A's two have expired: the fourth binding sweeps them instead of pushing out a live one.
    r.remember(id(4), "tenantB", "unregister", 1_600)
    assert.strictEqual(r.size(), 2)
    assert.strictEqual(r.dropped(), 0)
    assert.deepStrictEqual([r.bindingOf(id(3), 1_600)?.tenant, r.bindingOf(id(4), 1_600)?.tenant], ["tenantB", "tenantB"])
  })
})
