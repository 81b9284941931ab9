/**
 * Engine-driven settings (src/services/server/config/EngineDrivenConfig.ts): the transport by CURVE, shm
 * refused under tenancy (issue 24 item 7), and the PREPARE TTL.
 */
import { assert, describe, it } from "@effect/vitest"
import type { ConfigIssue } from "../../../../src/services/server/config/ConfigIssue.ts"
import {
  type EngineDrivenConfigInput,
  engineDrivenDefaults,
  SHM_UNDER_TENANCY,
  validateEngineDriven
} from "../../../../src/services/server/config/EngineDrivenConfig.ts"

const run = (over: Partial<EngineDrivenConfigInput>, curveOn: boolean) => {
  const issues: Array<ConfigIssue> = []
  const config = validateEngineDriven({ ...engineDrivenDefaults, ...over }, curveOn, issues)
  return { transport: config.engineDrivenTransport, ttl: config.prepareTtlSeconds, issues }
}

describe("EngineDrivenConfig", () => {
  it("defaults to shm without CURVE and inline with it; a 60 s PREPARE TTL", () => {
    assert.deepStrictEqual([run({}, false), run({}, true)], [{ transport: "shm", ttl: 60, issues: [] }, { transport: "inline", ttl: 60, issues: [] }])
  })

  it("shm asked for under CURVE is refused, saying why", () => {
    assert.deepStrictEqual(run({ engineDrivenTransport: "shm" }, true).issues, [{ flag: "engine-driven-transport", message: SHM_UNDER_TENANCY }])
    assert.deepStrictEqual(run({ engineDrivenTransport: "inline" }, false).transport, "inline")
  })

  it("another transport and a TTL of 0 are named", () => {
    assert.deepStrictEqual(run({ engineDrivenTransport: "pickle" as never, prepareTtlSeconds: 0 }, false).issues, [
      { flag: "engine-driven-transport", message: "must be shm or inline (got \"pickle\")" },
      { flag: "prepare-ttl-seconds", message: "prepare TTL must be a number of seconds above 0 (got 0)" }
    ])
  })
})
