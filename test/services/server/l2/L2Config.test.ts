/**
 * The `--l2-*` flags (issue 15 item 1, `--l2-secret-file` of issue 24 item
 * 14): url forms, defaults, and every rule naming its flag; the CLI exits 2
 * on a bad value.
 */
import { assert, describe, it } from "@effect/vitest"
import { chmodSync, mkdtempSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Effect } from "effect"
import { defaults, validate } from "../../../../src/services/server/ServerConfig.ts"
import { l2Defaults, parseL2Url } from "../../../../src/services/server/l2/L2Config.ts"
import { runCli } from "../../../support/Cli.ts"
import { ipcEndpoint } from "../../../support/LiveFleet.ts"

describe("--l2-url", () => {
  it("one node with user and password: the password never shows", () => {
    assert.deepStrictEqual(parseL2Url("redis://app:s%40cret@cache.local:6380"), {
      mode: "single",
      tls: false,
      nodes: [{ host: "cache.local", port: 6380 }],
      username: "app",
      password: "s@cret",
      display: "redis://app:***@cache.local:6380"
    })
  })
  it("cluster seeds over TLS, IPv6 in brackets", () => {
    assert.deepStrictEqual(parseL2Url("rediss+cluster://10.0.0.1:7000,[::1]:7001"), {
      mode: "cluster",
      tls: true,
      nodes: [{ host: "10.0.0.1", port: 7000 }, { host: "::1", port: 7001 }],
      username: undefined,
      password: undefined,
      display: "rediss+cluster://10.0.0.1:7000,[::1]:7001"
    })
  })
  it("two hosts in a redis:// url, a missing port, another scheme: each says what is expected", () => {
    assert.strictEqual(parseL2Url("redis://a:1,b:2"), "a redis:// url names one node; use redis+cluster:// for seed nodes (got 2)")
    assert.strictEqual(
      parseL2Url("redis://a"),
      `"a" is not host:port; expected redis://[user:pass@]host:port, rediss://…, or redis+cluster://host:port[,host:port…]`
    )
    assert.strictEqual(
      parseL2Url("http://u:pw@a:1"),
      `must be redis://[user:pass@]host:port, rediss://…, or redis+cluster://host:port[,host:port…] (got "http://u:***@a:1")`
    )
  })
})

describe("validate", () => {
  it("L2 is off by default", () => {
    const r = validate(defaults)
    assert.isTrue("config" in r && r.config.l2 === undefined)
  })
  it("with a url, the defaults of issue 15", () => {
    const r = validate({ ...defaults, l2: { ...l2Defaults, url: "redis://127.0.0.1:6379" } })
    if (!("config" in r) || r.config.l2 === undefined) return assert.fail("expected a config with l2")
    const { url, ...rest } = r.config.l2
    assert.strictEqual(url.display, "redis://127.0.0.1:6379")
    assert.deepStrictEqual(rest, {
      keyPrefix: "mpc",
      ttlSeconds: 0,
      maxInflightBytes: 268435456,
      lookupTimeoutMs: 50,
      transferTimeoutMs: 2000,
      breakerFailures: 5,
      breakerWindowMs: 10000,
      breakerProbeMs: 500,
      breakerProbeMaxMs: 30000,
      secretFile: undefined
    })
  })
  it("every broken rule names its flag", () => {
    const r = validate({
      ...defaults,
      l2: { ...l2Defaults, url: "redis://h", keyPrefix: "a b", ttlSeconds: -1, lookupTimeoutMs: 0, breakerProbeMs: 100, breakerProbeMaxMs: 50 }
    })
    assert.deepStrictEqual("issues" in r ? r.issues.map((i) => i.flag) : [], [
      "l2-key-prefix",
      "l2-ttl-seconds",
      "l2-lookup-timeout-ms",
      "l2-breaker-probe-max-ms",
      "l2-url"
    ])
  })
  it("--l2-secret-file needs --l2-url and a path (issue 24 item 14); with both it is kept", () => {
    const issues = (l2: Partial<typeof l2Defaults>) => {
      const r = validate({ ...defaults, l2: { ...l2Defaults, ...l2 } })
      return "issues" in r ? r.issues : []
    }
    assert.deepStrictEqual(issues({ secretFile: "/etc/mpcache/l2.secret" }), [
      { flag: "l2-secret-file", message: "applies with --l2-url only (there is no L2 to authenticate)" }
    ])
    assert.deepStrictEqual(issues({ url: "redis://127.0.0.1:6379", secretFile: "" }), [
      { flag: "l2-secret-file", message: "must be the path of a file holding the secret" }
    ])
    const r = validate({ ...defaults, l2: { ...l2Defaults, url: "redis://127.0.0.1:6379", secretFile: "/etc/mpcache/l2.secret" } })
    assert.strictEqual("config" in r ? r.config.l2?.secretFile : undefined, "/etc/mpcache/l2.secret")
  })
})

describe("mpcache serve --l2-*", () => {
  it.live("a bad --l2-url and a zero --l2-transfer-timeout-ms exit 2 naming the flag", () =>
    Effect.gen(function*() {
      const url = yield* runCli(["serve", "--l2-url", "redis+cluster://a:1,b:99999"])
      assert.strictEqual(url.code, 2)
      assert.include(url.stderr, `Invalid value for flag --l2-url: "redis+cluster://a:1,b:99999". Expected: port 99999 of "b:99999" is not from 1 to 65535`)
      const timeout = yield* runCli(["serve", "--l2-transfer-timeout-ms", "0"])
      assert.strictEqual(timeout.code, 2)
      assert.include(timeout.stderr, `Invalid value for flag --l2-transfer-timeout-ms: "0". Expected: must be an integer of at least 1 (got 0)`)
      const probe = yield* runCli(["serve", "--l2-breaker-probe-ms", "100", "--l2-breaker-probe-max-ms", "50"])
      assert.strictEqual(probe.code, 2)
      assert.include(probe.stderr, "--l2-breaker-probe-max-ms: must be at least --l2-breaker-probe-ms (100; got 50)")
    }))

  it.live("a --l2-secret-file that group may read, one too short, or one without --l2-url exits 2 naming the flag, the file and the rule", () =>
    Effect.acquireUseRelease(
      Effect.sync(() => mkdtempSync(join(tmpdir(), "mpcache-l2-secret-cli-"))),
      (dir) =>
        Effect.gen(function*() {
          const file = (name: string, text: string, mode: number) => {
            const path = join(dir, name)
            writeFileSync(path, text)
            chmodSync(path, mode)
            return path
          }
          // Nothing listens on port 1: the store is unreachable, which never stops a start; the secret does.
          const serve = (secret: string) =>
            runCli(["serve", "--endpoint", ipcEndpoint(), "--http-port", "0", "--l1-size-gb", "0.0625", "--no-l1-prefault", "--l2-url", "redis://127.0.0.1:1", "--l2-secret-file", secret])
          const shared = file("shared", `${"ab".repeat(32)}\n`, 0o640)
          const open = yield* serve(shared)
          assert.strictEqual(open.code, 2)
          assert.include(
            open.stderr,
            `mpcache cannot start: --l2-secret-file ${shared}: group or others may read or write it (mode 0640); the secret must be readable by the server's user only: chmod 600 it`
          )
          const short = file("short", "too-short\n", 0o600)
          const tooShort = yield* serve(short)
          assert.strictEqual(tooShort.code, 2)
          assert.include(tooShort.stderr, `mpcache cannot start: --l2-secret-file ${short}: the secret must be at least 32 bytes without surrounding whitespace (got 9)`)
          const alone = yield* runCli(["serve", "--l2-secret-file", short])
          assert.strictEqual(alone.code, 2)
          assert.include(alone.stderr, "--l2-secret-file: applies with --l2-url only (there is no L2 to authenticate)")
        }),
      (dir) => Effect.sync(() => rmSync(dir, { recursive: true, force: true }))
    ), 60_000)
})
