/**
 * The two flags of issue 13 item 3 in ServerConfig: `--named-segments`
 * (allow | deny, default allow) and `--unlink-reaped-segments` (default off).
 */
import { assert, describe, it } from "@effect/vitest"
import { defaults, formatIssue, validate } from "../../../src/services/server/ServerConfig.ts"

describe("ServerConfig: --named-segments and --unlink-reaped-segments", () => {
  it("default to allow and off, and carry through validate", () => {
    const r = validate(defaults)
    assert.isTrue("config" in r)
    if (!("config" in r)) return
    assert.deepStrictEqual([r.config.namedSegments, r.config.unlinkReapedSegments], ["allow", false])
    const set = validate({ ...defaults, namedSegments: "deny", unlinkReapedSegments: true })
    assert.isTrue("config" in set)
    if (!("config" in set)) return
    assert.deepStrictEqual([set.config.namedSegments, set.config.unlinkReapedSegments], ["deny", true])
  })

  it("a value other than allow or deny is named", () => {
    const r = validate({ ...defaults, namedSegments: "sometimes" as never })
    assert.deepStrictEqual("issues" in r ? r.issues.map(formatIssue) : [], [
      "--named-segments: must be allow or deny (got \"sometimes\")"
    ])
  })
})
