/**
 * `--max-pending-lookups`, `--max-pending-lookups-per-peer` and `--max-lookup-locks` (issue 24 item 6).
 */
import { assert, describe, it } from "@effect/vitest"
import { defaults, formatIssue, validate } from "../../../../src/services/server/ServerConfig.ts"

const issues = (over: Partial<typeof defaults>) => {
  const r = validate({ ...defaults, ...over })
  return "issues" in r ? r.issues.map(formatIssue) : []
}

describe("lookup bounds configuration", () => {
  it("defaults: 16384 pending lookups, 4096 per peer, 1048576 read locks", () => {
    const r = validate(defaults)
    assert.isTrue("config" in r)
    if (!("config" in r)) return
    assert.deepStrictEqual(r.config.lookupLimits, { maxPendingLookups: 16384, maxPendingLookupsPerPeer: 4096, maxLookupLocks: 1048576 })
  })

  it("each must be an integer of at least 1, named by its flag", () => {
    assert.deepStrictEqual(issues({ maxPendingLookups: 0, maxPendingLookupsPerPeer: 1.5, maxLookupLocks: -1 }), [
      "--max-pending-lookups: must be an integer of at least 1 (got 0)",
      "--max-pending-lookups-per-peer: must be an integer of at least 1 (got 1.5)",
      "--max-lookup-locks: must be an integer of at least 1 (got -1)"
    ])
  })

  it("the per-peer bound may not exceed the server's", () => {
    assert.deepStrictEqual(issues({ maxPendingLookups: 8, maxPendingLookupsPerPeer: 8 }), [])
    assert.deepStrictEqual(issues({ maxPendingLookups: 8, maxPendingLookupsPerPeer: 9 }), [
      "--max-pending-lookups-per-peer: must not exceed --max-pending-lookups (8; got 9)"
    ])
  })
})
