/**
 * Worker liveness on the server (DESIGN §5; the failure-mode table),
 * on the TestClock: no real sleeping. Defaults: reap timeout 120 s (scans
 * every 30 s), registration grace 3600 s, disconnect grace 10 s.
 */
import { assert, describe, it } from "@effect/vitest"
import { Deferred, Effect, Layer } from "effect"
import { TestClock } from "effect/testing"
import { Connections } from "../../../src/services/liveness/Connections.ts"
import { LmcacheDrivenTransfer } from "../../../src/services/server/LmcacheDrivenTransfer.ts"
import { Management } from "../../../src/services/server/Management.ts"
import { Reaper } from "../../../src/services/liveness/Reaper.ts"
import { scanPeriodMs } from "../../../src/services/liveness/LivenessSettings.ts"
import { RequestBarrier } from "../../../src/services/liveness/RequestBarrier.ts"
import { emptyKey, id, livenessEnv, workerCache } from "../../support/LivenessEnv.ts"
import { observeStalls, stoppedBetween } from "./StoppedClock.ts"

/** Registers instance `n`, then PINGs and transfers once: both flags latched. */
const registerServed = (n: number) =>
  Effect.gen(function*() {
    const transfer = yield* LmcacheDrivenTransfer
    const management = yield* Management
    const cache = yield* workerCache
    yield* transfer.register(id(n), cache.descriptors, "m", 1, "vllm")
    yield* management.ping(id(n))
    assert.isTrue(yield* transfer.store(emptyKey, id(n), [[]]))
    return cache
  })

const registered = (n: number) =>
  Effect.gen(function*() {
    const transfer = yield* LmcacheDrivenTransfer
    return yield* transfer.isRegistered(id(n))
  })

/** Advances the clock in `stepSeconds` steps, running `each` after every step. */
const advance = (totalSeconds: number, stepSeconds: number, each: Effect.Effect<void, unknown, never> = Effect.void) =>
  Effect.gen(function*() {
    for (let t = 0; t < totalSeconds; t += stepSeconds) {
      yield* TestClock.adjust(`${stepSeconds} seconds`)
      yield* each
    }
  })

/**
 * A request barrier that tells when a scan starts, and can hold scans. The loop is sequential, so a scan
 * starting means every earlier scan has finished, its releases (real munmaps) included: tests wait on
 * that, never on a timer.
 */
const scanProbe = () => {
  const waiting: Array<Deferred.Deferred<void>> = []
  let hold: Deferred.Deferred<void> | undefined
  const layer = Layer.succeed(RequestBarrier, {
    enter: () => 0,
    exit: () => {},
    awaitReceived: () =>
      Effect.suspend(() => {
        waiting.splice(0).forEach((d) => Deferred.doneUnsafe(d, Effect.void))
        return hold === undefined ? Effect.void : Deferred.await(hold)
      }),
    stats: () => ({ waiters: 0, unfinished: 0 })
  })
  /**
   * Waits until a scan starts after this call, so the scan running now (if any) has finished. Advances the
   * clock one scan period first so that one comes: either its sleep ends, or, when the scan running now
   * ends after that time, the next one starts at once.
   */
  const afterScan = (periodMs: number) =>
    Effect.gen(function*() {
      const started = Deferred.makeUnsafe<void>()
      waiting.push(started)
      yield* TestClock.adjust(periodMs)
      yield* Deferred.await(started)
    })
  /** Scans from now on wait before judging, until `release`: the reaper stalls while the clock runs. */
  const holdScans = () => void (hold = Deferred.makeUnsafe<void>())
  /** Lets the held scan go on, and waits until the next scan has started. */
  const releaseScans = Effect.suspend(() => {
    const held = hold
    hold = undefined
    const started = Deferred.makeUnsafe<void>()
    waiting.push(started)
    if (held !== undefined) Deferred.doneUnsafe(held, Effect.void)
    return Deferred.await(started)
  })
  return { layer, afterScan, holdScans, releaseScans }
}

describe("schedule", () => {
  it("scans every timeout/4, at least every disconnect grace/2; never when both are 0", () => {
    const w = (reapTimeoutMs: number, disconnectGraceMs: number) => ({ reapTimeoutMs, registrationGraceMs: 3_600_000, disconnectGraceMs })
    assert.deepStrictEqual(
      [scanPeriodMs(w(120_000, 10_000)), scanPeriodMs(w(120_000, 0)), scanPeriodMs(w(0, 10_000)), scanPeriodMs(w(120_000, 100_000)), scanPeriodMs(w(0, 0))],
      [5_000, 30_000, 5_000, 30_000, Infinity]
    )
  })
})

describe("reap windows", () => {
  it.effect("crash after serving (both flags latched): reaped after the timeout, by timeout + timeout/4, never before", () =>
    Effect.gen(function*() {
      yield* registerServed(1)
      yield* TestClock.adjust("120 seconds")
      assert.isTrue(yield* registered(1), "kept at exactly the timeout")
      yield* TestClock.adjust("30 seconds")
      assert.isFalse(yield* registered(1), "reaped by timeout + timeout/4")
    }).pipe(Effect.scoped, Effect.provide(livenessEnv())))

  it.effect("the reaped instance is released through the UNREGISTER finalizer and logged once", () =>
    Effect.gen(function*() {
      const reaper = yield* Reaper
      yield* registerServed(1)
      yield* TestClock.adjust("90 seconds")
      const reaped = yield* reaper.scan(121_000)
      assert.deepStrictEqual(reaped, [{ id: id(1), reason: "timeout", silentMs: 121_000, windowMs: 120_000 }])
      assert.deepStrictEqual(yield* reaper.scan(1_000_000), [])
    }).pipe(Effect.scoped, Effect.provide(livenessEnv())))

  it.effect("crash during warm-up (registered, never pinged): kept through the timeout, reaped on the grace", () =>
    Effect.gen(function*() {
      const transfer = yield* LmcacheDrivenTransfer
      const cache = yield* workerCache
      yield* transfer.register(id(2), cache.descriptors, "m", 1, "vllm")
      yield* TestClock.adjust("3600 seconds")
      assert.isTrue(yield* registered(2))
      yield* TestClock.adjust("30 seconds")
      assert.isFalse(yield* registered(2))
    }).pipe(Effect.scoped, Effect.provide(livenessEnv())))

  it.effect("pinged but never transferring (idle after start) keeps the grace, not the timeout", () =>
    Effect.gen(function*() {
      const transfer = yield* LmcacheDrivenTransfer
      const management = yield* Management
      const cache = yield* workerCache
      yield* transfer.register(id(3), cache.descriptors, "m", 1, "vllm")
      yield* management.ping(id(3))
      yield* TestClock.adjust("600 seconds")
      assert.isTrue(yield* registered(3))
    }).pipe(Effect.scoped, Effect.provide(livenessEnv())))

  it.effect("a live worker with no traffic whose heartbeat runs is never reaped", () =>
    Effect.gen(function*() {
      const management = yield* Management
      yield* registerServed(4)
      yield* advance(4 * 3600, 10, Effect.asVoid(management.ping(id(4))))
      assert.isTrue(yield* registered(4))
    }).pipe(Effect.scoped, Effect.provide(livenessEnv())))

  it.effect("heartbeat starved while transfers continue: never reaped", () =>
    Effect.gen(function*() {
      const transfer = yield* LmcacheDrivenTransfer
      yield* registerServed(5)
      yield* advance(2 * 3600, 60, Effect.asVoid(Effect.orDie(transfer.store(emptyKey, id(5), [[]]))))
      assert.isTrue(yield* registered(5))
    }).pipe(Effect.scoped, Effect.provide(livenessEnv())))

  it.effect("partition shorter than the timeout: no reap; on heal re-register is the no-op path (nothing rebuilt)", () =>
    Effect.gen(function*() {
      const transfer = yield* LmcacheDrivenTransfer
      const cache = yield* registerServed(6)
      const before = yield* transfer.target.instances()
      yield* TestClock.adjust("100 seconds")
      assert.isTrue(yield* registered(6))
      yield* transfer.register(id(6), cache.descriptors, "m", 1, "vllm")
      const after = yield* transfer.target.instances()
      assert.strictEqual(after.length, 1)
      assert.deepStrictEqual(after[0]!.details, before[0]!.details)
      assert.strictEqual(after[0]!.has_transfer_activity, true)
      assert.strictEqual(after[0]!.last_seen_age_seconds, 0)
    }).pipe(Effect.scoped, Effect.provide(livenessEnv())))

  it.effect("partition longer than the timeout: reaped; on heal exactly one fresh context", () =>
    Effect.gen(function*() {
      const transfer = yield* LmcacheDrivenTransfer
      const management = yield* Management
      const cache = yield* registerServed(7)
      yield* TestClock.adjust("180 seconds")
      assert.isFalse(yield* registered(7))
      assert.deepStrictEqual(yield* management.pingRegistered(id(7), ["kv_cache"]), ["kv_cache"])
      yield* transfer.register(id(7), cache.descriptors, "m", 1, "vllm")
      const instances = yield* transfer.target.instances()
      assert.deepStrictEqual(instances.map((i) => [i.instance_id, i.has_liveness_signal, i.has_transfer_activity]), [["7", false, false]])
      assert.deepStrictEqual(yield* management.pingRegistered(id(7), ["kv_cache"]), [])
    }).pipe(Effect.scoped, Effect.provide(livenessEnv())))

  it.effect("crash and restart: the new process has a new id and entry; the old id is reaped on its own", () =>
    Effect.gen(function*() {
      const management = yield* Management
      const transfer = yield* LmcacheDrivenTransfer
      const cache = yield* workerCache
      yield* registerServed(8)
      yield* TestClock.adjust("60 seconds")
      yield* transfer.register(id(9), cache.descriptors, "m", 1, "vllm")
      yield* management.ping(id(9))
      yield* advance(120, 10, Effect.asVoid(management.ping(id(9))))
      assert.deepStrictEqual([yield* registered(8), yield* registered(9)], [false, true])
    }).pipe(Effect.scoped, Effect.provide(livenessEnv())))

  it.effect("PING with nil or an unknown id inserts nothing; PING_REGISTERED for an unknown id reports every kind missing", () =>
    Effect.gen(function*() {
      const management = yield* Management
      const transfer = yield* LmcacheDrivenTransfer
      assert.strictEqual(yield* management.ping(null), true)
      assert.strictEqual(yield* management.ping(id(42)), true)
      assert.strictEqual(yield* transfer.target.trackedInstanceCount(), 0)
      assert.deepStrictEqual(
        yield* management.pingRegistered(id(42), ["kv_cache", "engine_driven", "cb_rope"]),
        ["kv_cache", "engine_driven", "cb_rope"]
      )
      assert.strictEqual(yield* transfer.target.trackedInstanceCount(), 0)
    }).pipe(Effect.scoped, Effect.provide(livenessEnv())))

  it.effect("reaping disabled with timeout 0 (and disconnect grace 0): nothing is ever reaped", () =>
    Effect.gen(function*() {
      const reaper = yield* Reaper
      assert.isFalse(reaper.reaperEnabled)
      yield* registerServed(10)
      yield* TestClock.adjust("100000 seconds")
      assert.isTrue(yield* registered(10))
      const status = yield* reaper.status()
      assert.deepStrictEqual(status["worker_liveness"], {
        enabled: false,
        reap_timeout_seconds: 0,
        registration_grace_seconds: 0,
        disconnect_grace_seconds: 0,
        tracked_instances: 1
      })
    }).pipe(
      Effect.scoped,
      Effect.provide(livenessEnv({ workerReapTimeoutSeconds: 0, workerRegistrationGraceSeconds: 0, workerDisconnectGraceSeconds: 0 }))
    ))

  it.effect("a scan that starts late (the server stalled) judges at the time it was due: the stall is not silence", () => {
    // A barrier the test can hold shut: the reaper wakes on time, then stalls before judging.
    const gate = { held: false, release: Deferred.makeUnsafe<void>() }
    const barrier = Layer.succeed(RequestBarrier, {
      enter: () => 0,
      exit: () => {},
      awaitReceived: () => (gate.held ? Deferred.await(gate.release) : Effect.void),
      stats: () => ({ waiters: 0, unfinished: 0 })
    })
    return Effect.gen(function*() {
      const management = yield* Management
      yield* registerServed(11)
      yield* TestClock.adjust("90 seconds")
      gate.held = true
      yield* TestClock.adjust("30 seconds") // the scan due at 120 s wakes and stalls
      yield* TestClock.adjust("400 seconds") // ... for 400 s, while nothing is judged
      gate.held = false
      yield* Deferred.succeed(gate.release, undefined)
      yield* Effect.yieldNow
      assert.isTrue(yield* registered(11), "judged at 120 s: silent 120 s, not more")
      yield* management.ping(id(11))
      yield* TestClock.adjust("60 seconds")
      assert.isTrue(yield* registered(11))
    }).pipe(Effect.scoped, Effect.provide(livenessEnv({}, barrier)))
  })
})

describe("connection loss", () => {
  it.effect("the last bound connection closing makes the instance suspect; silent past the disconnect grace it is reaped", () => {
    const probe = scanProbe()
    return Effect.gen(function*() {
      const connections = yield* Connections
      const reaper = yield* Reaper
      yield* registerServed(20)
      yield* connections.events.connected("peer-a")
      yield* connections.events.instanceMessage("peer-a", id(20))
      yield* connections.events.disconnected("peer-a")
      const status = yield* reaper.status()
      assert.strictEqual((status["instances"] as ReadonlyArray<{ state: string }>)[0]!.state, "suspect")
      yield* TestClock.adjust("10 seconds")
      assert.isTrue(yield* registered(20), "not before the grace")
      yield* TestClock.adjust("5 seconds")
      assert.isFalse(yield* registered(20))
      // The scan finishes after the mapping's munmap (real async work), then forgets the instance:
      // wait for the next scan to start, not for a timer.
      yield* probe.afterScan(5_000)
      assert.strictEqual(connections.stats().suspects, 0)
    }).pipe(Effect.scoped, Effect.provide(livenessEnv({}, probe.layer)))
  })

  it.effect("a message naming the instance from a connected routing id binds it and clears the suspicion", () =>
    Effect.gen(function*() {
      const connections = yield* Connections
      const management = yield* Management
      const reaper = yield* Reaper
      yield* registerServed(21)
      yield* connections.events.connected("peer-a")
      yield* connections.events.instanceMessage("peer-a", id(21))
      yield* connections.events.disconnected("peer-a")
      yield* TestClock.adjust("6 seconds")
      yield* connections.events.connected("peer-b")
      yield* connections.events.instanceMessage("peer-b", id(21))
      yield* management.ping(id(21))
      yield* TestClock.adjust("60 seconds")
      assert.isTrue(yield* registered(21))
      const status = yield* reaper.status()
      assert.strictEqual((status["instances"] as ReadonlyArray<{ state: string }>)[0]!.state, "active")
    }).pipe(Effect.scoped, Effect.provide(livenessEnv())))

  it.effect("an instance with two bound connections stays bound while one is left; unknown ids bind nothing", () =>
    Effect.gen(function*() {
      const connections = yield* Connections
      yield* registerServed(22)
      yield* connections.events.connected("a")
      yield* connections.events.connected("b")
      yield* connections.events.instanceMessage("a", id(22))
      yield* connections.events.instanceMessage("b", id(22))
      yield* connections.events.instanceMessage("b", id(999))
      yield* connections.events.disconnected("a")
      assert.deepStrictEqual(connections.stats(), { connectedPeers: 1, boundInstances: 1, suspects: 0 })
      yield* TestClock.adjust("60 seconds")
      assert.isTrue(yield* registered(22))
    }).pipe(Effect.scoped, Effect.provide(livenessEnv())))

  it.effect("disconnect grace 0 disables disconnect reaping", () =>
    Effect.gen(function*() {
      const connections = yield* Connections
      yield* registerServed(23)
      yield* connections.events.connected("a")
      yield* connections.events.instanceMessage("a", id(23))
      yield* connections.events.disconnected("a")
      yield* TestClock.adjust("100 seconds")
      assert.isTrue(yield* registered(23))
    }).pipe(Effect.scoped, Effect.provide(livenessEnv({ workerDisconnectGraceSeconds: 0 }))))
})

describe("server stalls seen by the reaper", () => {
  /**
   * The scan due at 5 s (defaults: a 5 s period) is held for `heldMs`, so the next one, due at 10 s, starts
   * at 5 s + `heldMs`. The event-loop ticker runs on time meanwhile: only the reaper sees this stall.
   */
  const lateBy = (heldMs: number) => {
    const probe = scanProbe()
    return observeStalls(Effect.gen(function*() {
      yield* TestClock.adjust("4 seconds")
      probe.holdScans()
      yield* TestClock.adjust("1 second")
      yield* TestClock.adjust(heldMs)
      yield* probe.releaseScans
    }).pipe(Effect.scoped, Effect.provide(livenessEnv({}, probe.layer))))
  }

  it.effect("a scan late by exactly one period: no WARNING, nothing counted", () =>
    Effect.gen(function*() {
      const { warnings, metrics } = yield* lateBy(10_000)
      assert.deepStrictEqual(warnings, [])
      assert.notMatch(metrics, /mpcache_server_stalls_total/)
    }))

  it.effect("a scan late by one period + 1 ms: one WARNING with the figures, counted once", () =>
    Effect.gen(function*() {
      const { warnings, metrics } = yield* lateBy(10_001)
      assert.deepStrictEqual(warnings, [
        "server stalled for 5.001 s (reaper scan started 5.001 s late, period 5 s); liveness deadlines were extended by 5.001 s"
      ])
      assert.match(metrics, /^mpcache_server_stalls_total\{source="reaper"\} 1$/m)
      assert.notMatch(metrics, /mpcache_server_stalls_total\{source="event_loop"\}/)
      assert.match(metrics, /^mpcache_server_stall_seconds_sum 5\.001$/m)
    }))

  it.effect("a suspect's grace that wakes the reaper after a pause does not make the pause silence: judged when the scan was due", () =>
    Effect.gen(function*() {
      // Period 5 s. Instance 30 pinged at 5 s (its timeout ends at 125 s); 31 suspect from 110 s (its grace
      // ends at 120.001 s). The process is stopped from 120 s (after that scan) to 200 s: the grace signal
      // and the scan due at 125 s both wake at 200 s, the grace one first.
      const { result, warnings } = yield* stoppedBetween(
        120_000,
        200_000,
        Effect.gen(function*() {
          const connections = yield* Connections
          const management = yield* Management
          yield* registerServed(30)
          yield* registerServed(31)
          yield* TestClock.adjust("5 seconds")
          yield* management.ping(id(30))
          yield* connections.events.connected("peer-31")
          yield* connections.events.instanceMessage("peer-31", id(31))
          yield* TestClock.adjust("105 seconds")
          yield* connections.events.disconnected("peer-31")
          yield* TestClock.adjust("90 seconds")
          return [yield* registered(30), yield* registered(31)]
        }).pipe(Effect.scoped, Effect.provide(livenessEnv()))
      )
      assert.deepStrictEqual(result, [true, false], "30 judged at 125 s (silent 120 s), 31 past its grace")
      // The reaper ran first after the pause (woken by the grace signal): its report is the one told.
      assert.deepStrictEqual(warnings, [
        "server stalled for 75.000 s (reaper scan started 75.000 s late, period 5 s); liveness deadlines were extended by 75.000 s"
      ])
    }))
})


describe("the reaper alone (Reaper.layerTest: one in-memory target, no modules)", () => {
  it.effect("a 120 s reap timeout scans every 30 s on the grid, each scan judging at its due time", () => {
    const scans: Array<number> = []
    return Effect.gen(function*() {
      const reaper = yield* Reaper
      assert.isTrue(reaper.reaperEnabled)
      yield* TestClock.adjust("90 seconds")
      assert.deepStrictEqual(scans, [30_000, 60_000, 90_000])
    }).pipe(Effect.scoped, Effect.provide(Reaper.layerTest(new Set(), { reapTimeoutMs: 120_000, registrationGraceMs: 60_000 }, { scans })))
  })

  it.effect("a suspect's grace running out wakes a scan 1 ms past it, between the scheduled ones (grace 10 s: period 5 s)", () => {
    const scans: Array<number> = []
    return Effect.gen(function*() {
      const connections = yield* Connections
      yield* connections.events.connected("a")
      yield* connections.events.instanceMessage("a", id(1))
      yield* connections.events.disconnected("a")
      yield* TestClock.adjust("15 seconds")
      assert.deepStrictEqual(scans, [5_000, 10_000, 10_001, 15_000])
    }).pipe(Effect.scoped, Effect.provide(Reaper.layerTest(new Set([1n]), { disconnectGraceMs: 10_000 }, { scans })))
  })

  it.effect("every window 0: the reaper is disabled, never scans, and status says so with the tracked count", () => {
    const scans: Array<number> = []
    return Effect.gen(function*() {
      const reaper = yield* Reaper
      yield* TestClock.adjust("1 hour")
      assert.deepStrictEqual(scans, [])
      assert.isFalse(reaper.reaperEnabled)
      assert.deepStrictEqual((yield* reaper.status())["worker_liveness"], {
        enabled: false,
        reap_timeout_seconds: 0,
        registration_grace_seconds: 0,
        disconnect_grace_seconds: 0,
        tracked_instances: 2
      })
    }).pipe(Effect.scoped, Effect.provide(Reaper.layerTest(new Set([1n, 2n]), {}, { scans })))
  })
})
