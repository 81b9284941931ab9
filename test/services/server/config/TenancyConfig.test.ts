/**
 * Per-tenant limits (src/services/server/config/TenancyConfig.ts; docs/security.md): defaults and rules.
 */
import { totalmem } from "node:os"
import { assert, describe, it } from "@effect/vitest"
import type { ConfigIssue } from "../../../../src/services/server/config/ConfigIssue.ts"
import { tenancyDefaults, validateTenancy } from "../../../../src/services/server/config/TenancyConfig.ts"

describe("TenancyConfig", () => {
  it("defaults: 64 instances, 20 REGISTERs per second, the machine's RAM, an L1 weight of 1", () => {
    const issues: Array<ConfigIssue> = []
    assert.deepStrictEqual(validateTenancy(tenancyDefaults, issues), {
      tenantLimits: { maxInstances: 64, maxRegistersPerSecond: 20, maxMappedBytes: totalmem() },
      tenantL1ShareDefault: 1
    })
    assert.deepStrictEqual(issues, [])
  })

  it("each limit is a count of at least 1, the L1 weight a number above 0, named by its flag", () => {
    const issues: Array<ConfigIssue> = []
    validateTenancy({ tenantMaxInstances: 0, tenantMaxRegistersPerSecond: 2.5, tenantMaxMappedBytes: -1, tenantL1ShareDefault: 0 }, issues)
    assert.deepStrictEqual(issues.map((i) => i.flag), ["tenant-max-instances", "tenant-max-registers-per-second", "tenant-max-mapped-bytes", "tenant-l1-share-default"])
    assert.strictEqual(issues.at(-1)!.message, "must be a number above 0 and at most 1000000 (a weight: shares are relative; got 0)")
  })
})
