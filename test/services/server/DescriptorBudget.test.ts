import { assert, describe, it } from "@effect/vitest"
import { descriptorBudget, descriptorBudgetDefaults, MIN_HEADROOM } from "../../../src/services/server/DescriptorBudget.ts"
import { defaults, formatIssue, validate } from "../../../src/services/server/ServerConfig.ts"

describe("DescriptorBudget (issue 24 item 11)", () => {
  it("the default shares of a 1,048,576 limit: half to ZeroMQ, HTTP and the descriptor socket capped, 1/8 passed", () => {
    const r = descriptorBudget(1_048_576, descriptorBudgetDefaults)
    assert.deepStrictEqual(r, {
      budget: {
        limit: 1_048_576,
        zmqConnections: 524_288,
        httpConnections: 1024,
        fdSocketConnections: 128,
        fdSocketConnectionsPerUid: 16,
        passedDescriptors: 131_072,
        passedDescriptorsPerPeer: 16_384,
        headroom: 1_048_576 - 524_288 - 1024 - 128 - 131_072
      }
    })
  })

  it("the default shares of a 1024 limit leave the headroom", () => {
    const r = descriptorBudget(1024, descriptorBudgetDefaults)
    assert.deepStrictEqual(r, {
      budget: {
        limit: 1024,
        zmqConnections: 512,
        httpConnections: 32,
        fdSocketConnections: 16,
        fdSocketConnectionsPerUid: 2,
        passedDescriptors: 128,
        passedDescriptorsPerPeer: 64,
        headroom: 1024 - 512 - 32 - 16 - 128
      }
    })
  })

  it("explicit caps that leave less than the headroom are refused, naming the flags set", () => {
    const r = descriptorBudget(4096, { ...descriptorBudgetDefaults, maxZmqConnections: 3000, maxPassedDescriptors: 900 })
    assert.deepStrictEqual(r, {
      issues: [{
        flag: "max-zmq-connections",
        message: `the caps (ZeroMQ 3000 + HTTP 128 + descriptor socket 64 + passed descriptors 900 = 4092) must leave at least ${MIN_HEADROOM} of the process's 4096 descriptors (RLIMIT_NOFILE) for everything else (set: --max-zmq-connections, --max-passed-descriptors)`
      }]
    })
  })

  it("a per-uid or per-peer cap above its total is refused", () => {
    const r = descriptorBudget(65_536, { ...descriptorBudgetDefaults, fdSocketMaxConnections: 10, fdSocketMaxConnectionsPerUid: 11, maxPassedDescriptors: 100, maxPassedDescriptorsPerPeer: 101 })
    assert.deepStrictEqual("issues" in r ? r.issues.map((i) => i.flag) : [], ["fd-socket-max-connections-per-uid", "max-passed-descriptors-per-peer"])
  })

  it("a limit under 256 is refused with how to raise it", () => {
    const r = descriptorBudget(200, descriptorBudgetDefaults)
    assert.isTrue("issues" in r && r.issues[0]!.message.includes("may open only 200 descriptors"))
  })

  it("validate carries the budget into the configuration, and its issues into the flag errors", () => {
    const ok = validate({ ...defaults, descriptorLimit: 8192 })
    assert.strictEqual("config" in ok ? ok.config.descriptors.zmqConnections : -1, 4096)
    const bad = validate({ ...defaults, descriptorLimit: 8192, descriptorCaps: { ...descriptorBudgetDefaults, maxHttpConnections: 8192 } })
    assert.deepStrictEqual("issues" in bad ? bad.issues.map(formatIssue).map((m) => m.split(":")[0]) : [], ["--max-http-connections"])
  })
})
