import { assert, describe, it } from "@effect/vitest"
import { defaults, formatIssue, validate } from "../../../src/services/server/ServerConfig.ts"

const issues = (over: Partial<typeof defaults>) => {
  const r = validate({ ...defaults, ...over })
  return "issues" in r ? r.issues.map(formatIssue) : []
}

describe("ServerConfig rules (DESIGN §5, upstream MPServerConfig)", () => {
  it("the defaults are valid: 120 s timeout, 3600 s grace, 10 s disconnect grace, tcp://127.0.0.1:5555", () => {
    const r = validate(defaults)
    assert.isTrue("config" in r)
    if (!("config" in r)) return
    assert.deepStrictEqual(
      [r.config.endpoint, r.config.workerReapTimeoutSeconds, r.config.workerRegistrationGraceSeconds, r.config.workerDisconnectGraceSeconds, r.config.maxCpuWorkers, r.config.maxGpuWorkers],
      ["tcp://127.0.0.1:5555", 120, 3600, 10, 4, 4]
    )
  })

  it("timeout 0 and grace 0 together disable reaping and are accepted", () => {
    assert.deepStrictEqual(issues({ workerReapTimeoutSeconds: 0, workerRegistrationGraceSeconds: 0 }), [])
  })

  it("a reap timeout of 10 is refused (0 or at least 30)", () => {
    assert.deepStrictEqual(issues({ workerReapTimeoutSeconds: 10 }), [
      "--worker-reap-timeout-seconds: worker reap timeout must be 0 (disabled) or at least 30 seconds (got 10); keep it at least 3 × the workers' heartbeat interval"
    ])
  })

  it("a registration grace below the timeout is refused", () => {
    assert.deepStrictEqual(issues({ workerRegistrationGraceSeconds: 60 }), [
      "--worker-registration-grace-seconds: worker registration grace must be at least the worker reap timeout (120 s; got 60)"
    ])
  })

  it("a negative disconnect grace, a zero L1, bad pools and a bad endpoint are each named", () => {
    assert.deepStrictEqual(
      issues({ workerDisconnectGraceSeconds: -1, l1SizeGb: 0, maxWorkers: 0, endpoint: "udp://x" }),
      [
        "--endpoint: must be a ZeroMQ endpoint tcp://HOST:PORT or ipc://PATH (got \"udp://x\")",
        "--l1-size-gb: must be a number of GiB above 0 (got 0)",
        "--max-workers: must be an integer from 1 to 1024 (got 0)",
        "--worker-disconnect-grace-seconds: worker disconnect grace must be 0 (disabled) or a positive number of seconds (got -1)"
      ]
    )
  })

  it("--engine-driven-transport defaults to shm and takes shm or inline only", () => {
    const transportOf = (over: Partial<typeof defaults>) => {
      const r = validate({ ...defaults, ...over })
      return "config" in r ? r.config.engineDrivenTransport : undefined
    }
    assert.deepStrictEqual([transportOf({}), transportOf({ engineDrivenTransport: "shm" }), transportOf({ engineDrivenTransport: "inline" })], [
      "shm",
      "shm",
      "inline"
    ])
    assert.deepStrictEqual(issues({ engineDrivenTransport: "pickle" as never }), [
      "--engine-driven-transport: must be shm or inline (got \"pickle\")"
    ])
  })

  it("with CURVE --engine-driven-transport defaults to inline and refuses shm, which shares the L1 pool with every tenant (issue 24 item 7)", () => {
    const curve = { curveSecretKeyFile: "/k/server.key", curveAuthorizedKeys: "/k/authorized_keys" }
    const r = validate({ ...defaults, ...curve })
    assert.isTrue("config" in r && r.config.engineDrivenTransport === "inline")
    assert.deepStrictEqual(issues({ ...curve, engineDrivenTransport: "inline" }), [])
    assert.deepStrictEqual(issues({ ...curve, engineDrivenTransport: "shm" }), [
      "--engine-driven-transport: shm shares the L1 pool with every engine-driven worker: a tenant that maps it reads and overwrites every other tenant's chunks; with CURVE tenants use inline (the default when CURVE is on)"
    ])
  })

  it("--prepare-ttl-seconds defaults to 60 and must be above 0 (issue 18)", () => {
    const r = validate(defaults)
    assert.isTrue("config" in r && r.config.prepareTtlSeconds === 60)
    assert.deepStrictEqual(issues({ prepareTtlSeconds: 0.5 }), [])
    assert.deepStrictEqual(issues({ prepareTtlSeconds: 0 }), ["--prepare-ttl-seconds: prepare TTL must be a number of seconds above 0 (got 0)"])
    assert.deepStrictEqual(issues({ prepareTtlSeconds: Number.NaN }), ["--prepare-ttl-seconds: prepare TTL must be a number of seconds above 0 (got NaN)"])
  })

  it("an explicit endpoint wins over host and port; pools default to --max-workers", () => {
    const r = validate({ ...defaults, endpoint: "ipc:///tmp/x.sock", maxWorkers: 2, maxGpuWorkers: 8 })
    assert.isTrue("config" in r && r.config.endpoint === "ipc:///tmp/x.sock" && r.config.maxCpuWorkers === 2 && r.config.maxGpuWorkers === 8)
  })

  it("--max-queued-reply-bytes-per-peer defaults to the L1 plus 1 MiB, at least 256 MiB, and takes at least 65536 (issue 24 item 10)", () => {
    const of = (over: Partial<typeof defaults>) => {
      const r = validate({ ...defaults, ...over })
      return "config" in r ? r.config.maxQueuedReplyBytesPerPeer : undefined
    }
    assert.deepStrictEqual(
      [of({}), of({ l1SizeGb: 0.0625 }), of({ l1SizeGb: 4 }), of({ maxQueuedReplyBytesPerPeer: 65_536 })],
      [2 ** 30 + 2 ** 20, 256 * 2 ** 20, 4 * 2 ** 30 + 2 ** 20, 65_536]
    )
    assert.deepStrictEqual(issues({ maxQueuedReplyBytesPerPeer: 65_535 }), [
      "--max-queued-reply-bytes-per-peer: must be a number of bytes of at least 65536 (got 65535)"
    ])
  })

  it("--http-idle-timeout-seconds defaults to 5 and takes 0.1 to 300 (issue 24 item 11)", () => {
    const r = validate(defaults)
    assert.isTrue("config" in r && r.config.httpIdleTimeoutSeconds === 5)
    assert.deepStrictEqual(issues({ httpIdleTimeoutSeconds: 0.1 }), [])
    assert.deepStrictEqual(issues({ httpIdleTimeoutSeconds: 0 }), ["--http-idle-timeout-seconds: must be a number of seconds from 0.1 to 300 (got 0)"])
    assert.deepStrictEqual(issues({ httpIdleTimeoutSeconds: 301 }), ["--http-idle-timeout-seconds: must be a number of seconds from 0.1 to 300 (got 301)"])
  })

  it("the KV event PUB and replay ROUTER: an endpoint each, loopback unless CURVE or --insecure-allow-remote, events on, the replay needs the PUB", () => {
    assert.deepStrictEqual(issues({ kvEventsEndpoint: "tcp://127.0.0.1:5557", kvEventsReplayEndpoint: "tcp://127.0.0.1:5558" }), [])
    assert.deepStrictEqual(issues({ kvEventsEndpoint: "udp://x" }), [
      '--kv-events-endpoint: must be a ZeroMQ endpoint tcp://HOST:PORT or ipc://PATH (got "udp://x")'
    ])
    assert.deepStrictEqual(issues({ kvEventsEndpoint: "tcp://0.0.0.0:5557" }), [
      "--kv-events-endpoint: 0.0.0.0 is not a loopback address: publishing beyond loopback needs CURVE (--curve-secret-key-file and --curve-authorized-keys), or --insecure-allow-remote to let anyone who can reach it read what this server holds"
    ])
    assert.deepStrictEqual(issues({ kvEventsEndpoint: "tcp://0.0.0.0:5557", insecureAllowRemote: true }), [])
    assert.deepStrictEqual(issues({ kvEventsEndpoint: "tcp://127.0.0.1:5555" }), [
      "--kv-events-endpoint: is the MQ endpoint (tcp://127.0.0.1:5555); give the KV event socket an address of its own"
    ])
    assert.deepStrictEqual(issues({ kvEventsEndpoint: "tcp://127.0.0.1:5557", kvEventLogSize: 0 }), [
      "--kv-events-endpoint: needs events on: --kv-event-log-size 0 turns them off"
    ])
    assert.deepStrictEqual(issues({ kvEventsReplayEndpoint: "tcp://127.0.0.1:5558" }), [
      "--kv-events-replay-endpoint: needs --kv-events-endpoint (it replays that PUB's batches)"
    ])
    assert.deepStrictEqual(issues({ kvEventsEndpoint: "tcp://127.0.0.1:5557", kvEventsReplayEndpoint: "tcp://127.0.0.1:5557" }), [
      "--kv-events-replay-endpoint: is the same address as --kv-events-endpoint"
    ])
    assert.deepStrictEqual(issues({ kvEventsTopic: "a b" }), ['--kv-events-topic: must be at most 255 bytes without white space (got "a b")'])
    assert.deepStrictEqual(issues({ kvEventsHwm: 0, kvEventsEndpoint: "tcp://127.0.0.1:5557" }), ["--kv-events-hwm: must be an integer from 1 to 10000000 batches (got 0)"])
    assert.deepStrictEqual(issues({ kvEventsHwm: 16, kvEventsEndpoint: "tcp://127.0.0.1:5557" }), [])
    assert.deepStrictEqual(issues({ kvEventsHwm: 16 }), ["--kv-events-hwm: applies to the PUB: give --kv-events-endpoint too"])
  })
})
