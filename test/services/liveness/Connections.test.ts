/**
 * The connection tracker on its own (Connections.ts, DESIGN §5 "connection
 * loss"): binding routing ids to held instances, suspicion when the last
 * bound one disconnects, the grace signal on the TestClock, and pruning.
 * Each test gets its own tracker over an in-memory target
 * (`Connections.layerTest`), so each has a fresh clock; no server, no reaper
 * (the reaper's side of the grace is covered in Reaper.test.ts).
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect, Layer, Metric, Option, Queue } from "effect"
import { PrometheusMetrics } from "effect/observability"
import { TestClock } from "effect/testing"
import { makeInstanceId } from "../../../src/schema/InstanceId.ts"
import { Connections } from "../../../src/services/liveness/Connections.ts"
import { PeerEvents } from "../../../src/services/liveness/PeerEvents.ts"
import { captureLogs, type CapturedLog } from "../../support/FakeMqClient.ts"

const id = makeInstanceId

/** Connects `peer`, binds it to each of `ids` (held), then disconnects it: each id it alone held becomes suspect. */
const bindThenLose = (c: Connections["Service"], peer: string, ...ids: ReadonlyArray<number>) =>
  Effect.gen(function*() {
    yield* c.events.connected(peer)
    for (const n of ids) yield* c.events.instanceMessage(peer, id(n))
    yield* c.events.disconnected(peer)
  })

describe("binding", () => {
  it.effect("a message from a connected routing id naming a held instance binds it, once however often it is named", () => {
    const held = new Set([1n])
    return Effect.gen(function*() {
      const c = yield* Connections
      yield* c.events.connected("a")
      assert.deepStrictEqual(c.stats(), { connectedPeers: 1, boundInstances: 0, suspects: 0 })
      yield* c.events.instanceMessage("a", id(1))
      yield* c.events.instanceMessage("a", id(1))
      assert.deepStrictEqual(c.stats(), { connectedPeers: 1, boundInstances: 1, suspects: 0 })
    }).pipe(Effect.provide(Connections.layerTest(held)))
  })

  it.effect("binds nothing for a routing id that is not connected, nor for an id no target holds", () => {
    const held = new Set([1n])
    return Effect.gen(function*() {
      const c = yield* Connections
      yield* c.events.instanceMessage("never-connected", id(1))
      yield* c.events.connected("a")
      yield* c.events.instanceMessage("a", id(2))
      assert.deepStrictEqual(c.stats(), { connectedPeers: 1, boundInstances: 0, suspects: 0 })
      // Unbound instances cannot become suspect: the disconnect finds nothing to judge.
      yield* c.events.disconnected("a")
      yield* c.events.disconnected("never-connected")
      assert.deepStrictEqual(c.stats(), { connectedPeers: 0, boundInstances: 0, suspects: 0 })
    }).pipe(Effect.provide(Connections.layerTest(held)))
  })
})

describe("suspicion", () => {
  it.effect("the last bound routing id disconnecting makes the instance suspect since that Clock millis; one of two left keeps it bound", () => {
    const held = new Set([1n])
    return Effect.gen(function*() {
      const c = yield* Connections
      yield* c.events.connected("a")
      yield* c.events.connected("b")
      yield* c.events.instanceMessage("a", id(1))
      yield* c.events.instanceMessage("b", id(1))
      yield* TestClock.adjust("3 seconds")
      yield* c.events.disconnected("a")
      assert.deepStrictEqual([...c.suspects()], [])
      assert.deepStrictEqual(c.stats(), { connectedPeers: 1, boundInstances: 1, suspects: 0 })
      yield* TestClock.adjust("2 seconds")
      yield* c.events.disconnected("b")
      assert.deepStrictEqual([...c.suspects()], [[1n, 5_000]])
      assert.deepStrictEqual(c.stats(), { connectedPeers: 0, boundInstances: 0, suspects: 1 })
    }).pipe(Effect.provide(Connections.layerTest(held)))
  })

  it.effect("an instance no module holds any more (UNREGISTER came first) departs when its connection closes: logged as a departure, never suspect", () => {
    const held = new Set([4n, 5n])
    const logs: Array<CapturedLog> = []
    return Effect.gen(function*() {
      const c = yield* Connections
      yield* c.events.connected("a")
      yield* c.events.instanceMessage("a", id(4))
      yield* c.events.instanceMessage("a", id(5))
      held.delete(4n) // instance 4 unregistered; 5 did not
      yield* c.events.disconnected("a")
      assert.deepStrictEqual([...c.suspects().keys()], [5n])
      assert.deepStrictEqual(c.stats(), { connectedPeers: 0, boundInstances: 0, suspects: 1 })
      assert.deepStrictEqual(logs.map((l) => l.text), [
        "instance 4 departed: it unregistered, then closed its connection",
        "instance 5 lost its last connection; suspect"
      ])
    }).pipe(Effect.provide(Connections.layerTest(held)), Effect.provide(captureLogs(logs)))
  })

  it.effect("a message naming a suspect from another connected routing id binds it and clears the suspicion, logged both ways", () => {
    const held = new Set([7n])
    const logs: Array<CapturedLog> = []
    return Effect.gen(function*() {
      const c = yield* Connections
      yield* bindThenLose(c, "a", 7)
      assert.strictEqual(c.stats().suspects, 1)
      yield* c.events.connected("b")
      yield* c.events.instanceMessage("b", id(7))
      assert.deepStrictEqual(c.stats(), { connectedPeers: 1, boundInstances: 1, suspects: 0 })
      assert.deepStrictEqual(logs.map((l) => l.text), [
        "instance 7 lost its last connection; suspect",
        "instance 7 is connected again; no longer suspect"
      ])
    }).pipe(Effect.provide(Connections.layerTest(held)), Effect.provide(captureLogs(logs)))
  })

  it.effect("the suspect gauge follows the suspects", () => {
    const held = new Set([1n, 2n])
    return Effect.gen(function*() {
      const c = yield* Connections
      yield* bindThenLose(c, "a", 1, 2)
      assert.match(yield* PrometheusMetrics.format(), /^mpcache_suspect_instances 2$/m)
      yield* c.events.connected("b")
      yield* c.events.instanceMessage("b", id(2))
      assert.match(yield* PrometheusMetrics.format(), /^mpcache_suspect_instances 1$/m)
    }).pipe(Effect.provide(Connections.layerTest(held)), Effect.provideService(Metric.MetricRegistry, new Map()))
  })
})

describe("grace signal", () => {
  it.effect("with a 10 s grace the reaper is woken 1 ms past it (staleness is strict), once per suspect, not at the grace itself", () => {
    const held = new Set([1n])
    return Effect.gen(function*() {
      const c = yield* Connections
      yield* bindThenLose(c, "a", 1)
      yield* TestClock.adjust("10 seconds")
      assert.strictEqual(yield* Queue.size(c.graceExpired), 0)
      yield* TestClock.adjust("1 millis")
      assert.strictEqual(yield* Queue.size(c.graceExpired), 1)
      yield* TestClock.adjust("60 seconds")
      assert.strictEqual(yield* Queue.size(c.graceExpired), 1)
    }).pipe(Effect.provide(Connections.layerTest(held, { disconnectGraceMs: 10_000 })))
  })

  it.effect("grace 0 turns disconnect reaping off: the instance is still suspect, no signal ever comes", () => {
    const held = new Set([1n])
    return Effect.gen(function*() {
      const c = yield* Connections
      yield* bindThenLose(c, "a", 1)
      yield* TestClock.adjust("1 hour")
      assert.strictEqual(c.stats().suspects, 1)
      assert.isTrue(Option.isNone(yield* Queue.poll(c.graceExpired)))
    }).pipe(Effect.provide(Connections.layerTest(held, { disconnectGraceMs: 0 })))
  })
})

describe("pruning and forgetting", () => {
  it.effect("prune forgets bindings and suspicions of ids no target holds any more, and keeps the held ones", () => {
    const held = new Set([1n, 2n, 3n])
    return Effect.gen(function*() {
      const c = yield* Connections
      yield* c.events.connected("a")
      yield* c.events.connected("b")
      yield* c.events.instanceMessage("a", id(1))
      yield* c.events.instanceMessage("a", id(2))
      yield* c.events.instanceMessage("b", id(3))
      yield* c.events.disconnected("b")
      assert.deepStrictEqual(c.stats(), { connectedPeers: 1, boundInstances: 2, suspects: 1 })
      held.delete(2n)
      held.delete(3n)
      yield* c.prune()
      assert.deepStrictEqual(c.stats(), { connectedPeers: 1, boundInstances: 1, suspects: 0 })
      // The forgotten id is not bound to "a" any more: its disconnect makes only 1 suspect.
      yield* c.events.disconnected("a")
      assert.deepStrictEqual([...c.suspects().keys()], [1n])
    }).pipe(Effect.provide(Connections.layerTest(held)))
  })

  it.effect("forget drops an instance's bindings and suspicion at once, whatever the targets say", () => {
    const held = new Set([1n, 2n])
    return Effect.gen(function*() {
      const c = yield* Connections
      yield* c.events.connected("a")
      yield* c.events.instanceMessage("a", id(1))
      yield* c.events.instanceMessage("a", id(2))
      c.forget(1n)
      assert.strictEqual(c.stats().boundInstances, 1)
      yield* c.events.disconnected("a")
      assert.deepStrictEqual([...c.suspects().keys()], [2n])
      c.forget(2n)
      assert.deepStrictEqual(c.stats(), { connectedPeers: 0, boundInstances: 0, suspects: 0 })
    }).pipe(Effect.provide(Connections.layerTest(held)))
  })
})

describe("as PeerEvents", () => {
  it.effect("layerPeerEvents is the tracker's own listener: events sent through it bind and suspect", () => {
    const held = new Set([5n])
    return Effect.gen(function*() {
      const c = yield* Connections
      const events = yield* PeerEvents
      yield* events.connected("a")
      yield* events.instanceMessage("a", id(5))
      assert.strictEqual(c.stats().boundInstances, 1)
      yield* events.disconnected("a")
      assert.deepStrictEqual([...c.suspects().keys()], [5n])
    }).pipe(Effect.provide(Connections.layerPeerEvents.pipe(Layer.provideMerge(Connections.layerTest(held)))))
  })
})
