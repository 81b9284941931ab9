/**
 * How worker memory reaches the server (src/services/server/config/WorkerMemoryConfig.ts), through
 * ServerConfig's validate: `--fd-socket`, `--fd-token-ttl-seconds` and the descriptor socket's default
 * place (issue 13 item 2); `--named-segments` (allow | deny, default allow) and `--unlink-reaped-segments`
 * (default off) (issue 13 item 3).
 */
import { tmpdir } from "node:os"
import { accessSync, constants } from "node:fs"
import { assert, describe, it } from "@effect/vitest"
import { defaultFdSocket, defaults, formatIssue, validate } from "../../../../src/services/server/ServerConfig.ts"

const runWritable = (() => {
  try {
    accessSync("/run", constants.W_OK)
    return true
  } catch {
    return false
  }
})()

describe("descriptor socket configuration", () => {
  it("defaults next to an ipc endpoint, else under $XDG_RUNTIME_DIR, else /run (or the temp folder)", () => {
    assert.strictEqual(defaultFdSocket("ipc:///tmp/x/mpcache.sock"), "/tmp/x/mpcache.sock.fds")
    assert.strictEqual(defaultFdSocket("tcp://127.0.0.1:5555", "/run/user/1000"), "/run/user/1000/mpcache-127.0.0.1-5555.fds")
    assert.strictEqual(defaultFdSocket("tcp://[::1]:5555", "/run/user/1000"), "/run/user/1000/mpcache-1-5555.fds")
    assert.strictEqual(
      defaultFdSocket("tcp://127.0.0.1:*", ""),
      `${runWritable ? "/run" : tmpdir()}/mpcache-127.0.0.1-pid${process.pid}.fds`
    )
  })

  it("refuses a bad --fd-socket or --fd-token-ttl-seconds naming the flag", () => {
    const bad = validate({ ...defaults, fdSocket: "@", fdTokenTtlSeconds: 0 })
    assert.deepStrictEqual("issues" in bad ? bad.issues : [], [
      { flag: "fd-socket", message: `must be a socket path, @name (abstract namespace) or off, at most 107 bytes (got "@")` },
      { flag: "fd-token-ttl-seconds", message: "must be a number of seconds above 0 (got 0)" }
    ])
    const ok = validate({ ...defaults, fdSocket: "@mpcache", requireSealedMemfd: true })
    assert.deepStrictEqual("config" in ok ? [ok.config.fdSocket, ok.config.requireSealedMemfd, ok.config.fdTokenTtlSeconds] : [], ["@mpcache", true, 30])
  })
})

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
