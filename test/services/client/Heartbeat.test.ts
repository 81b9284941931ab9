/**
 * The client heartbeat (DESIGN §6; upstream HeartbeatThread, reference §6.3),
 * driven by TestClock: cadence on exact clock points, the ping timeout, the
 * recover callback running before health is set, `Lost` recovering without
 * an unhealthy edge, supervision of defects, and stop.
 */
import { assert, describe, it } from "@effect/vitest"
import { Clock, Deferred, Effect, Exit, Fiber, Ref, Scope } from "effect"
import { TestClock } from "effect/testing"
import { Heartbeat, type HeartbeatEvent, makeHeartbeat, type HeartbeatOptions, PingResult } from "../../../src/services/client/Heartbeat.ts"
import { type CapturedLog, captureLogs } from "../../support/FakeMqClient.ts"

/** A scripted ping: answers from the queue, then `Alive`; records the Clock time of each call. */
const scriptedPing = () => {
  const calls: Array<number> = []
  const queue: Array<Effect.Effect<PingResult>> = []
  const ping = Effect.gen(function*() {
    calls.push(yield* Clock.currentTimeMillis)
    const next = queue.shift()
    return next === undefined ? PingResult.alive : yield* next
  })
  return { calls, queue, ping }
}

const base = (ping: Effect.Effect<PingResult>, events: Array<HeartbeatEvent>, extra: Partial<HeartbeatOptions> = {}): HeartbeatOptions => ({
  label: "mpcache server test://",
  intervalMs: 10_000,
  timeoutMs: 10_000,
  ping,
  onEvent: (e) => Effect.sync(() => events.push(e)),
  ...extra
})

const tags = (events: ReadonlyArray<HeartbeatEvent>) => events.map((e) => `${e._tag}@${e.atMs}`)

describe("start", () => {
  it.effect("starts healthy and not running; start runs it; a second start is a no-op", () =>
    Effect.gen(function*() {
      const p = scriptedPing()
      const events: Array<HeartbeatEvent> = []
      const hb = yield* makeHeartbeat(base(p.ping, events))
      assert.isTrue(yield* hb.isHealthy)
      assert.isFalse(yield* hb.isRunning)
      yield* TestClock.adjust("30 seconds")
      assert.deepStrictEqual(p.calls, [])
      yield* hb.start
      yield* hb.start
      yield* TestClock.adjust("0 millis")
      assert.isTrue(yield* hb.isRunning)
      assert.deepStrictEqual(p.calls, [30_000])
      yield* TestClock.adjust("10 seconds")
      assert.deepStrictEqual(p.calls, [30_000, 40_000])
      assert.deepStrictEqual(tags(events), ["HeartbeatStarted@30000"])
    }))
})

describe("cadence", () => {
  it.effect("pings at start, then every interval on exact clock points", () => {
    const p = scriptedPing()
    return Effect.gen(function*() {
      const hb = yield* Heartbeat
      yield* hb.start
      yield* TestClock.adjust("9999 millis")
      assert.deepStrictEqual(p.calls, [0])
      yield* TestClock.adjust("1 millis")
      assert.deepStrictEqual(p.calls, [0, 10_000])
      yield* TestClock.adjust("20 seconds")
      assert.deepStrictEqual(p.calls, [0, 10_000, 20_000, 30_000])
      assert.strictEqual(yield* hb.cycles, 4)
    }).pipe(Effect.provide(Heartbeat.layerTest({ ping: p.ping })))
  })

  it.effect("a ping that waits its whole timeout (= interval) keeps the grid: the next one goes out at once", () =>
    Effect.gen(function*() {
      const p = scriptedPing()
      p.queue.push(Effect.never, Effect.never)
      const hb = yield* makeHeartbeat(base(p.ping, []))
      yield* hb.start
      yield* TestClock.adjust("10 seconds")
      assert.deepStrictEqual(p.calls, [0, 10_000])
      assert.isFalse(yield* hb.isHealthy)
      yield* TestClock.adjust("10 seconds")
      assert.deepStrictEqual(p.calls, [0, 10_000, 20_000])
      assert.isTrue(yield* hb.isHealthy)
    }))
})

describe("health", () => {
  it.effect("a ping without an answer within the timeout flips to unhealthy at the timeout, not before", () =>
    Effect.gen(function*() {
      const p = scriptedPing()
      p.queue.push(Effect.never)
      const events: Array<HeartbeatEvent> = []
      const hb = yield* makeHeartbeat(base(p.ping, events, { timeoutMs: 2_000 }))
      yield* hb.start
      yield* TestClock.adjust("1999 millis")
      assert.isTrue(yield* hb.isHealthy)
      yield* TestClock.adjust("1 millis")
      assert.isFalse(yield* hb.isHealthy)
      assert.deepStrictEqual(events[1], {
        _tag: "Unhealthy",
        atMs: 2_000,
        reason: "no reply to the heartbeat ping within 2000 ms"
      })
    }))

  it.effect("on the next successful ping the recover callback runs before health is set", () =>
    Effect.gen(function*() {
      const p = scriptedPing()
      p.queue.push(Effect.succeed(PingResult.failed("down")))
      const events: Array<HeartbeatEvent> = []
      const seenByRecover: Array<boolean> = []
      const healthRef = yield* Ref.make<Effect.Effect<boolean> | undefined>(undefined)
      const hb = yield* makeHeartbeat(base(p.ping, events, {
        recover: (trigger) =>
          Effect.gen(function*() {
            const isHealthy = yield* Ref.get(healthRef)
            if (isHealthy !== undefined) seenByRecover.push(yield* isHealthy)
            assert.strictEqual(trigger, "edge")
            return true
          })
      }))
      yield* Ref.set(healthRef, hb.isHealthy)
      yield* hb.start
      yield* TestClock.adjust("0 millis")
      assert.isFalse(yield* hb.isHealthy)
      yield* TestClock.adjust("10 seconds")
      assert.deepStrictEqual(seenByRecover, [false])
      assert.isTrue(yield* hb.isHealthy)
      assert.deepStrictEqual(tags(events), ["HeartbeatStarted@0", "Unhealthy@0", "Healthy@10000"])
    }))

  it.effect("a failed recovery keeps it unhealthy; the next successful ping retries", () =>
    Effect.gen(function*() {
      const p = scriptedPing()
      p.queue.push(Effect.succeed(PingResult.failed("down")))
      const results = [false, true]
      let recoveries = 0
      const hb = yield* makeHeartbeat(base(p.ping, [], {
        recover: () => Effect.sync(() => (recoveries++, results.shift() ?? true))
      }))
      yield* hb.start
      yield* TestClock.adjust("10 seconds")
      assert.strictEqual(recoveries, 1)
      assert.isFalse(yield* hb.isHealthy)
      yield* TestClock.adjust("10 seconds")
      assert.strictEqual(recoveries, 2)
      assert.isTrue(yield* hb.isHealthy)
    }))

  it.effect("Lost recovers at once with no unhealthy edge", () =>
    Effect.gen(function*() {
      const p = scriptedPing()
      p.queue.push(Effect.succeed(PingResult.lost("the server does not hold kv_cache")))
      const events: Array<HeartbeatEvent> = []
      const triggers: Array<string> = []
      const hb = yield* makeHeartbeat(base(p.ping, events, {
        recover: (trigger) => Effect.sync(() => (triggers.push(trigger), true))
      }))
      yield* hb.start
      yield* TestClock.adjust("0 millis")
      assert.deepStrictEqual(triggers, ["lost"])
      assert.isTrue(yield* hb.isHealthy)
      assert.deepStrictEqual(tags(events), ["HeartbeatStarted@0"])
    }))

  it.effect("markUnhealthy holds until a ping succeeds", () =>
    Effect.gen(function*() {
      const p = scriptedPing()
      const hb = yield* makeHeartbeat(base(p.ping, []))
      yield* hb.start
      yield* TestClock.adjust("1 second")
      yield* hb.markUnhealthy("lookup timed out")
      assert.isFalse(yield* hb.isHealthy)
      yield* TestClock.adjust("8999 millis")
      assert.isFalse(yield* hb.isHealthy)
      yield* TestClock.adjust("1 millis")
      assert.isTrue(yield* hb.isHealthy)
    }))
})

describe("supervision", () => {
  it.effect("a ping that dies counts as failed and is logged; a defect elsewhere in a cycle is logged; the heartbeat goes on", () => {
    const logs: Array<CapturedLog> = []
    return Effect.gen(function*() {
      const p = scriptedPing()
      p.queue.push(Effect.die(new Error("client exploded")))
      let eventCalls = 0
      const hb = yield* makeHeartbeat(base(p.ping, [], {
        // The second event (Unhealthy) dies: a defect outside ping and recover.
        onEvent: () => Effect.suspend(() => ++eventCalls === 2 ? Effect.die(new Error("listener bug")) : Effect.void)
      }))
      yield* hb.start
      yield* TestClock.adjust("30 seconds")
      assert.deepStrictEqual(p.calls, [0, 10_000, 20_000, 30_000])
      assert.isTrue(yield* hb.isHealthy)
      const errors = logs.filter((l) => l.level === "Error").map((l) => l.text)
      assert.deepStrictEqual(errors, [
        "mpcache server test://: the heartbeat ping died; counted as a failed ping",
        "mpcache server test://: a heartbeat cycle failed; the heartbeat goes on"
      ])
    }).pipe(Effect.provide(captureLogs(logs)))
  })

  it.effect("a recover callback that dies counts as a failed recovery", () =>
    Effect.gen(function*() {
      const p = scriptedPing()
      p.queue.push(Effect.succeed(PingResult.failed("down")))
      let calls = 0
      const hb = yield* makeHeartbeat(base(p.ping, [], {
        recover: () => Effect.suspend(() => ++calls === 1 ? Effect.die(new Error("boom")) : Effect.succeed(true))
      }))
      yield* hb.start
      yield* TestClock.adjust("10 seconds")
      assert.isFalse(yield* hb.isHealthy)
      yield* TestClock.adjust("10 seconds")
      assert.isTrue(yield* hb.isHealthy)
      assert.strictEqual(calls, 2)
    }).pipe(Effect.provide(captureLogs([]))))
})

describe("stop", () => {
  it.effect("stop ends the pings; start after stop is a no-op", () =>
    Effect.gen(function*() {
      const p = scriptedPing()
      const events: Array<HeartbeatEvent> = []
      const hb = yield* makeHeartbeat(base(p.ping, events))
      yield* hb.start
      yield* TestClock.adjust("10 seconds")
      yield* hb.stop
      yield* hb.stop
      yield* hb.start
      yield* TestClock.adjust("60 seconds")
      assert.deepStrictEqual(p.calls, [0, 10_000])
      assert.isFalse(yield* hb.isRunning)
      assert.isTrue(yield* hb.isStopped)
      assert.deepStrictEqual(tags(events), ["HeartbeatStarted@0", "HeartbeatStopped@10000"])
    }))

  it.effect("a straggling cycle whose ping returns after stop never recovers", () =>
    Effect.gen(function*() {
      const p = scriptedPing()
      p.queue.push(Effect.succeed(PingResult.failed("down")))
      // The second ping cannot be interrupted and answers Alive 5 s later, after stop.
      p.queue.push(Effect.uninterruptible(Effect.as(Effect.sleep("5 seconds"), PingResult.alive)))
      let recoveries = 0
      const hb = yield* makeHeartbeat(base(p.ping, [], { recover: () => Effect.sync(() => (recoveries++, true)) }))
      yield* hb.start
      yield* TestClock.adjust("11 seconds")
      const stopping = yield* Effect.forkChild(hb.stop)
      yield* TestClock.adjust("5 seconds")
      yield* Effect.yieldNow
      assert.isTrue(stopping.pollUnsafe() !== undefined)
      assert.strictEqual(recoveries, 0)
      assert.isFalse(yield* hb.isHealthy)
    }))

  it.effect("a stop between start's state change and its fork leaves no loop: no PING after stop (issue 18 item 5)", () =>
    Effect.gen(function*() {
      const p = scriptedPing()
      const events: Array<HeartbeatEvent> = []
      const entered = yield* Deferred.make<void>()
      const gate = yield* Deferred.make<void>()
      // start emits HeartbeatStarted after its state change and before its fork: the hook holds it there.
      const hb = yield* makeHeartbeat(base(p.ping, events, {
        onEvent: (e) =>
          Effect.gen(function*() {
            events.push(e)
            if (e._tag !== "HeartbeatStarted") return
            yield* Deferred.succeed(entered, undefined)
            yield* Deferred.await(gate)
          })
      }))
      const starting = yield* Effect.forkChild(hb.start)
      yield* Deferred.await(entered)
      const stopping = yield* Effect.forkChild(hb.stop)
      // Let stop run as far as it goes while start is held (it has passed its state change once isStopped reads true).
      for (let i = 0; i < 100 && !(yield* hb.isStopped); i++) yield* Effect.yieldNow
      assert.isTrue(yield* hb.isStopped)
      // stop waits for the start in progress to record its fiber, so that it can interrupt it.
      assert.isUndefined(stopping.pollUnsafe())
      yield* Deferred.succeed(gate, undefined)
      yield* Fiber.join(starting)
      yield* Fiber.join(stopping)
      yield* TestClock.adjust("60 seconds")
      assert.deepStrictEqual(p.calls, [])
      assert.strictEqual(yield* hb.cycles, 0)
      assert.isFalse(yield* hb.isRunning)
      assert.deepStrictEqual(tags(events), ["HeartbeatStarted@0", "HeartbeatStopped@0"])
    }))

  it.effect("closing its Scope stops it", () =>
    Effect.gen(function*() {
      const p = scriptedPing()
      const scope = yield* Scope.make()
      const hb = yield* makeHeartbeat(base(p.ping, [])).pipe(Scope.provide(scope))
      yield* hb.start
      yield* TestClock.adjust("0 millis")
      yield* Scope.close(scope, Exit.void)
      yield* TestClock.adjust("30 seconds")
      assert.deepStrictEqual(p.calls, [0])
      assert.isTrue(yield* hb.isStopped)
    }))
})
