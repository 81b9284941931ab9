/**
 * The per-instance core on its own (InstanceModule.ts, DESIGN §4–§5; issue 25
 * item 1): entries as child Scopes whose finalizers push to a probe, owners
 * that record why they were released, TestClock for last_seen. No sockets,
 * no memory: each path that ends an entry (UNREGISTER, fault, reap, replace,
 * shutdown, a failed acquire) is driven directly and the probe says it ran
 * exactly once, in order, with the right reason. The modules built on it
 * (LmcacheDrivenTransfer, EngineDrivenTransfer, Blend) and Tenancy test the
 * same paths through their ops.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect, Exit, Scope } from "effect"
import { TestClock } from "effect/testing"
import { makeInstanceId, type InstanceId } from "../../../src/schema/InstanceId.ts"
import { Forbidden, InvalidArgument, NotRegistered } from "../../../src/schema/WireError.ts"
import { type InstanceOwner, RequestTenant } from "../../../src/services/liveness/InstanceOwner.ts"
import {
  type InstanceEntry,
  makeMirroredInstances,
  makeTrackedInstances,
  type RegisterRequest
} from "../../../src/services/server/InstanceModule.ts"
import { type CapturedLog, captureLogs } from "../../support/FakeMqClient.ts"

const id = makeInstanceId

/** A test entry: the memory it "maps" (what `same` compares) and its Scope. */
interface Entry extends InstanceEntry {
  readonly memory: string
}

/** What the probe saw, in order: `acquire <memory>`, `release <memory>`, `owner <tenant> <id> <reason>`. */
const probeOf = () => {
  const seen: Array<string> = []
  const owner = (tenant: string, mappedBytes = 4096): InstanceOwner => ({
    tenant,
    mappedBytes,
    release: (i, reason) => Effect.sync(() => void seen.push(`owner ${tenant} ${i} ${reason}`))
  })
  const request = (memory: string, o?: InstanceOwner): RegisterRequest<Entry, never> => ({
    same: (held) => held.memory === memory,
    acquire: (scope) =>
      Effect.gen(function*() {
        seen.push(`acquire ${memory}`)
        yield* Scope.addFinalizer(scope, Effect.sync(() => void seen.push(`release ${memory}`)))
        return { scope, memory }
      }),
    owner: o
  })
  return { seen, owner, request }
}

const names = { name: "test", kind: "kv_cache" as const, missing: "has no test context", remedy: "register it again", unregisterOp: "unregister_kv_cache" }

const tracked = makeTrackedInstances<Entry>({
  ...names,
  registerOp: "register_kv_cache",
  differs: "different memory",
  details: (e) => ({ memory: e.memory })
})

const mirrored = makeMirroredInstances<Entry>({ ...names, registerOp: "cb_register_rope", dropped: (i) => `dropped(${i})` })

const ownerOf = (m: { target: { ownerOf: (i: InstanceId) => Effect.Effect<InstanceOwner | undefined> } }, i: InstanceId) =>
  Effect.map(m.target.ownerOf(i), (o) => o?.tenant)

/** The refusal of `op` on another tenant's instance `n` (InstanceOwner.ts `notYours`). */
const notYours = (op: string, n: number) =>
  new Forbidden({ op, instance_id: `${n}`, field: "instance_id", message: `${op}: instance ${n} belongs to another tenant; nothing was changed` })

describe("tracked module: REGISTER", () => {
  it.effect("a new id acquires into a child Scope and holds the entry with its owner, in one step", () => {
    const p = probeOf()
    return Effect.gen(function*() {
      const m = yield* tracked
      const r = yield* m.register(id(1), p.request("A", p.owner("t1")))
      assert.strictEqual(r._tag, "Registered")
      assert.deepStrictEqual(p.seen, ["acquire A"])
      assert.isTrue(yield* m.isRegistered(id(1)))
      assert.strictEqual(yield* ownerOf(m, id(1)), "t1")
      assert.deepStrictEqual((yield* m.target.owners()).map((o) => [o.id, o.owner.tenant, o.owner.mappedBytes]), [[1n, "t1", 4096]])
    }).pipe(Effect.scoped)
  })

  it.effect("the same memory again acquires nothing and refreshes last_seen: Unchanged with the held entry", () => {
    const p = probeOf()
    return Effect.gen(function*() {
      const m = yield* tracked
      const first = yield* m.register(id(1), p.request("A", p.owner("t1")))
      yield* TestClock.adjust("30 seconds")
      assert.strictEqual((yield* m.target.instances())[0]!.last_seen_age_seconds, 30)
      const again = yield* m.register(id(1), p.request("A", p.owner("t1")))
      assert.deepStrictEqual(again, { _tag: "Unchanged", entry: first.entry })
      assert.deepStrictEqual(p.seen, ["acquire A"])
      assert.strictEqual((yield* m.target.instances())[0]!.last_seen_age_seconds, 0)
    }).pipe(Effect.scoped)
  })

  it.effect("different memory for a held id is refused with invalid_argument; nothing is acquired and the held entry stays", () => {
    const p = probeOf()
    return Effect.gen(function*() {
      const m = yield* tracked
      yield* m.register(id(1), p.request("A", p.owner("t1")))
      const refused = yield* Effect.flip(m.register(id(1), p.request("B", p.owner("t2"))))
      assert.deepStrictEqual(
        refused,
        new InvalidArgument({
          message: "register_kv_cache: instance 1 is already registered with different memory; unregister it first (a process never inherits another's context)"
        })
      )
      assert.deepStrictEqual(p.seen, ["acquire A"])
      assert.strictEqual(yield* ownerOf(m, id(1)), "t1")
    }).pipe(Effect.scoped)
  })

  it.effect("an acquire that fails closes its own Scope (what it mapped so far is released) and holds nothing", () => {
    const p = probeOf()
    return Effect.gen(function*() {
      const m = yield* tracked
      const failing: RegisterRequest<Entry, InvalidArgument> = {
        same: () => false,
        acquire: (scope) =>
          Effect.gen(function*() {
            yield* Scope.addFinalizer(scope, Effect.sync(() => void p.seen.push("release half-mapped")))
            return yield* new InvalidArgument({ message: "segment missing" })
          }),
        owner: p.owner("t1")
      }
      assert.deepStrictEqual(yield* Effect.flip(m.register(id(1), failing)), new InvalidArgument({ message: "segment missing" }))
      assert.deepStrictEqual(p.seen, ["release half-mapped"])
      assert.isFalse(yield* m.isRegistered(id(1)))
      assert.deepStrictEqual(yield* m.target.owners(), [])
    }).pipe(Effect.scoped)
  })
})

describe("tracked module: the one finalizer", () => {
  it.effect("UNREGISTER releases the entry, then tells its owner; a second UNREGISTER finds nothing and releases nothing", () => {
    const p = probeOf()
    return Effect.gen(function*() {
      const m = yield* tracked
      const r = yield* m.register(id(1), p.request("A", p.owner("t1")))
      assert.strictEqual(yield* m.unregister(id(1)), r.entry)
      assert.isUndefined(yield* m.unregister(id(1)))
      assert.deepStrictEqual(p.seen, ["acquire A", "release A", "owner t1 1 unregister"])
      assert.isUndefined(yield* ownerOf(m, id(1)))
    }).pipe(Effect.scoped)
  })

  it.effect("a fault release tells the owner `fault`", () => {
    const p = probeOf()
    return Effect.gen(function*() {
      const m = yield* tracked
      yield* m.register(id(2), p.request("A", p.owner("t1")))
      yield* m.releaseFaulted(id(2))
      assert.deepStrictEqual(p.seen, ["acquire A", "release A", "owner t1 2 fault"])
    }).pipe(Effect.scoped)
  })

  it.effect("a reap through the target releases the stale entry (owner told `reap`), past the registration grace, not at it", () => {
    const p = probeOf()
    const rule = (nowMs: number) => ({ reapTimeoutMs: 120_000, registrationGraceMs: 60_000, disconnectGraceMs: 0, nowMs, suspects: new Map() })
    return Effect.gen(function*() {
      const m = yield* tracked
      yield* m.register(id(3), p.request("A", p.owner("t1")))
      assert.deepStrictEqual(yield* m.target.reapStaleInstances(rule(60_000)), [])
      const reaped = yield* m.target.reapStaleInstances(rule(60_001))
      assert.deepStrictEqual(reaped.map((r) => [r.id, r.silentMs, r.windowMs]), [[3n, 60_001, 60_000]])
      assert.deepStrictEqual(p.seen, ["acquire A", "release A", "owner t1 3 reap"])
      assert.strictEqual(yield* m.target.trackedInstanceCount(), 0)
    }).pipe(Effect.scoped)
  })

  it.effect("closing the module's Scope (server shutdown) releases every entry, each owner told `shutdown`", () => {
    const p = probeOf()
    return Effect.gen(function*() {
      const scope = yield* Scope.make()
      const m = yield* tracked.pipe(Scope.provide(scope))
      yield* m.register(id(1), p.request("A", p.owner("t1")))
      yield* m.register(id(2), p.request("B", p.owner("t2")))
      yield* Scope.close(scope, Exit.void)
      assert.deepStrictEqual(p.seen.slice(2).sort(), ["owner t1 1 shutdown", "owner t2 2 shutdown", "release A", "release B"])
      assert.isTrue(p.seen.indexOf("release A") < p.seen.indexOf("owner t1 1 shutdown"), "the entry is released before its owner is told")
    })
  })
})

describe("tracked module: transfers", () => {
  it.effect("a transfer through a held entry refreshes last_seen and latches transfer activity; an unknown id is not_registered", () => {
    const p = probeOf()
    return Effect.gen(function*() {
      const m = yield* tracked
      const r = yield* m.register(id(1), p.request("A"))
      yield* TestClock.adjust("5 seconds")
      assert.strictEqual(yield* m.resolveForTransfer("store", id(1)), r.entry)
      const [summary] = yield* m.target.instances()
      assert.deepStrictEqual(summary, {
        instance_id: "1",
        kind: "kv_cache",
        last_seen_age_seconds: 0,
        has_liveness_signal: false,
        has_transfer_activity: true,
        details: { memory: "A" }
      })
      assert.deepStrictEqual(
        yield* Effect.flip(m.resolveForTransfer("retrieve", id(9))),
        new NotRegistered({
          op: "retrieve",
          instance_id: "9",
          message: "retrieve: instance 9 has no test context (never registered, unregistered or reaped); register it again"
        })
      )
    }).pipe(Effect.scoped)
  })
})

describe("tracked module under tenancy (RequestTenant: the owner checked in the look-up itself)", () => {
  it.effect("another tenant's transfer or same-memory REGISTER of a held id is forbidden and touches nothing; the owner's passes", () => {
    const p = probeOf()
    return Effect.gen(function*() {
      const m = yield* tracked
      yield* m.register(id(1), p.request("A", p.owner("t1"))).pipe(Effect.provideService(RequestTenant, "t1"))
      yield* TestClock.adjust("30 seconds")
      const asT2 = <A, E>(e: Effect.Effect<A, E>) => Effect.provideService(e, RequestTenant, "t2")
      assert.deepStrictEqual(yield* Effect.flip(asT2(m.resolveForTransfer("store", id(1)))), notYours("store", 1))
      assert.deepStrictEqual(yield* Effect.flip(asT2(m.register(id(1), p.request("A", p.owner("t2"))))), notYours("register_kv_cache", 1))
      const [untouched] = yield* m.target.instances()
      assert.strictEqual(untouched!.last_seen_age_seconds, 30)
      assert.strictEqual(untouched!.has_transfer_activity, false)
      assert.strictEqual(yield* ownerOf(m, id(1)), "t1")
      const entry = yield* m.resolveForTransfer("store", id(1)).pipe(Effect.provideService(RequestTenant, "t1"))
      assert.strictEqual(entry.memory, "A")
      const [touched] = yield* m.target.instances()
      assert.strictEqual(touched!.last_seen_age_seconds, 0)
      assert.strictEqual(touched!.has_transfer_activity, true)
      assert.deepStrictEqual(p.seen, ["acquire A"])
      // UNREGISTER: the pop checks the owner in the same transaction; another tenant's pops nothing.
      assert.deepStrictEqual(yield* Effect.flip(asT2(m.unregister(id(1)))), notYours("unregister_kv_cache", 1))
      assert.isTrue(yield* m.isRegistered(id(1)))
      assert.deepStrictEqual(p.seen, ["acquire A"])
      yield* m.unregister(id(1)).pipe(Effect.provideService(RequestTenant, "t1"))
      assert.deepStrictEqual(p.seen, ["acquire A", "release A", "owner t1 1 unregister"])
    }).pipe(Effect.scoped)
  })
})

describe("mirrored module", () => {
  it.effect("under tenancy another tenant's REGISTER never replaces the entry: forbidden, what it acquired released", () => {
    const p = probeOf()
    return Effect.gen(function*() {
      const m = yield* mirrored
      yield* m.register(id(1), p.request("A", p.owner("t1"))).pipe(Effect.provideService(RequestTenant, "t1"))
      const refused = yield* Effect.flip(m.register(id(1), p.request("B", p.owner("t2"))).pipe(Effect.provideService(RequestTenant, "t2")))
      assert.deepStrictEqual(refused, notYours("cb_register_rope", 1))
      assert.deepStrictEqual(p.seen, ["acquire A"])
      assert.strictEqual((yield* m.get(id(1)))?.memory, "A")
      assert.deepStrictEqual(yield* Effect.flip(m.resolveForTransfer("cb_retrieve", id(1)).pipe(Effect.provideService(RequestTenant, "t2"))), notYours("cb_retrieve", 1))
      assert.deepStrictEqual(yield* Effect.flip(m.unregister(id(1)).pipe(Effect.provideService(RequestTenant, "t2"))), notYours("unregister_kv_cache", 1))
      assert.deepStrictEqual(m.ids(), [id(1)])
    }).pipe(Effect.scoped)
  })

  it.effect("different arguments for a held id replace the entry: the new one is in before the old is released and its owner told", () => {
    const p = probeOf()
    return Effect.gen(function*() {
      const m = yield* mirrored
      const first = yield* m.register(id(1), p.request("A", p.owner("t1")))
      const second = yield* m.register(id(1), p.request("B", p.owner("t1")))
      assert.deepStrictEqual(second, { _tag: "Registered", entry: second.entry, replaced: first.entry })
      assert.deepStrictEqual(p.seen, ["acquire A", "acquire B", "release A", "owner t1 1 unregister"])
      assert.deepStrictEqual(m.ids(), [id(1)])
      assert.strictEqual((yield* m.get(id(1)))?.memory, "B")
    }).pipe(Effect.scoped)
  })

  it.effect("dropInstanceState of a reaped instance pops and releases its entry (owner told `reap`) and logs it; an unknown id does nothing", () => {
    const p = probeOf()
    const logs: Array<CapturedLog> = []
    return Effect.gen(function*() {
      const m = yield* mirrored
      yield* m.register(id(4), p.request("A", p.owner("t1")))
      assert.isTrue(yield* m.target.holdsInstance(id(4)))
      yield* m.target.dropInstanceState(id(4))
      yield* m.target.dropInstanceState(id(5))
      assert.deepStrictEqual(p.seen, ["acquire A", "release A", "owner t1 4 reap"])
      assert.isFalse(yield* m.target.holdsInstance(id(4)))
      assert.deepStrictEqual(logs.filter((l) => l.level === "Info").map((l) => l.text), ["dropped(4)"])
    }).pipe(Effect.scoped, Effect.provide(captureLogs(logs)))
  })

  it.effect("withdraw of the held entry pops it and tells the owner why; of an entry already replaced only releases that entry", () => {
    const p = probeOf()
    return Effect.gen(function*() {
      const m = yield* mirrored
      const a = yield* m.register(id(1), p.request("A", p.owner("t1")))
      const b = yield* m.register(id(1), p.request("B", p.owner("t1")))
      p.seen.length = 0
      // `a` was replaced (already released once by the replace): withdraw closes its Scope again, a no-op.
      yield* m.withdraw(id(1), a.entry, "fault")
      assert.deepStrictEqual(p.seen, [])
      assert.deepStrictEqual(m.ids(), [id(1)])
      yield* m.withdraw(id(1), b.entry, "fault")
      assert.deepStrictEqual(p.seen, ["release B", "owner t1 1 fault"])
      assert.deepStrictEqual(m.ids(), [])
    }).pipe(Effect.scoped)
  })
})
