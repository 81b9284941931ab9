/**
 * The tenant guard (src/services/auth/internal/TenantGuard.ts) on its own: a
 * handler table of recording rows behind it, the owners in a fake liveness
 * target's entries, the grants in a map (what Handshake.ts would say).
 * Tenancy.test.ts drives the same guard through the real modules (limits,
 * released ids, ownership races); this file pins the checks row by row.
 *
 * - An unbound peer is refused before decoding (`admit`, field `hello`);
 *   HELLO's rows pass unwrapped.
 * - An op naming another tenant's instance is `forbidden` and never reaches
 *   its handler; a PING of it answers `true`, skips the binding and never
 *   reaches it either.
 * - CLEAR needs `admin`.
 * - A request id reaches the handler in the tenant's salt group.
 * - The `tenants` rows: an instance once per tenant, its bytes per entry,
 *   connections per grant.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { type InstanceId, makeInstanceId } from "../../../src/schema/InstanceId.ts"
import { Clear, EndSession, Hello, type Op, Ping, UnregisterKvCache } from "../../../src/schema/Op.ts"
import { Forbidden } from "../../../src/schema/WireError.ts"
import type { TenantGrant } from "../../../src/services/auth/AuthorizedKeys.ts"
import { makeTenantGuard } from "../../../src/services/auth/internal/TenantGuard.ts"
import type { InstanceOwner } from "../../../src/services/liveness/InstanceOwner.ts"
import { type LivenessTarget, noopTarget } from "../../../src/services/liveness/LivenessTarget.ts"
import { type HandlerRow, type RequestContext, row } from "../../../src/services/server/Handler.ts"

const A: TenantGrant = { tenant: "tenantA", admin: false, saltGroup: "groupA" }
const B: TenantGrant = { tenant: "tenantB", admin: true, saltGroup: "tenantB" }
const LIMITS = { maxInstances: 10, maxRegistersPerSecond: 100, maxMappedBytes: 1 << 30 }

const owner = (tenant: string, mappedBytes: number): InstanceOwner => ({ tenant, mappedBytes, release: () => Effect.void })

/** A target whose entries are `entries` (id → owner), of registration kind `kind`. */
const targetOf = (kind: "kv_cache" | "cb_rope", entries: Map<InstanceId, InstanceOwner>): LivenessTarget => ({
  ...noopTarget(kind),
  kind,
  holdsInstance: (id) => Effect.succeed(entries.has(id)),
  ownerOf: (id) => Effect.succeed(entries.get(id)),
  owners: () => Effect.succeed([...entries].map(([id, o]) => ({ id, owner: o })))
})

const setup = () => {
  const grants = new Map<string, TenantGrant>([["0a", A], ["0b", B]])
  const calls: Array<{ op: string; payload: ReadonlyArray<unknown> }> = []
  const recording = (op: Op): HandlerRow =>
    row(op, "NORMAL", ((payload: ReadonlyArray<unknown>) =>
      Effect.sync(() => {
        calls.push({ op: op.name, payload })
        return op.id === Ping.id ? true : undefined
      })) as never)
  const rows = [Hello, Ping, UnregisterKvCache, Clear, EndSession].map(recording)
  const kv = new Map<InstanceId, InstanceOwner>([[makeInstanceId(7), owner("tenantB", 4096)]])
  const rope = new Map<InstanceId, InstanceOwner>([[makeInstanceId(7), owner("tenantB", 100)], [makeInstanceId(8), owner("tenantB", 1)]])
  const guard = makeTenantGuard({ limits: LIMITS, graceSeconds: 30, grantOf: (peer) => grants.get(peer) })
  const table = guard.guard({ rows: rows.map((r) => ({ id: r.op.id, name: r.op.name, pool: r.pool, module: "test" })), byId: new Map(rows.map((r) => [r.op.id, r] as const)) }, [targetOf("kv_cache", kv), targetOf("cb_rope", rope)])
  const call = (op: Op, payload: ReadonlyArray<unknown>, peer: string) => {
    const ctx: RequestContext = { routingId: Buffer.from(peer, "hex"), peer, skipBinding: false }
    return Effect.map(table.byId.get(op.id)!.handle(payload, ctx), (result) => ({ result, ctx }))
  }
  return { guard, table, rows, calls, call }
}

describe("TenantGuard", () => {
  it("an unbound peer is refused before decoding; HELLO's rows pass unwrapped", () => {
    const { rows, table } = setup()
    const refused = table.byId.get(UnregisterKvCache.id)!.admit!({ routingId: Buffer.from("0c", "hex"), peer: "0c", skipBinding: false })
    assert.instanceOf(refused, Forbidden)
    assert.strictEqual((refused as Forbidden).field, "hello")
    assert.strictEqual(table.byId.get(UnregisterKvCache.id)!.admit!({ routingId: Buffer.from("0a", "hex"), peer: "0a", skipBinding: false }), undefined)
    assert.strictEqual(table.byId.get(Hello.id), rows[0])
  })

  it.effect("another tenant's instance: UNREGISTER is forbidden, PING answers true without binding; neither reaches its handler", () =>
    Effect.gen(function*() {
      const { call, calls } = setup()
      const refused = yield* Effect.flip(call(UnregisterKvCache, [makeInstanceId(7)], "0a"))
      assert.instanceOf(refused, Forbidden)
      assert.strictEqual(refused.message, "unregister_kv_cache: instance 7 belongs to another tenant; nothing was changed")
      const ping = yield* call(Ping, [makeInstanceId(7)], "0a")
      assert.deepStrictEqual([ping.result, ping.ctx.skipBinding], [true, true])
      assert.deepStrictEqual(calls, [])
      // Its own tenant reaches the handler.
      yield* call(UnregisterKvCache, [makeInstanceId(7)], "0b")
      assert.deepStrictEqual(calls.map((c) => c.op), ["unregister_kv_cache"])
    }))

  it.effect("CLEAR needs admin; a request id reaches the handler in the tenant's salt group", () =>
    Effect.gen(function*() {
      const { call, calls } = setup()
      const refused = yield* Effect.flip(call(Clear, [false], "0a"))
      assert.deepStrictEqual([refused._tag, (refused as Forbidden).field, refused.message], ["Forbidden", "tenant", "clear: tenant tenantA is not admin"])
      yield* call(Clear, [false], "0b")
      yield* call(EndSession, ["req-1"], "0a")
      assert.deepStrictEqual(calls, [{ op: "clear", payload: [false] }, { op: "end_session", payload: ["groupA|req-1"] }])
    }))

  it.effect("the tenants rows: an instance once, its bytes per entry, connections per grant", () =>
    Effect.gen(function*() {
      const { guard } = setup()
      const rows = yield* guard.tenants([A, B], [A, A, B])
      assert.deepStrictEqual(rows, [
        { tenant: "tenantA", admin: false, salt_group: "groupA", instances: 0, mapped_bytes: 0, connections: 2 },
        { tenant: "tenantB", admin: true, salt_group: "tenantB", instances: 2, mapped_bytes: 4197, connections: 1 }
      ])
      assert.strictEqual(yield* guard.tenantOf(makeInstanceId(8)), "tenantB")
      assert.strictEqual(yield* guard.tenantOf(makeInstanceId(9)), undefined)
      assert.deepStrictEqual(guard.releasedIds(), { held: 0, dropped: 0, max: 65_536, grace_seconds: 30 })
    }))
})
