/**
 * Where the server listens and who may reach it (src/services/server/config/EndpointConfig.ts): the
 * address rules, loopback detection, and the fail-closed rules (remote needs CURVE, CURVE needs both files).
 */
import { assert, describe, it } from "@effect/vitest"
import type { ConfigIssue } from "../../../../src/services/server/config/ConfigIssue.ts"
import {
  checkAddress,
  curveRequested,
  endpointDefaults,
  type EndpointConfigInput,
  isLoopbackHost,
  tcpHostOf,
  validateEndpoint
} from "../../../../src/services/server/config/EndpointConfig.ts"

const run = (over: Partial<EndpointConfigInput>) => {
  const issues: Array<ConfigIssue> = []
  const input = { ...endpointDefaults, ...over }
  checkAddress(input, issues)
  const config = validateEndpoint(input, issues)
  return { config, issues: issues.map((i) => i.flag) }
}

describe("EndpointConfig", () => {
  it("loopback hosts and the host of a tcp endpoint", () => {
    assert.deepStrictEqual(["localhost", "127.0.0.1", "127.9.8.7", "::1", "[::1]", "0.0.0.0", "10.0.0.1", "example.com"].map(isLoopbackHost), [
      true,
      true,
      true,
      true,
      true,
      false,
      false,
      false
    ])
    assert.deepStrictEqual([tcpHostOf("tcp://[::1]:5555"), tcpHostOf("tcp://h:*"), tcpHostOf("ipc:///tmp/s")], ["[::1]", "h", undefined])
  })

  it("the defaults: tcp://127.0.0.1:5555, no CURVE, no group", () => {
    assert.deepStrictEqual(run({}), {
      config: { endpoint: "tcp://127.0.0.1:5555", curve: undefined, insecureAllowRemote: false, ipcGroupId: undefined },
      issues: []
    })
    assert.strictEqual(run({ host: "::1" }).config.endpoint, "tcp://[::1]:5555")
  })

  it("beyond loopback without CURVE is refused on the flag that named the address; --insecure-allow-remote or CURVE serves it", () => {
    assert.deepStrictEqual(run({ host: "0.0.0.0" }).issues, ["host"])
    assert.deepStrictEqual(run({ endpoint: "tcp://0.0.0.0:5555" }).issues, ["endpoint"])
    assert.deepStrictEqual(run({ host: "0.0.0.0", insecureAllowRemote: true }).issues, [])
    const curve = run({ host: "0.0.0.0", curveSecretKeyFile: "/k", curveAuthorizedKeys: "/a" })
    assert.deepStrictEqual([curve.issues, curve.config.curve], [[], { secretKeyFile: "/k", authorizedKeysFile: "/a" }])
  })

  it("one CURVE file without the other is refused (and counts as CURVE asked for)", () => {
    assert.deepStrictEqual(run({ curveSecretKeyFile: "/k" }).issues, ["curve-authorized-keys"])
    assert.deepStrictEqual(run({ curveAuthorizedKeys: "/a" }).issues, ["curve-secret-key-file"])
    assert.deepStrictEqual([curveRequested({ ...endpointDefaults, curveAuthorizedKeys: "/a" }), curveRequested(endpointDefaults)], [true, false])
  })

  it("--ipc-group applies to an ipc endpoint only and must name a group; bad addresses are named", () => {
    assert.deepStrictEqual(run({ ipcGroup: "root" }).issues, ["ipc-group"])
    assert.deepStrictEqual(run({ endpoint: "ipc:///tmp/mpcache-endpoint-test.sock", ipcGroup: "no-such-group-mpcache" }).issues, ["ipc-group"])
    assert.deepStrictEqual(run({ endpoint: "ipc:///tmp/mpcache-endpoint-test.sock", ipcGroup: "root" }).config.ipcGroupId, 0)
    assert.deepStrictEqual(run({ port: 0, host: "" }).issues, ["host", "port"])
    assert.deepStrictEqual(run({ endpoint: "udp://x", host: "" }).issues, ["endpoint"])
  })
})
