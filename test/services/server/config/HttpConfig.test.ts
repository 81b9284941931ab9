/**
 * The HTTP frontend's settings (src/services/server/config/HttpConfig.ts): its rules, and a frontend beyond
 * loopback refused without a bearer token (fail closed).
 */
import { assert, describe, it } from "@effect/vitest"
import type { ConfigIssue } from "../../../../src/services/server/config/ConfigIssue.ts"
import { type HttpConfig, httpDefaults, validateHttp } from "../../../../src/services/server/config/HttpConfig.ts"

const issuesOf = (over: Partial<HttpConfig>): ReadonlyArray<ConfigIssue> => {
  const issues: Array<ConfigIssue> = []
  validateHttp({ ...httpDefaults, ...over }, issues)
  return issues
}

describe("HttpConfig", () => {
  it("the defaults are valid and carried through", () => {
    const issues: Array<ConfigIssue> = []
    assert.deepStrictEqual(validateHttp(httpDefaults, issues), { httpHost: "127.0.0.1", httpPort: 8080, httpTokenFile: undefined, httpIdleTimeoutSeconds: 5 })
    assert.deepStrictEqual(issues, [])
  })

  it("a frontend beyond loopback needs --http-token-file", () => {
    assert.deepStrictEqual(issuesOf({ httpHost: "0.0.0.0" }), [{
      flag: "http-host",
      message: "0.0.0.0 is not a loopback address: an HTTP frontend beyond loopback needs --http-token-file (every request then needs Authorization: Bearer <token>)"
    }])
    assert.deepStrictEqual(issuesOf({ httpHost: "0.0.0.0", httpTokenFile: "/t" }), [])
  })

  it("port 0 picks a free one; a port past 65535 and an idle timeout outside 0.1–300 s are named", () => {
    assert.deepStrictEqual(issuesOf({ httpPort: 0 }), [])
    assert.deepStrictEqual(issuesOf({ httpPort: 65536, httpIdleTimeoutSeconds: 0.05 }).map((i) => i.flag), ["http-port", "http-idle-timeout-seconds"])
  })
})
