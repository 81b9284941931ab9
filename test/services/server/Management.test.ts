/**
 * The management module on its own (Management.ts, DESIGN §3.1 ops 20–22,
 * §5 "PING never inserts"): PING and PING_REGISTERED against in-memory
 * liveness targets that record their touches, NOOP, GET_CHUNK_SIZE from the
 * configuration, CLEAR against an in-memory cache (`Management.layerTest`).
 * Through the whole server these ops are covered by the integration and e2e
 * tests (MqServer.test.ts, FastPath.test.ts).
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect, Metric } from "effect"
import { PrometheusMetrics } from "effect/observability"
import { makeInstanceId } from "../../../src/schema/InstanceId.ts"
import { heldTarget } from "../../../src/services/liveness/LivenessTarget.ts"
import type { MemoryCache } from "../../../src/services/server/CacheControl.ts"
import { Management } from "../../../src/services/server/Management.ts"
import { type CapturedLog, captureLogs } from "../../support/FakeMqClient.ts"

const id = makeInstanceId

/** Two targets, one per kind, recording the ids they are touched with. */
const twoKinds = () => {
  const kvTouched: Array<bigint> = []
  const edTouched: Array<bigint> = []
  const kvHeld = new Set<bigint>([1n, 2n])
  const edHeld = new Set<bigint>([2n])
  const targets = [
    heldTarget("kv", kvHeld, { kind: "kv_cache", touched: kvTouched }),
    heldTarget("ed", edHeld, { kind: "engine_driven", touched: edTouched })
  ]
  return { kvTouched, edTouched, kvHeld, targets }
}

describe("PING", () => {
  it.effect("a named PING touches every target with the id and answers true; a nil PING touches none; each counted by form", () => {
    const t = twoKinds()
    return Effect.gen(function*() {
      const m = yield* Management
      assert.strictEqual(yield* m.ping(id(7)), true)
      assert.strictEqual(yield* m.ping(null), true)
      assert.strictEqual(yield* m.ping(null), true)
      assert.deepStrictEqual([t.kvTouched, t.edTouched], [[7n], [7n]])
      const text = yield* PrometheusMetrics.format()
      assert.match(text, /^mpcache_pings_total\{form="instance"\} 1$/m)
      assert.match(text, /^mpcache_pings_total\{form="nil"\} 2$/m)
    }).pipe(Effect.provide(Management.layerTest({ targets: t.targets })), Effect.provideService(Metric.MetricRegistry, new Map()))
  })

  it.effect("PING_REGISTERED touches like PING and answers the expected kinds no target of that kind holds, each once", () => {
    const t = twoKinds()
    return Effect.gen(function*() {
      const m = yield* Management
      assert.deepStrictEqual(yield* m.pingRegistered(id(2), ["kv_cache", "engine_driven"]), [])
      assert.deepStrictEqual(yield* m.pingRegistered(id(1), ["kv_cache", "engine_driven", "engine_driven"]), ["engine_driven"])
      t.kvHeld.delete(1n)
      assert.deepStrictEqual(yield* m.pingRegistered(id(1), ["kv_cache"]), ["kv_cache"])
      // A kind no module serves is missing too (a server without that module).
      assert.deepStrictEqual(yield* m.pingRegistered(id(2), ["cb_rope"]), ["cb_rope"])
      assert.deepStrictEqual(t.kvTouched, [2n, 1n, 1n, 2n])
    }).pipe(Effect.provide(Management.layerTest({ targets: t.targets })))
  })
})

describe("NOOP, GET_CHUNK_SIZE, CLEAR", () => {
  it.effect("NOOP answers OK; GET_CHUNK_SIZE answers --chunk-size", () =>
    Effect.gen(function*() {
      const m = yield* Management
      assert.strictEqual(yield* m.noop(), "OK")
      assert.strictEqual(yield* m.getChunkSize(), 64)
    }).pipe(Effect.provide(Management.layerTest({ config: { chunkSize: 64 } }))))

  it.effect("CLEAR passes force to the cache and logs how many objects it dropped", () => {
    const cache: MemoryCache = { unlocked: 3, locked: 2, clears: [] }
    const logs: Array<CapturedLog> = []
    return Effect.gen(function*() {
      const m = yield* Management
      yield* m.clear(false)
      yield* m.clear(true)
      assert.deepStrictEqual(cache, { unlocked: 0, locked: 0, clears: [false, true] })
      // The message, without the `{ force }` argument logged beside it.
      assert.deepStrictEqual(logs.filter((l) => l.level === "Info").map((l) => l.text.slice(0, l.text.indexOf(" dropped") + 8)), [
        "cache cleared: 3 object(s) dropped",
        "cache cleared: 2 object(s) dropped"
      ])
    }).pipe(Effect.provide(Management.layerTest({ cache })), Effect.provide(captureLogs(logs)))
  })

  it.effect("the module serves PING, PING_REGISTERED, NOOP, GET_CHUNK_SIZE and CLEAR on their DESIGN §3.1 pools", () =>
    Effect.gen(function*() {
      const m = yield* Management
      assert.deepStrictEqual(m.module.rows.map((r) => [r.op.name, r.pool]), [
        ["ping", "NORMAL"],
        ["ping_registered", "NORMAL"],
        ["noop", "SYNC"],
        ["get_chunk_size", "SYNC"],
        ["clear", "NORMAL"]
      ])
    }).pipe(Effect.provide(Management.layerTest())))
})
