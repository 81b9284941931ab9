/**
 * The scheduler adapter's liveness (DESIGN §6; reference §6.3, upstream
 * #5233), against a scripted fake MQ client and TestClock: its heartbeat
 * starts with the first lookup and really runs (PING [nil] every interval),
 * degraded mode answers lookups with 0 and skips lock releases, a timed-out
 * lookup or status query makes the server unhealthy until a ping succeeds,
 * and an old server that refuses PING [nil] keeps it unhealthy with a
 * WARNING that names the answer.
 */
import { assert, describe, it } from "@effect/vitest"
import { Context, Effect, Exit, Fiber, Layer, Scope } from "effect"
import { TestClock } from "effect/testing"
import { BadRequest } from "../../../src/schema/WireError.ts"
import { makeSchedulerAdapterWith, SchedulerAdapter, type SchedulerAdapterSettings } from "../../../src/services/client/SchedulerAdapter.ts"
import { type CapturedLog, captureLogs, type FakeMqClient, makeFakeMqClient, reply } from "../../support/FakeMqClient.ts"

const tokens = Array.from({ length: 600 }, (_, i) => i)

const adapterOn = (client: FakeMqClient, extra: Partial<SchedulerAdapterSettings> = {}) =>
  makeSchedulerAdapterWith(client, { modelName: "m", worldSize: 1, ...extra })

const timeline = (client: FakeMqClient, ...only: ReadonlyArray<string>) =>
  client.sent.filter((s) => only.length === 0 || only.includes(s.op)).map((s) => `${s.op}@${s.atMs}`)

describe("heartbeat", () => {
  it.effect("does not run before the first lookup; starts with it and pings [nil] every interval", () =>
    Effect.gen(function*() {
      const client = makeFakeMqClient()
      const adapter = yield* adapterOn(client)
      yield* TestClock.adjust("5 seconds")
      assert.isFalse(yield* adapter.heartbeatRunning)
      assert.deepStrictEqual(timeline(client, "ping"), [])
      assert.strictEqual(yield* adapter.lookup("r1", tokens), 256)
      yield* adapter.lookup("r2", tokens)
      yield* TestClock.adjust("20 seconds")
      assert.isTrue(yield* adapter.heartbeatRunning)
      assert.deepStrictEqual(timeline(client, "ping"), ["ping@5000", "ping@15000", "ping@25000"])
      assert.deepStrictEqual(client.sent.filter((s) => s.op === "ping").map((s) => s.payload), [[null], [null], [null]])
    }))

  it.effect("closing the Scope stops the heartbeat", () =>
    Effect.gen(function*() {
      const client = makeFakeMqClient()
      const scope = yield* Scope.make()
      // The service's layer over the fake: closing the layer stops its heartbeat.
      const layer = SchedulerAdapter.layerTest(client, { modelName: "m", worldSize: 1 })
      const adapter = Context.get(yield* Layer.buildWithScope(layer, scope), SchedulerAdapter)
      yield* adapter.lookup("r1", tokens)
      yield* TestClock.adjust("10 seconds")
      yield* Scope.close(scope, Exit.void)
      yield* TestClock.adjust("60 seconds")
      assert.deepStrictEqual(timeline(client, "ping"), ["ping@0", "ping@10000"])
      assert.isFalse(yield* adapter.heartbeatRunning)
    }))
})

describe("degraded mode", () => {
  it.effect("while unhealthy a lookup answers 0 without sending LOOKUP; FREE_LOOKUP_LOCKS and END_SESSION are skipped", () =>
    Effect.gen(function*() {
      const client = makeFakeMqClient()
      const adapter = yield* adapterOn(client, { heartbeatTimeoutMs: 1_000 })
      yield* adapter.lookup("r1", tokens)
      client.answer("ping", reply.timeout)
      yield* TestClock.adjust("11 seconds")
      assert.isFalse(yield* adapter.isHealthy)
      const before = client.sent.length
      assert.strictEqual(yield* adapter.lookup("r2", tokens), 0)
      yield* adapter.freeLookupLocks("r1", tokens, 256, 512)
      yield* adapter.endSession("r1")
      assert.deepStrictEqual(timeline(client).slice(before), [])
      client.answer("ping", reply.ok(true))
      yield* TestClock.adjust("9 seconds")
      assert.isTrue(yield* adapter.isHealthy)
      assert.strictEqual(yield* adapter.lookup("r3", tokens), 256)
      yield* adapter.endSession("r3")
      assert.deepStrictEqual(timeline(client, "lookup", "end_session"), ["lookup@0", "lookup@20000", "end_session@20000"])
    }))

  it.effect("a lookup that times out answers 0 and marks the server unhealthy until a ping succeeds", () =>
    Effect.gen(function*() {
      const client = makeFakeMqClient()
      const adapter = yield* adapterOn(client, { requestTimeoutMs: 2_000 })
      client.once("lookup", reply.timeout)
      const first = yield* Effect.forkChild(adapter.lookup("r1", tokens))
      yield* TestClock.adjust("2 seconds")
      assert.strictEqual(yield* Fiber.join(first), 0)
      assert.isFalse(yield* adapter.isHealthy)
      assert.strictEqual(yield* adapter.lookup("r2", tokens), 0)
      assert.deepStrictEqual(timeline(client, "lookup"), ["lookup@0"])
      yield* TestClock.adjust("7999 millis")
      assert.isFalse(yield* adapter.isHealthy)
      yield* TestClock.adjust("1 millis")
      assert.isTrue(yield* adapter.isHealthy)
      assert.deepStrictEqual(
        (yield* adapter.events).map((e) => `${e._tag}@${e.atMs}`),
        ["HeartbeatStarted@0", "Unhealthy@2000", "Healthy@10000"]
      )
    }))

  it.effect("a status query that never answers marks the server unhealthy too", () =>
    Effect.gen(function*() {
      const client = makeFakeMqClient()
      const adapter = yield* adapterOn(client, { requestTimeoutMs: 2_000 })
      client.once("query_prefetch_status", reply.hang)
      const first = yield* Effect.forkChild(adapter.lookup("r1", tokens))
      yield* TestClock.adjust("2 seconds")
      assert.strictEqual(yield* Fiber.join(first), 0)
      assert.isFalse(yield* adapter.isHealthy)
    }))

  it.effect("a pending prefetch is polled until it answers: 1 ms apart at first, the delay doubling up to pollIntervalMs", () =>
    Effect.gen(function*() {
      const client = makeFakeMqClient()
      const adapter = yield* adapterOn(client, { pollIntervalMs: 5 })
      client.once("query_prefetch_status", ...Array.from({ length: 5 }, () => reply.ok(null)), reply.ok(2))
      const looking = yield* Effect.forkChild(adapter.lookup("r1", tokens))
      yield* TestClock.adjust("17 millis")
      assert.strictEqual(yield* Fiber.join(looking), 512)
      assert.deepStrictEqual(timeline(client, "query_prefetch_status"), [0, 1, 3, 7, 12, 17].map((t) => `query_prefetch_status@${t}`))
    }))

  it.effect("by default the polls of a pending prefetch are at most 8 ms apart", () =>
    Effect.gen(function*() {
      const client = makeFakeMqClient()
      const adapter = yield* adapterOn(client)
      client.once("query_prefetch_status", ...Array.from({ length: 6 }, () => reply.ok(null)), reply.ok(1))
      const looking = yield* Effect.forkChild(adapter.lookup("r1", tokens))
      yield* TestClock.adjust("31 millis")
      assert.strictEqual(yield* Fiber.join(looking), 256)
      assert.deepStrictEqual(timeline(client, "query_prefetch_status"), [0, 1, 3, 7, 15, 23, 31].map((t) => `query_prefetch_status@${t}`))
    }))
})

describe("mixed versions", () => {
  it.effect("a server that answers PING [nil] with bad_request keeps the scheduler unhealthy, with a WARNING naming the answer", () => {
    const logs: Array<CapturedLog> = []
    return Effect.gen(function*() {
      const client = makeFakeMqClient()
      client.answer("ping", reply.fail(new BadRequest({ message: "ping: expected 0 payload frames, got 1" })))
      const adapter = yield* adapterOn(client)
      yield* adapter.lookup("r1", tokens)
      yield* TestClock.adjust("30 seconds")
      assert.isFalse(yield* adapter.isHealthy)
      assert.deepStrictEqual(timeline(client, "ping"), ["ping@0", "ping@10000", "ping@20000", "ping@30000"])
      const warnings = logs.filter((l) => l.level === "Warn").map((l) => l.text)
      assert.deepStrictEqual(warnings, [
        "mpcache server fake://server (scheduler) is unhealthy — entering degraded mode: the server answered ping with " +
        "bad_request (ping: expected 0 payload frames, got 1); it predates this client's protocol (an old server expects " +
        "the old empty PING payload) — upgrade the server; staying in degraded mode"
      ])
    }).pipe(Effect.provide(captureLogs(logs)))
  })
})
