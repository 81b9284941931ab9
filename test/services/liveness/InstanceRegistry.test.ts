/**
 * The InstanceRegistry's stale index (src/services/liveness/internal/StaleIndex.ts): a scan
 * that looks only at the entries the index hands it must pop exactly what
 * judging every entry pops (heartbeats both transactional, `touch`, and
 * synchronous, `touchNow`: the fast path's, issue 25 item 4). Property test against a reference model (a
 * plain Map judged in full each scan), plus the cost claims: a scan with
 * nothing stale pops no heap node once the index is settled, and the heap
 * stays bounded under re-registration with time-based reaping off.
 *
 * Times are passed explicitly (`nowMs`), as the registry never reads the Clock.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect, Fiber } from "effect"
import fc from "fast-check"
import { makeInstanceId, type InstanceId } from "../../../src/schema/InstanceId.ts"
import { judge, makeInstanceRegistry, type InstanceRegistry, type Reaped, type StaleRule, type Tracked } from "../../../src/services/liveness/InstanceRegistry.ts"

/** The reference: every entry judged with `judge` on every scan. */
const makeModel = () => {
  const map = new Map<bigint, Tracked<number>>()
  const update = (id: bigint, f: (t: Tracked<number>) => Tracked<number>) => {
    const t = map.get(id)
    if (t === undefined) return undefined
    const next = f(t)
    map.set(id, next)
    return next
  }
  return {
    insert: (id: InstanceId, resource: number, nowMs: number) => {
      if (map.has(id)) return false
      map.set(id, { id, resource, lastSeenMs: nowMs, hasLivenessSignal: false, hasTransferActivity: false })
      return true
    },
    refresh: (id: bigint, nowMs: number) => update(id, (t) => ({ ...t, lastSeenMs: Math.max(t.lastSeenMs, nowMs) })),
    touch: (id: bigint, nowMs: number) =>
      update(id, (t) => ({ ...t, lastSeenMs: Math.max(t.lastSeenMs, nowMs), hasLivenessSignal: true })) !== undefined,
    resolveForTransfer: (id: bigint, nowMs: number) =>
      update(id, (t) => ({ ...t, lastSeenMs: Math.max(t.lastSeenMs, nowMs), hasTransferActivity: true })),
    pop: (id: bigint) => {
      const t = map.get(id)
      map.delete(id)
      return t
    },
    popStale: (rule: StaleRule) => {
      const stale: Array<Reaped<number>> = []
      for (const t of map.values()) {
        const verdict = judge(t, rule)
        if (verdict !== undefined) stale.push(verdict)
      }
      for (const r of stale) map.delete(r.tracked.id)
      return stale
    },
    popAll: () => {
      const all = [...map.values()]
      map.clear()
      return all
    },
    values: () => [...map.values()]
  }
}

const byId = <A>(key: (a: A) => bigint) => (a: A, b: A) => (key(a) < key(b) ? -1 : key(a) > key(b) ? 1 : 0)
const sortedTracked = (xs: ReadonlyArray<Tracked<number>>) => [...xs].sort(byId((t) => t.id))
const sortedReaped = (xs: ReadonlyArray<Reaped<number>>) => [...xs].sort(byId((r) => r.tracked.id))

const IDS = 5

// Times are in units of `scale` ms: with scale 1 and windows of a few ms, silences of exactly a window
// (kept) and a window + 1 ms (reaped) are frequent.
const step = {
  advance: fc.oneof({ weight: 3, arbitrary: fc.integer({ min: 0, max: 2 }) }, { weight: 1, arbitrary: fc.integer({ min: 0, max: 12 }) }),
  // The op's nowMs is `clock − lag`: a judge time earlier than the last heartbeat, an old insert as in the bench.
  lag: fc.oneof({ weight: 4, arbitrary: fc.constant(0) }, { weight: 1, arbitrary: fc.integer({ min: 0, max: 20 }) })
}
const idArb = fc.integer({ min: 1, max: IDS })

const windowsArb = fc.record({
  reapTimeoutMs: fc.oneof({ weight: 1, arbitrary: fc.constant(0) }, { weight: 4, arbitrary: fc.integer({ min: 1, max: 30 }) }),
  registrationGraceMs: fc.integer({ min: 0, max: 60 }),
  disconnectGraceMs: fc.oneof(fc.constant(0), fc.integer({ min: 1, max: 20 }))
})
/** Windows as configured (the grace at least the timeout), fixed for a whole run. */
const configuredArb = fc.record({
  reapTimeoutMs: fc.oneof({ weight: 1, arbitrary: fc.constant(0) }, { weight: 4, arbitrary: fc.integer({ min: 1, max: 30 }) }),
  extraGraceMs: fc.integer({ min: 0, max: 40 }),
  disconnectGraceMs: fc.oneof(fc.constant(0), fc.integer({ min: 1, max: 20 }))
}).map(({ reapTimeoutMs, extraGraceMs, disconnectGraceMs }) => ({ reapTimeoutMs, registrationGraceMs: reapTimeoutMs + extraGraceMs, disconnectGraceMs }))

const opArb = fc.oneof(
  { weight: 4, arbitrary: fc.record({ _tag: fc.constant("insert" as const), id: idArb, ...step }) },
  { weight: 5, arbitrary: fc.record({ _tag: fc.constantFrom("touch" as const, "touchNow" as const, "refresh" as const, "transfer" as const), id: idArb, ...step }) },
  { weight: 2, arbitrary: fc.record({ _tag: fc.constant("pop" as const), id: idArb, ...step }) },
  {
    weight: 5,
    arbitrary: fc.record({
      _tag: fc.constant("scan" as const),
      ...step,
      windows: windowsArb,
      // Suspect since `clock − ago`: may be older than last_seen, or (negative) later than the judge time.
      suspects: fc.array(fc.record({ id: idArb, ago: fc.integer({ min: -3, max: 40 }) }), { maxLength: 4 })
    })
  },
  { weight: 1, arbitrary: fc.constant({ _tag: "popAll" as const }) }
)

type Op = typeof opArb extends fc.Arbitrary<infer A> ? A : never

/**
 * A run: its ops, a time scale, and either one window configuration for every scan (as in production;
 * the index then settles) or each scan's own random windows (windows that shrink force a re-key).
 */
const runArb = fc.record({
  scale: fc.constantFrom(1, 10),
  windows: fc.oneof({ weight: 3, arbitrary: configuredArb }, { weight: 1, arbitrary: fc.constant("per scan" as const) }),
  // Long runs (fast-check's default size would keep them near 10 ops): entries age through every window.
  ops: fc.array(opArb, { minLength: 20, maxLength: 200, size: "max" })
})
type Run = typeof runArb extends fc.Arbitrary<infer A> ? A : never

/** Applies `ops` to the registry and to the model, asserting equal answers after each op. */
const runOps = ({ scale, windows, ops }: Run) =>
  Effect.gen(function*() {
    const registry: InstanceRegistry<number> = yield* makeInstanceRegistry<number>()
    const model = makeModel()
    let clock = 1_000
    let resource = 0
    for (const op of ops) {
      if (op._tag === "popAll") {
        assert.deepStrictEqual(sortedTracked(yield* registry.popAll()), sortedTracked(model.popAll()), "popAll")
        continue
      }
      clock += op.advance * scale
      const nowMs = clock - op.lag * scale
      switch (op._tag) {
        case "insert": {
          const id = makeInstanceId(op.id)
          resource++
          assert.strictEqual(yield* registry.insert(id, resource, nowMs), model.insert(id, resource, nowMs), "insert")
          break
        }
        case "touch":
          assert.strictEqual(yield* registry.touch(makeInstanceId(op.id), nowMs), model.touch(BigInt(op.id), nowMs), "touch")
          break
        case "touchNow":
          // The fast path's synchronous touch: the same rule, the same index upkeep (false: not held, never undefined
          // here: no transaction waits on the map).
          assert.strictEqual(registry.touchNow(makeInstanceId(op.id), nowMs), model.touch(BigInt(op.id), nowMs), "touchNow")
          break
        case "refresh":
          assert.deepStrictEqual(yield* registry.refresh(makeInstanceId(op.id), nowMs), model.refresh(BigInt(op.id), nowMs), "refresh")
          break
        case "transfer":
          assert.deepStrictEqual(
            yield* registry.resolveForTransfer(makeInstanceId(op.id), nowMs),
            model.resolveForTransfer(BigInt(op.id), nowMs),
            "resolveForTransfer"
          )
          break
        case "pop":
          assert.deepStrictEqual(yield* registry.pop(makeInstanceId(op.id)), model.pop(BigInt(op.id)), "pop")
          break
        case "scan": {
          const w = windows === "per scan" ? op.windows : windows
          const rule: StaleRule = {
            nowMs,
            reapTimeoutMs: w.reapTimeoutMs * scale,
            registrationGraceMs: w.registrationGraceMs * scale,
            disconnectGraceMs: w.disconnectGraceMs * scale,
            suspects: new Map(op.suspects.map((s) => [BigInt(s.id), clock - s.ago * scale]))
          }
          assert.deepStrictEqual(sortedReaped(yield* registry.popStale(rule)), sortedReaped(model.popStale(rule)), "popStale")
          break
        }
      }
      assert.deepStrictEqual(sortedTracked(yield* registry.snapshot()), sortedTracked(model.values()), `entries after ${op._tag}`)
    }
  })

describe("InstanceRegistry stale index", () => {
  it("popStale pops exactly what judging every entry pops (random inserts, heartbeats, pops, windows, suspects)", async () => {
    await fc.assert(
      fc.asyncProperty(runArb, (run) => Effect.runPromise(runOps(run))),
      { numRuns: 500 }
    )
  }, 120_000)

  const rule = (nowMs: number): StaleRule => ({
    nowMs,
    reapTimeoutMs: 30_000,
    registrationGraceMs: 3_600_000,
    suspects: new Map(),
    disconnectGraceMs: 10_000
  })

  it.effect("a scan with nothing stale over 10,000 entries pops no heap node once the first scan has re-keyed them", () =>
    Effect.gen(function*() {
      const registry = yield* makeInstanceRegistry<number>()
      for (let i = 1; i <= 10_000; i++) assert.isTrue(yield* registry.insert(makeInstanceId(i), i, 0))
      // Before the reap timeout no entry can be stale: nothing is popped at all.
      assert.deepStrictEqual(yield* registry.popStale(rule(20_000)), [])
      assert.strictEqual(registry.indexStats().lastScanPopped, 0)
      // Past the reap timeout the never-pinged entries may be (their window was unknown at insert):
      // the first such scan looks at each once and re-keys it by its registration grace.
      assert.deepStrictEqual(yield* registry.popStale(rule(60_000)), [])
      assert.strictEqual(registry.indexStats().lastScanPopped, 10_000)
      for (const nowMs of [90_000, 600_000, 3_599_000]) {
        assert.deepStrictEqual(yield* registry.popStale(rule(nowMs)), [])
        assert.strictEqual(registry.indexStats().lastScanPopped, 0, `scan at ${nowMs}`)
      }
      assert.deepStrictEqual(registry.indexStats(), { heapNodes: 10_000, slots: 10_000, lastScanPopped: 0 })
      // One entry proven (PING + transfer) at 3 000 000: its window shrinks to the reap timeout, so it gets
      // an earlier key; stale 30 s later, and only it is looked at.
      assert.isTrue(yield* registry.touch(makeInstanceId(7), 3_000_000))
      yield* registry.resolveForTransfer(makeInstanceId(7), 3_000_000)
      assert.deepStrictEqual(yield* registry.popStale(rule(3_030_000)), [], "kept at exactly its timeout")
      const reaped = yield* registry.popStale(rule(3_030_001))
      assert.deepStrictEqual(reaped.map((r) => [r.tracked.id, r.reason, r.silentMs, r.windowMs]), [[7n, "timeout", 30_001, 30_000]])
      assert.strictEqual(registry.indexStats().lastScanPopped, 1)
      // The rest reach their registration grace (3600 s after 0) together.
      assert.strictEqual((yield* registry.popStale(rule(3_600_001))).length, 9_999)
      assert.strictEqual(yield* registry.size(), 0)
      // Reaped entries leave the index: no slot, no node left behind.
      assert.deepStrictEqual(registry.indexStats(), { heapNodes: 0, slots: 0, lastScanPopped: 10_000 })
    }))

  for (const how of ["touch", "touchNow"] as const) it.live(`an entry touched (${how}) while a scan yields stays, and keeps its place in the index`, () =>
    Effect.gen(function*() {
      const registry = yield* makeInstanceRegistry<number>()
      const windows = { reapTimeoutMs: 100, registrationGraceMs: 100, suspects: new Map(), disconnectGraceMs: 0 }
      const n = 4 * 1_024
      for (let i = 1; i <= n; i++) yield* registry.insert(makeInstanceId(i), i, 0)
      // The scan judges 4 slices, yielding to the event loop in between; the PINGs land meanwhile.
      const scan = yield* Effect.forkChild(registry.popStale({ ...windows, nowMs: 1_000 }))
      for (let i = n; i >= 1; i--) {
        if (how === "touch") yield* registry.touch(makeInstanceId(i), 950)
        else registry.touchNow(makeInstanceId(i), 950)
        if (i % 64 === 0) yield* Effect.promise(() => new Promise<void>((resolve) => setImmediate(resolve)))
      }
      const reaped = yield* Fiber.join(scan)
      // Each entry was either reaped (silent 1 000 ms) or touched before the transaction and kept …
      const kept = yield* registry.snapshot()
      assert.strictEqual(reaped.length + kept.length, n)
      assert.isTrue(reaped.every((r) => r.silentMs === 1_000))
      assert.isTrue(kept.every((t) => t.lastSeenMs === 950))
      // … and every kept one is found again by its new deadline (950 + 100).
      assert.deepStrictEqual(yield* registry.popStale({ ...windows, nowMs: 1_050 }), [])
      assert.strictEqual((yield* registry.popStale({ ...windows, nowMs: 1_051 })).length, kept.length)
      assert.strictEqual(yield* registry.size(), 0)
    }))

  it.effect("garbage nodes stay bounded with time-based reaping off, compaction keeps every held entry's node, popAll empties the index", () =>
    Effect.gen(function*() {
      const registry = yield* makeInstanceRegistry<number>()
      const off: StaleRule = { nowMs: 0, reapTimeoutMs: 0, registrationGraceMs: 0, suspects: new Map(), disconnectGraceMs: 0 }
      // One id registered and unregistered 5 000 times, each insert older than the last (a new lowest key).
      const id = makeInstanceId(1)
      for (let i = 0; i < 5_000; i++) {
        assert.isTrue(yield* registry.insert(id, i, 5_000 - i))
        assert.isDefined(yield* registry.pop(id))
        assert.deepStrictEqual(yield* registry.popStale({ ...off, nowMs: 10_000 + i }), [])
      }
      // Compaction keeps the garbage under 2 × entries + 1024.
      assert.isAtMost(registry.indexStats().heapNodes, 2 * 0 + 1_024 + 1)
      // 4 000 distinct ids registered, 3 000 of them unregistered again: compactions run with entries held.
      for (let i = 2; i < 4_002; i++) {
        assert.isTrue(yield* registry.insert(makeInstanceId(i), i, 100))
        if (i % 4 !== 0) assert.isDefined(yield* registry.pop(makeInstanceId(i)))
      }
      assert.strictEqual(yield* registry.size(), 1_000)
      assert.isAtMost(registry.indexStats().heapNodes, 2 * 1_000 + 1_024 + 1)
      // Every held entry kept its node: time-based reaping on, all of them are found stale.
      const reaped = yield* registry.popStale({ ...off, nowMs: 1_101, reapTimeoutMs: 1_000, registrationGraceMs: 1_000 })
      assert.strictEqual(reaped.length, 1_000)
      assert.isTrue(reaped.every((r) => r.reason === "grace" && r.silentMs === 1_001))
      assert.isTrue(yield* registry.insert(id, -1, 0))
      assert.strictEqual((yield* registry.popAll()).length, 1)
      const stats = registry.indexStats()
      assert.deepStrictEqual([stats.heapNodes, stats.slots], [0, 0])
    }))
})
