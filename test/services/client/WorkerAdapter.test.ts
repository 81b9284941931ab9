/**
 * The worker adapter's liveness (DESIGN §6; reference §6.3, §6.4), against a
 * scripted fake MQ client and TestClock: when the heartbeat starts, what it
 * sends and when, degraded mode, re-registration (unhealthy→healthy edge,
 * PING_REGISTERED reporting a missing kind, a not_registered transfer),
 * supervision, shutdown order, mixed versions and the construction warning.
 */
import { assert, describe, it } from "@effect/vitest"
import { Context, Effect, Exit, Fiber, Layer, Scope } from "effect"
import { TestClock } from "effect/testing"
import { makeInstanceId, MAX_INSTANCE_ID } from "../../../src/schema/InstanceId.ts"
import type { TensorDescriptor } from "../../../src/schema/TensorDescriptor.ts"
import { BadRequest, NotRegistered, UnknownOp } from "../../../src/schema/WireError.ts"
import { makeWorkerAdapterWith, type TransferRequest, WorkerAdapter, type WorkerAdapterSettings } from "../../../src/services/client/WorkerAdapter.ts"
import { type CapturedLog, captureLogs, type FakeMqClient, makeFakeMqClient, reply } from "../../support/FakeMqClient.ts"

const ID = makeInstanceId((1n << 62n) + 7n)

const descriptors: ReadonlyArray<TensorDescriptor> = [{
  kind: "cpu_shm",
  shm_name: "mpcache-test-layer0",
  device_uuid: "cpu",
  nbytes: 2 * 8 * 16 * 1 * 8 * 2,
  dtype: "float16",
  shape: [2, 8, 16, 1, 8],
  stride: [1024, 128, 8, 8, 1],
  storage_offset: 0
}]

const request = (requestId: string): TransferRequest => ({
  requestId,
  tokenIds: Array.from({ length: 256 }, (_, i) => i),
  start: 0,
  end: 256,
  blockIds: Array.from({ length: 16 }, (_, i) => i)
})

const settings = (extra: Partial<WorkerAdapterSettings> = {}): WorkerAdapterSettings => ({
  modelName: "m",
  worldSize: 1,
  kvRank: 0,
  instanceId: ID,
  ...extra
})

/** The adapter in the test's Scope, on a fresh fake client. */
const adapterOn = (client: FakeMqClient, extra: Partial<WorkerAdapterSettings> = {}) =>
  makeWorkerAdapterWith(client, settings(extra))

/** `op@ms` for every request, optionally only the named ops. */
const timeline = (client: FakeMqClient, ...only: ReadonlyArray<string>) =>
  client.sent.filter((s) => only.length === 0 || only.includes(s.op)).map((s) => `${s.op}@${s.atMs}`)

describe("construction", () => {
  it.effect("a 63-bit random id, logged at INFO in decimal", () => {
    const logs: Array<CapturedLog> = []
    return Effect.gen(function*() {
      const adapter = yield* makeWorkerAdapterWith(makeFakeMqClient(), { modelName: "m", worldSize: 1, kvRank: 0 })
      assert.isTrue(adapter.instanceId >= 0n && adapter.instanceId <= MAX_INSTANCE_ID)
      assert.deepStrictEqual(
        logs.filter((l) => l.level === "Info").map((l) => l.text),
        [`mpcache worker adapter created with instance_id=${adapter.instanceId.toString(10)}`]
      )
    }).pipe(Effect.provide(captureLogs(logs)))
  })

  it.effect("warns when 3 × the heartbeat interval exceeds the server's 30 s minimum reap timeout, not at exactly 30 s", () => {
    const logs: Array<CapturedLog> = []
    return Effect.gen(function*() {
      yield* adapterOn(makeFakeMqClient(), { heartbeatIntervalMs: 10_000 })
      assert.deepStrictEqual(logs.filter((l) => l.level === "Warn"), [])
      yield* adapterOn(makeFakeMqClient(), { heartbeatIntervalMs: 15_000 })
      assert.deepStrictEqual(logs.filter((l) => l.level === "Warn").map((l) => l.text), [
        "heartbeat interval 15 s: 3 × interval = 45 s exceeds the server's minimum reap timeout (30 s); " +
        "run the server with --worker-reap-timeout-seconds of at least 45 or this live worker may be reaped"
      ])
    }).pipe(Effect.provide(captureLogs(logs)))
  })

  it.effect("a heartbeat interval that is not positive is refused", () =>
    Effect.gen(function*() {
      const exit = yield* Effect.exit(adapterOn(makeFakeMqClient(), { heartbeatIntervalMs: 0 }))
      assert.isTrue(Exit.isFailure(exit))
    }))
})

describe("heartbeat start", () => {
  it.effect("starts healthy; not running before register; running after; pings PING_REGISTERED at register", () =>
    Effect.gen(function*() {
      const client = makeFakeMqClient()
      const adapter = yield* adapterOn(client)
      assert.isTrue(yield* adapter.isHealthy)
      assert.isFalse(yield* adapter.heartbeatRunning)
      yield* TestClock.adjust("60 seconds")
      assert.deepStrictEqual(timeline(client), ["get_chunk_size@0"])
      yield* adapter.registerKvCaches(descriptors)
      yield* TestClock.adjust("0 millis")
      assert.isTrue(yield* adapter.heartbeatRunning)
      assert.deepStrictEqual(timeline(client), ["get_chunk_size@0", "register_kv_cache@60000", "ping_registered@60000"])
      assert.deepStrictEqual(client.sent[2]?.payload, [ID, ["kv_cache"]])
      assert.strictEqual(client.sent[2]?.timeoutMs, 10_000)
    }))

  it.effect("starting twice is a no-op: register, then the first store, keep one ping per interval", () =>
    Effect.gen(function*() {
      const client = makeFakeMqClient()
      const adapter = yield* adapterOn(client)
      yield* adapter.registerKvCaches(descriptors)
      assert.isTrue(yield* adapter.store(request("r1")))
      yield* adapter.submitStore(request("r2"))
      yield* TestClock.adjust("20 seconds")
      assert.deepStrictEqual(timeline(client, "ping_registered", "ping"), [
        "ping_registered@0",
        "ping_registered@10000",
        "ping_registered@20000"
      ])
      assert.deepStrictEqual(
        (yield* adapter.events).filter((e) => e._tag === "HeartbeatStarted").map((e) => e.atMs),
        [0]
      )
    }))

  it.effect("a failed register starts no heartbeat", () =>
    Effect.gen(function*() {
      const client = makeFakeMqClient()
      client.answer("register_kv_cache", reply.timeout)
      const adapter = yield* adapterOn(client, { requestTimeoutMs: 5_000 })
      const registering = yield* Effect.forkChild(Effect.exit(adapter.registerKvCaches(descriptors)))
      yield* TestClock.adjust("5 seconds")
      const exit = yield* Fiber.join(registering)
      assert.isTrue(Exit.isFailure(exit))
      yield* TestClock.adjust("60 seconds")
      assert.isFalse(yield* adapter.heartbeatRunning)
      assert.deepStrictEqual(timeline(client), ["get_chunk_size@0", "register_kv_cache@0"])
    }))

  it.effect("defensively started by the first store when nothing is registered: plain PING [id]", () =>
    Effect.gen(function*() {
      const client = makeFakeMqClient()
      const adapter = yield* adapterOn(client)
      yield* adapter.store(request("r1"))
      yield* TestClock.adjust("10 seconds")
      assert.isTrue(yield* adapter.heartbeatRunning)
      assert.deepStrictEqual(timeline(client, "ping", "ping_registered"), ["ping@0", "ping@10000"])
      assert.deepStrictEqual(client.sent.find((s) => s.op === "ping")?.payload, [ID])
    }))
})

describe("getFinished bookkeeping (issue 18 item 1)", () => {
  const nothing = { finishedStores: [], finishedRetrieves: [], failedRetrieves: [] }
  const idle = { pendingRequests: 0, finishedAwaitingStores: 0, droppedRetrieves: 0 }

  it.effect("ids reported finished with no store are not kept: the finished set returns to 0", () =>
    Effect.gen(function*() {
      const client = makeFakeMqClient()
      const adapter = yield* adapterOn(client)
      yield* adapter.registerKvCaches(descriptors)
      const retrieved = Array.from({ length: 5 }, (_, i) => `r${i}`)
      for (const id of retrieved) yield* adapter.submitRetrieve(request(id))
      yield* TestClock.adjust("0 millis")
      assert.deepStrictEqual(yield* adapter.getFinished([]), { finishedStores: [], finishedRetrieves: retrieved, failedRetrieves: [] })
      const never = Array.from({ length: 100 }, (_, i) => `q${i}`)
      assert.deepStrictEqual(yield* adapter.getFinished([...retrieved, ...never]), nothing)
      assert.deepStrictEqual(yield* adapter.tracking, idle)
    }))

  it.effect("a store reported while the request's retrieve is still in flight leaves nothing once the retrieve is reported", () =>
    Effect.gen(function*() {
      const client = makeFakeMqClient()
      const adapter = yield* adapterOn(client)
      yield* adapter.registerKvCaches(descriptors)
      client.once("retrieve", reply.after(5_000, reply.ok([new Uint8Array(0), true])))
      yield* adapter.submitRetrieve(request("a"))
      yield* adapter.submitStore(request("a"))
      yield* TestClock.adjust("0 millis")
      assert.deepStrictEqual(yield* adapter.getFinished(["a"]), { finishedStores: ["a"], finishedRetrieves: [], failedRetrieves: [] })
      assert.deepStrictEqual(yield* adapter.tracking, { ...idle, pendingRequests: 1 })
      yield* TestClock.adjust("5 seconds")
      assert.deepStrictEqual(yield* adapter.getFinished([]), { finishedStores: [], finishedRetrieves: ["a"], failedRetrieves: [] })
      assert.deepStrictEqual(yield* adapter.tracking, idle)
    }))

  it.effect("a store is reported once it completes and its request was reported finished, in either order", () =>
    Effect.gen(function*() {
      const client = makeFakeMqClient()
      const adapter = yield* adapterOn(client)
      yield* adapter.registerKvCaches(descriptors)
      // s1 completes before the engine reports it finished.
      yield* adapter.submitStore(request("s1"))
      yield* TestClock.adjust("0 millis")
      assert.deepStrictEqual(yield* adapter.getFinished([]), nothing)
      assert.deepStrictEqual(yield* adapter.tracking, { ...idle, pendingRequests: 1 })
      assert.deepStrictEqual(yield* adapter.getFinished(["s1"]), { finishedStores: ["s1"], finishedRetrieves: [], failedRetrieves: [] })
      // s2 is reported finished while its store is in flight.
      client.once("store", reply.after(5_000, reply.ok([new Uint8Array(0), true])))
      yield* adapter.submitStore(request("s2"))
      yield* TestClock.adjust("0 millis")
      assert.deepStrictEqual(yield* adapter.getFinished(["s2"]), nothing)
      assert.deepStrictEqual(yield* adapter.tracking, { ...idle, pendingRequests: 1, finishedAwaitingStores: 1 })
      yield* TestClock.adjust("5 seconds")
      assert.deepStrictEqual(yield* adapter.getFinished([]), { finishedStores: ["s2"], finishedRetrieves: [], failedRetrieves: [] })
      assert.deepStrictEqual(yield* adapter.tracking, idle)
    }))

  it.effect("degraded mode drains everything: nothing is left tracked", () =>
    Effect.gen(function*() {
      const client = makeFakeMqClient()
      const adapter = yield* adapterOn(client)
      yield* adapter.registerKvCaches(descriptors)
      client.answer("store", reply.hang)
      yield* adapter.submitStore(request("s1"))
      yield* TestClock.adjust("0 millis")
      assert.deepStrictEqual(yield* adapter.getFinished(["s1", "x"]), nothing)
      client.answer("ping_registered", reply.timeout)
      yield* TestClock.adjust("20 seconds")
      assert.isFalse(yield* adapter.isHealthy)
      yield* adapter.submitStore(request("s2"))
      yield* adapter.submitRetrieve(request("r1"))
      assert.deepStrictEqual(yield* adapter.tracking, { pendingRequests: 2, finishedAwaitingStores: 1, droppedRetrieves: 1 })
      assert.deepStrictEqual(yield* adapter.getFinished(["y"]), {
        finishedStores: ["s1", "s2"],
        finishedRetrieves: ["r1"],
        failedRetrieves: ["r1"]
      })
      assert.deepStrictEqual(yield* adapter.tracking, idle)
    }))
})

describe("degraded mode", () => {
  it.effect("a ping without an answer within the timeout flips to unhealthy; stores are skipped; a retrieve is reported failed exactly once", () =>
    Effect.gen(function*() {
      const client = makeFakeMqClient()
      const adapter = yield* adapterOn(client, { heartbeatTimeoutMs: 2_000 })
      yield* adapter.registerKvCaches(descriptors)
      client.once("ping_registered", reply.ok([]), reply.timeout)
      yield* TestClock.adjust("11999 millis")
      assert.isTrue(yield* adapter.isHealthy)
      yield* TestClock.adjust("1 millis")
      assert.isFalse(yield* adapter.isHealthy)

      const sentBefore = client.sent.length
      assert.isFalse(yield* adapter.store(request("direct")))
      assert.isFalse(yield* adapter.retrieve(request("direct")))
      yield* adapter.submitStore(request("s1"))
      yield* adapter.submitRetrieve(request("r1"))
      assert.strictEqual(client.sent.length, sentBefore)
      assert.deepStrictEqual(yield* adapter.getFinished([]), {
        finishedStores: ["s1"],
        finishedRetrieves: ["r1"],
        failedRetrieves: ["r1"]
      })
      assert.deepStrictEqual(yield* adapter.getFinished([]), { finishedStores: [], finishedRetrieves: [], failedRetrieves: [] })
      assert.deepStrictEqual(
        (yield* adapter.events).filter((e) => e._tag === "Unhealthy"),
        [{ _tag: "Unhealthy", atMs: 12_000, reason: "no reply to ping_registered within 2000 ms" }]
      )
    }))

  it.effect("getFinished while unhealthy reports every pending transfer, in flight or not", () =>
    Effect.gen(function*() {
      const client = makeFakeMqClient()
      const adapter = yield* adapterOn(client)
      yield* adapter.registerKvCaches(descriptors)
      client.answer("store", reply.hang)
      client.answer("retrieve", reply.hang)
      yield* adapter.submitStore(request("s1"))
      yield* adapter.submitRetrieve(request("r1"))
      yield* TestClock.adjust("0 millis")
      assert.deepStrictEqual(yield* adapter.getFinished([]), { finishedStores: [], finishedRetrieves: [], failedRetrieves: [] })
      client.answer("ping_registered", reply.fail(new UnknownOp({ message: "x" })))
      client.answer("ping", reply.timeout)
      yield* TestClock.adjust("20 seconds")
      assert.isFalse(yield* adapter.isHealthy)
      assert.deepStrictEqual(yield* adapter.getFinished([]), {
        finishedStores: ["s1"],
        finishedRetrieves: ["r1"],
        failedRetrieves: ["r1"]
      })
      assert.deepStrictEqual(yield* adapter.getFinished([]), { finishedStores: [], finishedRetrieves: [], failedRetrieves: [] })
    }))

  it.effect("on the next successful ping REGISTER is sent and acknowledged before health flips", () =>
    Effect.gen(function*() {
      const client = makeFakeMqClient()
      const adapter = yield* adapterOn(client)
      yield* adapter.registerKvCaches(descriptors)
      // The ping at 10 s times out at 20 s; the next one (20 s) answers; REGISTER then takes 1 s.
      client.once("ping_registered", reply.ok([]), reply.timeout)
      client.once("register_kv_cache", reply.after(1_000, reply.ok(undefined)))
      yield* TestClock.adjust("20 seconds")
      assert.isFalse(yield* adapter.isHealthy)
      yield* TestClock.adjust("500 millis")
      assert.deepStrictEqual(timeline(client).slice(-2), ["ping_registered@20000", "register_kv_cache@20000"])
      assert.isFalse(yield* adapter.isHealthy)
      yield* TestClock.adjust("500 millis")
      assert.isTrue(yield* adapter.isHealthy)
      const register = client.sent.filter((s) => s.op === "register_kv_cache")
      assert.deepStrictEqual(register.map((s) => s.payload[0]), [ID, ID])
      assert.deepStrictEqual(
        (yield* adapter.events).filter((e) => e._tag !== "HeartbeatStarted").map((e) => `${e._tag}@${e.atMs}`),
        ["Registered@0", "Unhealthy@20000", "Registered@21000", "Healthy@21000"]
      )
      assert.strictEqual(yield* adapter.reregistrations, 1)
    }))

  it.effect("a failed re-register keeps it unhealthy; the next successful ping retries", () =>
    Effect.gen(function*() {
      const client = makeFakeMqClient()
      const adapter = yield* adapterOn(client)
      yield* adapter.registerKvCaches(descriptors)
      client.once("ping_registered", reply.timeout)
      client.once("register_kv_cache", reply.fail(new BadRequest({ message: "nope" })))
      yield* TestClock.adjust("10 seconds")
      assert.isFalse(yield* adapter.isHealthy)
      assert.deepStrictEqual(timeline(client, "register_kv_cache"), ["register_kv_cache@0", "register_kv_cache@10000"])
      yield* TestClock.adjust("10 seconds")
      assert.isTrue(yield* adapter.isHealthy)
      assert.deepStrictEqual(timeline(client, "register_kv_cache"), [
        "register_kv_cache@0",
        "register_kv_cache@10000",
        "register_kv_cache@20000"
      ])
      assert.deepStrictEqual(
        (yield* adapter.events).filter((e) => e._tag === "RegisterFailed"),
        [{ _tag: "RegisterFailed", atMs: 10_000, reason: "recover", message: "nope" }]
      )
    }))
})

describe("re-registration without an unhealthy edge", () => {
  it.effect("PING_REGISTERED answering [\"kv_cache\"] re-registers at once with the same id", () =>
    Effect.gen(function*() {
      const client = makeFakeMqClient()
      const adapter = yield* adapterOn(client)
      yield* adapter.registerKvCaches(descriptors)
      // The server "restarts" between the pings at 0 s and 10 s.
      client.once("ping_registered", reply.ok([]), reply.ok(["kv_cache"]))
      yield* TestClock.adjust("10 seconds")
      assert.deepStrictEqual(timeline(client).slice(1), [
        "register_kv_cache@0",
        "ping_registered@0",
        "ping_registered@10000",
        "register_kv_cache@10000"
      ])
      assert.strictEqual(client.sent[4]?.payload[0], ID)
      assert.deepStrictEqual(client.sent[4]?.payload[1], descriptors)
      assert.isTrue(yield* adapter.isHealthy)
      const events = yield* adapter.events
      assert.deepStrictEqual(events.filter((e) => e._tag === "Unhealthy" || e._tag === "Healthy"), [])
      assert.deepStrictEqual(events.filter((e) => e._tag === "Registered").map((e) => e.reason), ["initial", "missing"])
    }))

  it.effect("a transfer answered not_registered re-registers with the same id", () =>
    Effect.gen(function*() {
      const client = makeFakeMqClient()
      const adapter = yield* adapterOn(client)
      yield* adapter.registerKvCaches(descriptors)
      client.once("store", reply.fail(new NotRegistered({ message: "instance 4611686018427387911 is not registered" })))
      const exit = yield* Effect.exit(adapter.store(request("r1")))
      assert.isTrue(Exit.isFailure(exit))
      assert.deepStrictEqual(timeline(client, "store", "register_kv_cache"), ["register_kv_cache@0", "store@0", "register_kv_cache@0"])
      assert.strictEqual(client.sent.at(-1)?.payload[0], ID)
      assert.strictEqual(yield* adapter.reregistrations, 1)
      assert.deepStrictEqual((yield* adapter.events).filter((e) => e._tag === "Registered").map((e) => e.reason), [
        "initial",
        "not_registered"
      ])
    }))
})

describe("supervision", () => {
  it.effect("the client dying inside one cycle is logged, and the heartbeat goes on", () => {
    const logs: Array<CapturedLog> = []
    return Effect.gen(function*() {
      const client = makeFakeMqClient()
      const adapter = yield* adapterOn(client)
      yield* adapter.registerKvCaches(descriptors)
      client.once("ping_registered", reply.ok([]), reply.die(new Error("socket exploded")))
      yield* TestClock.adjust("30 seconds")
      assert.deepStrictEqual(timeline(client, "ping_registered"), [
        "ping_registered@0",
        "ping_registered@10000",
        "ping_registered@20000",
        "ping_registered@30000"
      ])
      assert.isTrue(yield* adapter.isHealthy)
      const errors = logs.filter((l) => l.level === "Error")
      assert.strictEqual(errors.length, 1)
      assert.isTrue(errors[0]!.text.endsWith("the heartbeat ping died; counted as a failed ping"))
      assert.isTrue(errors[0]!.hasCause)
    }).pipe(Effect.provide(captureLogs(logs)))
  })
})

describe("shutdown", () => {
  it.effect("stops the heartbeat, then UNREGISTER; no PING after UNREGISTER", () =>
    Effect.gen(function*() {
      const client = makeFakeMqClient()
      const scope = yield* Scope.make()
      // The service's layer over the fake: closing the layer is the adapter's shutdown.
      const adapter = Context.get(yield* Layer.buildWithScope(WorkerAdapter.layerTest(client, settings()), scope), WorkerAdapter)
      yield* adapter.registerKvCaches(descriptors)
      yield* TestClock.adjust("15 seconds")
      yield* Scope.close(scope, Exit.void)
      yield* TestClock.adjust("60 seconds")
      assert.deepStrictEqual(timeline(client).slice(1), [
        "register_kv_cache@0",
        "ping_registered@0",
        "ping_registered@10000",
        "unregister_kv_cache@15000"
      ])
      assert.deepStrictEqual(client.sent.at(-1)?.payload, [ID])
      assert.isFalse(yield* adapter.heartbeatRunning)
      assert.deepStrictEqual(
        (yield* adapter.events).slice(-2).map((e) => `${e._tag}@${e.atMs}`),
        ["HeartbeatStopped@15000", "Unregistered@15000"]
      )
    }))

  it.effect("a straggling cycle (its ping in flight at shutdown) never re-registers after stop", () =>
    Effect.gen(function*() {
      const client = makeFakeMqClient()
      const scope = yield* Scope.make()
      const adapter = yield* adapterOn(client).pipe(Scope.provide(scope))
      yield* adapter.registerKvCaches(descriptors)
      // The ping at 10 s answers "kv_cache missing" 5 s later, after the shutdown at 12 s.
      client.once("ping_registered", reply.ok([]), reply.after(5_000, reply.ok(["kv_cache"])))
      yield* TestClock.adjust("12 seconds")
      yield* Scope.close(scope, Exit.void)
      yield* TestClock.adjust("60 seconds")
      assert.deepStrictEqual(timeline(client, "register_kv_cache", "unregister_kv_cache"), [
        "register_kv_cache@0",
        "unregister_kv_cache@12000"
      ])
      assert.strictEqual(yield* adapter.reregistrations, 0)
    }))

  it.effect("an UNREGISTER that times out only logs a WARNING", () => {
    const logs: Array<CapturedLog> = []
    return Effect.gen(function*() {
      const client = makeFakeMqClient()
      client.answer("unregister_kv_cache", reply.timeout)
      const scope = yield* Scope.make()
      const adapter = yield* adapterOn(client).pipe(Scope.provide(scope))
      yield* adapter.registerKvCaches(descriptors)
      const closing = yield* Effect.forkChild(Scope.close(scope, Exit.void))
      yield* TestClock.adjust("5 seconds")
      assert.isTrue(Exit.isSuccess(yield* Fiber.await(closing)))
      assert.strictEqual(client.sent.at(-1)?.timeoutMs, 5_000)
      assert.deepStrictEqual(logs.filter((l) => l.level === "Warn").map((l) => l.text), [
        `unregister of instance_id=${ID.toString(10)} failed: unregister_kv_cache to fake://server: no reply within 5000 ms: the server did not answer (is it running?)`
      ])
    }).pipe(Effect.provide(captureLogs(logs)))
  })
})

describe("mixed versions", () => {
  it.effect("a server that answers PING_REGISTERED with unknown_op gets plain PING [id] instead, and the worker stays healthy", () => {
    const logs: Array<CapturedLog> = []
    return Effect.gen(function*() {
      const client = makeFakeMqClient()
      client.answer("ping_registered", reply.fail(new UnknownOp({ message: "unknown op 64" })))
      const adapter = yield* adapterOn(client)
      yield* adapter.registerKvCaches(descriptors)
      yield* TestClock.adjust("20 seconds")
      assert.deepStrictEqual(timeline(client, "ping", "ping_registered"), [
        "ping_registered@0",
        "ping@0",
        "ping@10000",
        "ping@20000"
      ])
      assert.deepStrictEqual(client.sent.find((s) => s.op === "ping")?.payload, [ID])
      assert.isTrue(yield* adapter.isHealthy)
      assert.strictEqual(logs.filter((l) => l.level === "Warn" && l.text.includes("unknown_op")).length, 1)
    }).pipe(Effect.provide(captureLogs(logs)))
  })

  it.effect("a server that answers PING with bad_request (old empty payload) leaves the worker unhealthy, with a WARNING naming the answer", () => {
    const logs: Array<CapturedLog> = []
    return Effect.gen(function*() {
      const client = makeFakeMqClient()
      client.answer("ping_registered", reply.fail(new UnknownOp({ message: "unknown op 64" })))
      client.answer("ping", reply.fail(new BadRequest({ message: "ping: expected 0 payload frames, got 1" })))
      const adapter = yield* adapterOn(client)
      yield* adapter.registerKvCaches(descriptors)
      yield* TestClock.adjust("30 seconds")
      assert.isFalse(yield* adapter.isHealthy)
      const unhealthy = logs.filter((l) => l.level === "Warn" && l.text.includes("entering degraded mode"))
      assert.strictEqual(unhealthy.length, 1)
      assert.isTrue(unhealthy[0]!.text.includes("answered ping with bad_request (ping: expected 0 payload frames, got 1)"))
    }).pipe(Effect.provide(captureLogs(logs)))
  })
})
