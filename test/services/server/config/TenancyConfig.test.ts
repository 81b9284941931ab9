/**
 * Per-tenant limits (src/services/server/config/TenancyConfig.ts; docs/security.md): defaults and rules.
 */
import { totalmem } from "node:os"
import { assert, describe, it } from "@effect/vitest"
import type { ConfigIssue } from "../../../../src/services/server/config/ConfigIssue.ts"
import { tenancyDefaults, validateTenancy } from "../../../../src/services/server/config/TenancyConfig.ts"

describe("TenancyConfig", () => {
  it("defaults: 64 instances, 20 REGISTERs per second, the machine's RAM", () => {
    const issues: Array<ConfigIssue> = []
    assert.deepStrictEqual(validateTenancy(tenancyDefaults, issues), {
      tenantLimits: { maxInstances: 64, maxRegistersPerSecond: 20, maxMappedBytes: totalmem() }
    })
    assert.deepStrictEqual(issues, [])
  })

  it("each limit is a count of at least 1, named by its flag", () => {
    const issues: Array<ConfigIssue> = []
    validateTenancy({ tenantMaxInstances: 0, tenantMaxRegistersPerSecond: 2.5, tenantMaxMappedBytes: -1 }, issues)
    assert.deepStrictEqual(issues.map((i) => i.flag), ["tenant-max-instances", "tenant-max-registers-per-second", "tenant-max-mapped-bytes"])
  })
})
