/**
 * The `--l2-*` flags (issue 15 item 1): url forms, defaults, and every rule
 * naming its flag; the CLI exits 2 on a bad value.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { defaults, validate } from "../../../../src/services/server/ServerConfig.ts"
import { l2Defaults, parseL2Url } from "../../../../src/services/server/l2/L2Config.ts"
import { runCli } from "../../../support/Cli.ts"

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
      breakerProbeMaxMs: 30000
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
})
