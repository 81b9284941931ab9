/**
 * `--fd-socket`, `--fd-token-ttl-seconds` and the descriptor socket's default place (issue 13 item 2).
 */
import { tmpdir } from "node:os"
import { accessSync, constants } from "node:fs"
import { assert, describe, it } from "@effect/vitest"
import { defaultFdSocket, defaults, validate } from "../../../src/services/server/ServerConfig.ts"

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
