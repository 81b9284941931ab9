/**
 * The handler pools of DESIGN §3.1 (src/services/server/Dispatch.ts): SYNC runs one job at a time in arrival
 * order; NORMAL runs `normalWorkers` at once, first in first out; AFFINITY pins a peer to a lane round robin until
 * it is released; each queue is fair between peers (peers in turn, each holding at most its share: issue 27 item 1)
 * and bounded (submit says false past it); `hasFreeSlot` tells the fast path where a job
 * would start at once; `drain` lets queued work finish and interrupts what outlives its timeout. Jobs are held on
 * Deferred latches; no sleeps (the drain timeout runs on the TestClock).
 */
import { assert, describe, it } from "@effect/vitest"
import { Deferred, Effect, Fiber } from "effect"
import { TestClock } from "effect/testing"
import { type Dispatcher, makeDispatcher, POOL_SHARE_PER_PEER } from "../../../src/services/server/Dispatch.ts"

/** A job that says it started, waits for its gate, and says it ended. */
interface Held {
  readonly started: Deferred.Deferred<void>
  readonly gate: Deferred.Deferred<void>
  readonly job: Effect.Effect<void>
}

const heldJobs = (n: number, log: Array<string>): Array<Held> =>
  Array.from({ length: n }, (_, i) => {
    const started = Deferred.makeUnsafe<void>()
    const gate = Deferred.makeUnsafe<void>()
    const job = Effect.gen(function*() {
      log.push(`start ${i}`)
      yield* Deferred.succeed(started, undefined)
      yield* Deferred.await(gate)
      log.push(`end ${i}`)
    })
    return { started, gate, job }
  })

/** Waits (scheduler turns, no clock) until `holds`: the pools' bookkeeping runs in their fibers after a job ends. */
const until = (holds: () => boolean) =>
  Effect.gen(function*() {
    for (let i = 0; i < 10_000 && !holds(); i++) yield* Effect.yieldNow
    assert.isTrue(holds(), "the dispatcher never reached the expected state")
  })

const open = (h: Held) => Deferred.succeed(h.gate, undefined)

const submitAll = (d: Dispatcher, pool: "SYNC" | "NORMAL", jobs: ReadonlyArray<Held>) => {
  for (const h of jobs) assert.isTrue(d.submit(pool, "", h.job))
}

describe("Dispatch", () => {
  it.effect("SYNC runs one job at a time, in arrival order", () =>
    Effect.gen(function*() {
      const d = yield* makeDispatcher({ normalWorkers: 2, affinityLanes: 1, queueCapacity: 8 })
      const log: Array<string> = []
      const jobs = heldJobs(3, log)
      assert.isTrue(d.hasFreeSlot("SYNC"))
      submitAll(d, "SYNC", jobs)
      assert.isFalse(d.hasFreeSlot("SYNC"))
      yield* Deferred.await(jobs[0]!.started)
      assert.deepStrictEqual(d.stats().sync, { queued: 2 })
      assert.deepStrictEqual(log, ["start 0"])
      yield* open(jobs[0]!)
      yield* Deferred.await(jobs[1]!.started)
      assert.deepStrictEqual(log, ["start 0", "end 0", "start 1"])
      assert.deepStrictEqual(d.stats().sync, { queued: 1 })
      yield* open(jobs[1]!)
      yield* Deferred.await(jobs[2]!.started)
      assert.isFalse(d.hasFreeSlot("SYNC"))
      yield* open(jobs[2]!)
      yield* until(() => d.hasFreeSlot("SYNC"))
      assert.deepStrictEqual(log, ["start 0", "end 0", "start 1", "end 1", "start 2", "end 2"])
      assert.deepStrictEqual(d.stats().sync, { queued: 0 })
    }))

  it.effect("NORMAL runs normalWorkers jobs at once, the waiting ones first in first out", () =>
    Effect.gen(function*() {
      const d = yield* makeDispatcher({ normalWorkers: 2, affinityLanes: 1, queueCapacity: 8 })
      const log: Array<string> = []
      const jobs = heldJobs(4, log)
      submitAll(d, "NORMAL", jobs.slice(0, 1))
      assert.isTrue(d.hasFreeSlot("NORMAL"), "one of two workers is busy")
      submitAll(d, "NORMAL", jobs.slice(1))
      assert.isFalse(d.hasFreeSlot("NORMAL"))
      yield* Deferred.await(jobs[0]!.started)
      yield* Deferred.await(jobs[1]!.started)
      assert.deepStrictEqual(d.stats().normal, { workers: 2, queued: 2 })
      assert.deepStrictEqual(log, ["start 0", "start 1"])
      // The second ends first: the next waiting job (2, not 3) takes its worker.
      yield* open(jobs[1]!)
      yield* Deferred.await(jobs[2]!.started)
      assert.deepStrictEqual(log, ["start 0", "start 1", "end 1", "start 2"])
      assert.deepStrictEqual(d.stats().normal, { workers: 2, queued: 1 })
      yield* open(jobs[0]!)
      yield* Deferred.await(jobs[3]!.started)
      assert.deepStrictEqual(d.stats().normal, { workers: 2, queued: 0 })
      assert.isFalse(d.hasFreeSlot("NORMAL"), "jobs 2 and 3 hold both workers")
      yield* open(jobs[2]!)
      yield* until(() => d.hasFreeSlot("NORMAL"))
      yield* open(jobs[3]!)
      yield* until(() => log.length === 8)
    }))

  it.effect("AFFINITY pins each peer to a lane round robin; a peer's jobs run in order on it; release frees the pin", () =>
    Effect.gen(function*() {
      const d = yield* makeDispatcher({ normalWorkers: 1, affinityLanes: 2, queueCapacity: 8 })
      const log: Array<string> = []
      const [a1, b1, c1, a2, d1] = heldJobs(5, log)
      assert.isTrue(d.submit("AFFINITY", "a", a1!.job)) // lane 0
      assert.isTrue(d.submit("AFFINITY", "b", b1!.job)) // lane 1
      assert.isTrue(d.submit("AFFINITY", "c", c1!.job)) // lane 0, behind a
      assert.isTrue(d.submit("AFFINITY", "a", a2!.job)) // lane 0, behind c
      assert.isFalse(d.hasFreeSlot("AFFINITY"), "lanes are per peer: never a free slot")
      yield* Deferred.await(a1!.started)
      yield* Deferred.await(b1!.started)
      assert.deepStrictEqual(d.stats().affinity, { lanes: 2, queued: [2, 0], pinnedPeers: 3 })
      yield* open(a1!)
      yield* Deferred.await(c1!.started)
      assert.deepStrictEqual(log, ["start 0", "start 1", "end 0", "start 2"])
      d.releasePeer("a")
      assert.strictEqual(d.stats().affinity.pinnedPeers, 2)
      // The next new peer takes the next lane in the rotation (1), behind b's held job.
      assert.isTrue(d.submit("AFFINITY", "d", d1!.job))
      assert.deepStrictEqual(d.stats().affinity, { lanes: 2, queued: [1, 1], pinnedPeers: 3 })
      for (const h of [b1!, c1!, a2!, d1!]) yield* open(h)
      yield* until(() => log.length === 10)
      // Each lane in order: a1, c1, a2 on lane 0; b1, d1 on lane 1 (the lanes interleave as they will).
      const at = (entry: string) => log.indexOf(entry)
      assert.isTrue(at("end 0") < at("start 2") && at("end 2") < at("start 3"), log.join(", "))
      assert.isTrue(at("end 1") < at("start 4"), log.join(", "))
      assert.deepStrictEqual(d.stats().affinity.queued, [0, 0])
    }))

  it.effect("a full queue refuses the next job (back-pressure: the caller answers overloaded)", () =>
    Effect.gen(function*() {
      const d = yield* makeDispatcher({ normalWorkers: 1, affinityLanes: 1, queueCapacity: 2 })
      const log: Array<string> = []
      const [running, w1, w2, extra, s0, s1, s2, s3] = heldJobs(8, log)
      assert.isTrue(d.submit("NORMAL", "", running!.job))
      yield* Deferred.await(running!.started)
      assert.isTrue(d.submit("NORMAL", "", w1!.job))
      assert.isTrue(d.submit("NORMAL", "", w2!.job))
      assert.isFalse(d.submit("NORMAL", "", extra!.job))
      assert.deepStrictEqual(d.stats().normal, { workers: 1, queued: 2 })
      // Each pool has its own bound: SYNC still takes its own two waiting jobs, and refuses the third.
      assert.isTrue(d.submit("SYNC", "", s0!.job))
      yield* Deferred.await(s0!.started)
      assert.isTrue(d.submit("SYNC", "", s1!.job))
      assert.isTrue(d.submit("SYNC", "", s2!.job))
      assert.isFalse(d.submit("SYNC", "", s3!.job))
      assert.deepStrictEqual(d.stats().sync, { queued: 2 })
      yield* open(running!)
      yield* Deferred.await(w1!.started)
      assert.isTrue(d.submit("NORMAL", "", extra!.job), "a freed place is taken again")
      assert.deepStrictEqual(d.stats().normal, { workers: 1, queued: 2 })
      for (const h of [w1!, w2!, extra!, s0!, s1!, s2!]) yield* open(h)
      yield* until(() => log.filter((l) => l.startsWith("end")).length === 7)
    }))

  it.effect("fair between peers: a peer's burst delays another's job by one of its own; one peer holds at most its share, the others still get in", () =>
    Effect.gen(function*() {
      const capacity = 4 * POOL_SHARE_PER_PEER
      const d = yield* makeDispatcher({ normalWorkers: 1, affinityLanes: 1, queueCapacity: capacity })
      const log: Array<string> = []
      const [running, ...rest] = heldJobs(6, log)
      assert.isTrue(d.submit("NORMAL", "flood", running!.job))
      yield* Deferred.await(running!.started)
      // The flooder's 3 waiting jobs, then the heartbeat's: it runs second, not fourth.
      for (const h of rest.slice(0, 3)) assert.isTrue(d.submit("NORMAL", "flood", h.job))
      assert.isTrue(d.submit("NORMAL", "heartbeat", rest[3]!.job))
      assert.isTrue(d.submit("NORMAL", "flood", rest[4]!.job))
      for (const h of [running!, ...rest]) yield* open(h)
      yield* until(() => log.length === 12)
      assert.deepStrictEqual(log.filter((l) => l.startsWith("start")), ["start 0", "start 1", "start 4", "start 2", "start 3", "start 5"])
      // Its share: the flooder's next waiting jobs are refused past POOL_SHARE_PER_PEER, told as its share, not a full pool.
      const gate = Deferred.makeUnsafe<void>()
      const busy = Deferred.makeUnsafe<void>()
      assert.isTrue(d.submit("NORMAL", "flood", Deferred.succeed(busy, undefined).pipe(Effect.andThen(Deferred.await(gate)))))
      yield* Deferred.await(busy)
      let accepted = 0
      while (d.submit("NORMAL", "flood", Effect.void)) accepted++
      assert.strictEqual(accepted, POOL_SHARE_PER_PEER)
      assert.strictEqual(d.refusal("NORMAL", "flood"), "peer_full")
      assert.strictEqual(d.refusal("NORMAL", "heartbeat"), undefined)
      assert.isTrue(d.submit("NORMAL", "heartbeat", Effect.void))
      assert.deepStrictEqual(d.stats().normal, { workers: 1, queued: POOL_SHARE_PER_PEER + 1 })
      yield* Deferred.succeed(gate, undefined)
      yield* until(() => d.stats().normal.queued === 0 && d.hasFreeSlot("NORMAL"))
    }))

  it.effect("drain takes no more jobs, lets the queued ones finish, and interrupts what outlives its timeout", () =>
    Effect.gen(function*() {
      const d = yield* makeDispatcher({ normalWorkers: 1, affinityLanes: 1, queueCapacity: 8 })
      const log: Array<string> = []
      const [first, second, late] = heldJobs(3, log)
      const stuck = Deferred.makeUnsafe<void>()
      const stuckJob = Deferred.succeed(stuck, undefined).pipe(
        Effect.andThen(Effect.never),
        Effect.onInterrupt(() => Effect.sync(() => log.push("stuck interrupted")))
      )
      assert.isTrue(d.submit("NORMAL", "", first!.job))
      assert.isTrue(d.submit("NORMAL", "", second!.job))
      assert.isTrue(d.submit("SYNC", "", stuckJob))
      yield* Deferred.await(first!.started)
      yield* Deferred.await(stuck)
      const draining = yield* Effect.forkChild(d.drain("1 second"))
      // Once the drain has begun, nothing is taken: probed with a harmless job on a lane of its own.
      let probes = 0
      yield* until(() => !d.submit("AFFINITY", "probe", Effect.sync(() => probes++)))
      assert.isFalse(d.submit("NORMAL", "", late!.job))
      assert.isFalse(d.hasFreeSlot("SYNC"))
      yield* open(first!)
      yield* Deferred.await(second!.started)
      yield* open(second!)
      yield* until(() => log.includes("end 1"))
      assert.isUndefined(draining.pollUnsafe(), "the stuck SYNC job still holds the drain")
      yield* TestClock.adjust("999 millis")
      assert.isUndefined(draining.pollUnsafe())
      yield* TestClock.adjust("1 millis")
      yield* Fiber.join(draining)
      assert.deepStrictEqual(log, ["start 0", "end 0", "start 1", "end 1", "stuck interrupted"])
    }))
})
