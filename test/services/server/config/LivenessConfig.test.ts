/**
 * The liveness windows (src/services/server/config/LivenessConfig.ts, DESIGN §5): their defaults and rules.
 */
import { assert, describe, it } from "@effect/vitest"
import type { ConfigIssue } from "../../../../src/services/server/config/ConfigIssue.ts"
import { type LivenessConfig, livenessDefaults, validateLiveness } from "../../../../src/services/server/config/LivenessConfig.ts"

const run = (over: Partial<LivenessConfig>) => {
  const issues: Array<ConfigIssue> = []
  const config = validateLiveness({ ...livenessDefaults, ...over }, issues)
  return { config, flags: issues.map((i) => i.flag) }
}

describe("LivenessConfig", () => {
  it("defaults: 120 s timeout, 3600 s grace, 10 s disconnect grace", () => {
    assert.deepStrictEqual(run({}), {
      config: { workerReapTimeoutSeconds: 120, workerRegistrationGraceSeconds: 3600, workerDisconnectGraceSeconds: 10 },
      flags: []
    })
  })

  it("timeout 0 or at least 30; the grace at least the timeout; the disconnect grace 0 or more", () => {
    assert.deepStrictEqual(run({ workerReapTimeoutSeconds: 0, workerRegistrationGraceSeconds: 0, workerDisconnectGraceSeconds: 0 }).flags, [])
    assert.deepStrictEqual(run({ workerReapTimeoutSeconds: 29 }).flags, ["worker-reap-timeout-seconds"])
    assert.deepStrictEqual(run({ workerReapTimeoutSeconds: 30, workerRegistrationGraceSeconds: 30 }).flags, [])
    assert.deepStrictEqual(run({ workerRegistrationGraceSeconds: 119.5 }).flags, ["worker-registration-grace-seconds"])
    assert.deepStrictEqual(run({ workerRegistrationGraceSeconds: Number.NaN }).flags, ["worker-registration-grace-seconds"])
    assert.deepStrictEqual(run({ workerDisconnectGraceSeconds: -0.5 }).flags, ["worker-disconnect-grace-seconds"])
  })
})
