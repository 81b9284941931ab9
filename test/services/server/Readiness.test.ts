/**
 * The probes' rules (Readiness.ts, issue 27 item 3) on the TestClock: the
 * reaper's last scan against two scan periods (a real Reaper whose target
 * hangs in its scan), the event-loop ticker's last tick against its bound (a
 * process stopped on the TestClock, StoppedClock.ts), the fd socket and L2
 * rules, and the Readiness service over the real module graph. No real time.
 */
import { assert, describe, it } from "@effect/vitest"
import { Clock, Deferred, Effect, Layer } from "effect"
import { TestClock } from "effect/testing"
import { Connections } from "../../../src/services/liveness/Connections.ts"
import { LivenessSettings } from "../../../src/services/liveness/LivenessSettings.ts"
import { LivenessTargets, noopTarget } from "../../../src/services/liveness/LivenessTarget.ts"
import { Reaper } from "../../../src/services/liveness/Reaper.ts"
import { RequestBarrier } from "../../../src/services/liveness/RequestBarrier.ts"
import { makeWatchEventLoop, ServerStalls } from "../../../src/services/liveness/Stalls.ts"
import {
  eventLoopCheck,
  fdSocketCheck,
  l2Check,
  mqCheck,
  Readiness,
  reaperCheck,
  verdict
} from "../../../src/services/server/Readiness.ts"
import type { L2Status } from "../../../src/services/server/l2/L2Tier.ts"
import { livenessEnv } from "../../support/LivenessEnv.ts"
import { stoppedBetween } from "../liveness/StoppedClock.ts"

/** A real reaper (timeout 120 s: period 30 s) over one target whose scans wait for `release`. */
const hangingReaper = (release: Deferred.Deferred<void>, scans: Array<number>) =>
  Reaper.layer.pipe(
    Layer.provideMerge(Connections.layer),
    Layer.provideMerge(Layer.mergeAll(
      Layer.succeed(LivenessTargets, [{
        ...noopTarget("hanging"),
        reapStaleInstances: (rule) =>
          Effect.andThen(Effect.sync(() => scans.push(rule.nowMs)), Effect.as(Deferred.await(release), []))
      }]),
      LivenessSettings.layerTest({ reapTimeoutMs: 120_000, registrationGraceMs: 3_600_000 }),
      RequestBarrier.layerTest
    ))
  )

const reaperNow = Effect.gen(function*() {
  const reaper = yield* Reaper
  return reaperCheck(reaper.reaperEnabled, reaper.scans(), yield* Clock.currentTimeMillis)
})

describe("reaper check", () => {
  it.effect("a scan hanging since 30 s: ready up to 2 × 30 s after the last scan ended (here: the start), not ready 1 ms later", () =>
    Effect.gen(function*() {
      const release = yield* Deferred.make<void>()
      const scans: Array<number> = []
      yield* Effect.gen(function*() {
        yield* TestClock.adjust("30 seconds")
        assert.deepStrictEqual(scans, [30_000])
        yield* TestClock.adjust("30 seconds")
        assert.deepStrictEqual(yield* reaperNow, {
          name: "reaper",
          ok: true,
          detail: "no scan has ended in the 60.000 s since the reaper started (period 30 s, bound 2 × 30 s = 60 s)"
        })
        yield* TestClock.adjust("1 millis")
        assert.deepStrictEqual(yield* reaperNow, {
          name: "reaper",
          ok: false,
          detail:
            "no scan has ended in the 60.001 s since the reaper started, more than two scan periods (period 30 s, bound 2 × 30 s = 60 s): the reaper is stuck or was stopped"
        })
        // The scan ends; the one due at 60 s runs at once (and ends): the check counts from its end.
        yield* Deferred.succeed(release, undefined)
        yield* TestClock.adjust("0 millis")
        assert.deepStrictEqual(scans, [30_000, 60_000])
        assert.deepStrictEqual(yield* reaperNow, {
          name: "reaper",
          ok: true,
          detail: "last scan ended 0.000 s ago (period 30 s, bound 2 × 30 s = 60 s)"
        })
        yield* TestClock.adjust("29 seconds")
        assert.deepStrictEqual((yield* reaperNow).detail, "last scan ended 29.000 s ago (period 30 s, bound 2 × 30 s = 60 s)")
        // The next scan, due at 90 s, ends at once now.
        yield* TestClock.adjust("999 millis")
        assert.deepStrictEqual(scans, [30_000, 60_000, 90_000])
        assert.deepStrictEqual((yield* reaperNow).detail, "last scan ended 0.000 s ago (period 30 s, bound 2 × 30 s = 60 s)")
      }).pipe(Effect.provide(hangingReaper(release, scans)), Effect.ensuring(Deferred.succeed(release, undefined)))
    }))

  it.effect("reaping off: ok, saying so, whatever the clock", () =>
    Effect.gen(function*() {
      yield* TestClock.adjust("1 hours")
      assert.deepStrictEqual(yield* reaperNow, {
        name: "reaper",
        ok: true,
        detail: "reaping is off (--worker-reap-timeout-seconds and --worker-disconnect-grace-seconds are 0)"
      })
    }).pipe(Effect.provide(Reaper.layerTest(new Set()))))
})

describe("event-loop check", () => {
  // Ticks every 250 ms; the tick due at 1250 ms falls in the stop (1 s to 7 s) and wakes at its end.
  it.effect("a process stopped from 1 s to 7 s: live up to 5 s after the last tick, not live 1 ms later, then the stall told", () =>
    Effect.gen(function*() {
      const { result } = yield* stoppedBetween(
        1_000,
        7_000,
        Effect.gen(function*() {
          const stalls = yield* ServerStalls
          yield* Effect.forkScoped(makeWatchEventLoop({ report: false }))
          const at = (ms: number) =>
            Effect.gen(function*() {
              yield* TestClock.setTime(ms)
              return eventLoopCheck(stalls.eventLoop(), yield* Clock.currentTimeMillis)
            })
          return [yield* at(1_000), yield* at(6_000), yield* at(6_001), yield* at(7_000), yield* at(9_000)]
        }).pipe(Effect.scoped, Effect.provide(ServerStalls.layerTest))
      )
      assert.deepStrictEqual(result, [
        { name: "event_loop", ok: true, detail: "last tick 0.000 s ago (bound 5 s); no stall seen" },
        { name: "event_loop", ok: true, detail: "last tick 5.000 s ago (bound 5 s); no stall seen" },
        {
          name: "event_loop",
          ok: false,
          detail: "last tick 5.001 s ago, more than the bound 5 s: the event loop is blocked or the process was stopped; no stall seen"
        },
        { name: "event_loop", ok: true, detail: "last tick 0.000 s ago (bound 5 s); last stall: a tick 5.750 s late, ended 0.000 s ago" },
        { name: "event_loop", ok: true, detail: "last tick 0.000 s ago (bound 5 s); last stall: a tick 5.750 s late, ended 2.000 s ago" }
      ])
    }))

  it("no ticker: not live", () => {
    assert.deepStrictEqual(eventLoopCheck(undefined, 0), { name: "event_loop", ok: false, detail: "no event-loop ticker runs in this process" })
  })
})

describe("fd socket, L2, MQ and the verdict", () => {
  it("fd_socket: configured must listen with its file present; not configured or off passes", () => {
    assert.deepStrictEqual(fdSocketCheck({ configured: "/run/x.sock", socketPath: "/run/x.sock", present: true }), {
      name: "fd_socket",
      ok: true,
      detail: "configured (--fd-socket) and listening"
    })
    assert.deepStrictEqual(fdSocketCheck({ configured: "/run/x.sock", socketPath: "/run/x.sock", present: false }), {
      name: "fd_socket",
      ok: false,
      detail: "configured (--fd-socket) but the socket file is gone or is no socket: clients cannot connect"
    })
    assert.deepStrictEqual(fdSocketCheck({ configured: undefined, socketPath: undefined, present: false }), {
      name: "fd_socket",
      ok: true,
      detail: "not configured (--fd-socket); cpu_memfd off"
    })
    assert.deepStrictEqual(fdSocketCheck({ configured: "off", socketPath: undefined, present: false }), {
      name: "fd_socket",
      ok: true,
      detail: "off (--fd-socket off): cpu_memfd off"
    })
  })

  it("l2: never fatal; its breaker state in the detail", () => {
    const l2 = (state: L2Status["state"], connected: boolean) => ({ state, connected }) as Pick<L2Status, "state" | "connected">
    assert.deepStrictEqual(l2Check(null), { name: "l2", ok: true, detail: "not configured (--l2-url)" })
    assert.deepStrictEqual(l2Check({ ...statusL2, ...l2("ok", true) }), { name: "l2", ok: true, detail: "breaker ok, connected" })
    assert.deepStrictEqual(l2Check({ ...statusL2, ...l2("open", false) }), {
      name: "l2",
      ok: true,
      detail: "breaker open, not connected (not fatal: L2 is skipped, every L2 read a miss, until it recovers)"
    })
  })

  it("mq_bound and the verdict: one failing check makes the probe fail", () => {
    assert.deepStrictEqual(mqCheck(false), {
      name: "mq_bound",
      ok: false,
      detail: "the ROUTER is not receiving: shutting down, or its socket closed"
    })
    assert.strictEqual(verdict([mqCheck(true), l2Check(null)], "ready", "not_ready").status, "ready")
    assert.strictEqual(verdict([mqCheck(true), mqCheck(false)], "ready", "not_ready").status, "not_ready")
  })
})

describe("Readiness over the module graph (no sockets)", () => {
  it.effect("every check named in order; no MQ server here → not ready, said by mq_bound alone", () =>
    Effect.gen(function*() {
      const readiness = yield* Readiness
      yield* TestClock.adjust("31 seconds")
      const report = yield* readiness.readiness()
      assert.deepStrictEqual(report.checks.map((c) => [c.name, c.ok]), [
        ["mq_bound", false],
        ["l1_pool", true],
        ["reaper", true],
        ["fd_socket", true],
        ["l2", true]
      ])
      assert.strictEqual(report.status, "not_ready")
      assert.deepStrictEqual(report.checks[0], { name: "mq_bound", ok: false, detail: "no MQ server in this process" })
      assert.deepStrictEqual(report.checks[2], {
        name: "reaper",
        ok: true,
        detail: "last scan ended 1.000 s ago (period 30 s, bound 2 × 30 s = 60 s)"
      })
      assert.deepStrictEqual(report.checks[4], { name: "l2", ok: true, detail: "not configured (--l2-url)" })
      const live = yield* readiness.liveness()
      assert.deepStrictEqual(live, {
        status: "live",
        checks: [
          { name: "process", ok: true, detail: "answering" },
          { name: "event_loop", ok: true, detail: "last tick 0.000 s ago (bound 5 s); no stall seen" }
        ]
      })
    }).pipe(Effect.provide(Readiness.layer.pipe(Layer.provideMerge(livenessEnv({ workerReapTimeoutSeconds: 120, workerDisconnectGraceSeconds: 0, fdSocket: "off" }))))))
})

describe("Readiness with reaping off", () => {
  it.effect("its own quiet ticker keeps /livez's event_loop fed; the reaper check says reaping is off", () =>
    Effect.gen(function*() {
      const readiness = yield* Readiness
      yield* TestClock.adjust("10 seconds")
      assert.deepStrictEqual((yield* readiness.liveness()).checks[1], {
        name: "event_loop",
        ok: true,
        detail: "last tick 0.000 s ago (bound 5 s); no stall seen"
      })
      assert.deepStrictEqual((yield* readiness.readiness()).checks[2], {
        name: "reaper",
        ok: true,
        detail: "reaping is off (--worker-reap-timeout-seconds and --worker-disconnect-grace-seconds are 0)"
      })
    }).pipe(Effect.provide(Readiness.layer.pipe(
      Layer.provideMerge(livenessEnv({ workerReapTimeoutSeconds: 0, workerDisconnectGraceSeconds: 0, fdSocket: "off" }))
    ))))
})

/** A whole `l2` status block, the fields the rule does not read at their zero. */
const statusL2: L2Status = {
  url: "redis://127.0.0.1:1",
  state: "ok",
  connected: true,
  inflight_bytes: 0,
  queue_depth: 0,
  last_error: null,
  writes: 0,
  dropped_writes: 0,
  failed_writes: 0,
  hit_chunks: 0,
  corrupt_values: 0,
  authenticated: false,
  unauthenticated_values: 0,
  breaker_opened: 0,
  breaker_closed: 0
}
