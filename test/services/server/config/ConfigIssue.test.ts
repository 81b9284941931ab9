/**
 * Broken rules of the configuration (src/services/server/config/ConfigIssue.ts): how an issue reads, what
 * ConfigInvalid says, and the shared rules.
 */
import { assert, describe, it } from "@effect/vitest"
import { commonRules, type ConfigIssue, ConfigInvalid, formatIssue, issueCheck } from "../../../../src/services/server/config/ConfigIssue.ts"

describe("ConfigIssue", () => {
  it("formatIssue names the flag; ConfigInvalid's message is every issue, one a line", () => {
    const issues = [{ flag: "port", message: "must be an integer from 1 to 65535 (got 0)" }, { flag: "max-workers", message: "m" }]
    assert.strictEqual(formatIssue(issues[0]!), "--port: must be an integer from 1 to 65535 (got 0)")
    assert.strictEqual(new ConfigInvalid({ issues }).message, "--port: must be an integer from 1 to 65535 (got 0)\n--max-workers: m")
  })

  it("issueCheck pushes a problem and skips undefined", () => {
    const issues: Array<ConfigIssue> = []
    const check = issueCheck(issues)
    check("a", undefined)
    check("b", "broken")
    assert.deepStrictEqual(issues, [{ flag: "b", message: "broken" }])
  })

  it("positiveInt takes safe integers from 1; path any non-empty text", () => {
    assert.deepStrictEqual([1, 2 ** 53 - 1, 0, 1.5, 2 ** 53].map(commonRules.positiveInt), [
      undefined,
      undefined,
      "must be an integer of at least 1 (got 0)",
      "must be an integer of at least 1 (got 1.5)",
      "must be an integer of at least 1 (got 9007199254740992)"
    ])
    assert.deepStrictEqual([commonRules.path("/x"), commonRules.path("")], [undefined, "must be a file path"])
  })
})
