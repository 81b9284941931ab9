/**
 * The blend module (src/services/server/Blend.ts) without sockets, on the
 * TestClock: RoPE state lifecycle (register, re-register, unregister, reap,
 * shutdown — each table mapping released exactly once), its part in
 * PING_REGISTERED and reaping, registration errors, and the token-mapping
 * rules of CB_RETRIEVE_PRE_COMPUTED's match plan.
 */
import { randomUUID } from "node:crypto"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Exit, Layer, Scope } from "effect"
import { TestClock } from "effect/testing"
import { NativeMemoryLive } from "../../../src/layers/NativeMemory.ts"
import type { ServerConfigInput } from "../../../src/services/server/ServerConfig.ts"
import { NativeMemory, type ShmMapping } from "../../../src/native/Native.ts"
import type { CbMatch } from "../../../src/schema/CbMatch.ts"
import type { TensorDescriptor } from "../../../src/schema/TensorDescriptor.ts"
import { InvalidArgument, NotRegistered, Overloaded } from "../../../src/schema/WireError.ts"
import { Blend } from "../../../src/services/server/Blend.ts"
import { planMatches } from "../../../src/services/server/internal/BlendPlan.ts"
import { Connections } from "../../../src/services/liveness/Connections.ts"
import { LivenessSettingsLive } from "../../../src/layers/LivenessSettings.ts"
import { L1Store } from "../../../src/services/server/L1Store.ts"
import { LivenessTargets } from "../../../src/services/liveness/LivenessTarget.ts"
import { LmcacheDrivenTransfer } from "../../../src/services/server/LmcacheDrivenTransfer.ts"
import { Management } from "../../../src/services/server/Management.ts"
import { Reaper } from "../../../src/services/liveness/Reaper.ts"
import { makePagedKvCache } from "../../../src/services/client/PagedKvCache.ts"
import { RequestBarrier } from "../../../src/services/liveness/RequestBarrier.ts"
import { type CapturedLog, captureLogs } from "../../support/FakeMqClient.ts"
import { emptyKey, id, workerCache } from "../../support/LivenessEnv.ts"
import { makeTableSegment } from "../../support/RopeReference.ts"

/**
 * The server's modules with blend, on the TestClock (like LivenessEnv, plus
 * blend as a liveness target), a NativeMemory that records every mapping it
 * hands out, and captured logs.
 */
const blendEnv = (config: Partial<ServerConfigInput> = {}) => {
  const mapped: Array<ShmMapping> = []
  const logs: Array<CapturedLog> = []
  const native = Layer.effect(
    NativeMemory,
    Effect.gen(function*() {
      const live = yield* NativeMemory
      return {
        ...live,
        map: (name: string, nbytes: number, options?: { readonly owned?: boolean }) =>
          live.map(name, nbytes, options).pipe(Effect.tap((m) => Effect.sync(() => mapped.push(m))))
      }
    })
  ).pipe(Layer.provide(NativeMemoryLive))
  const modules = Blend.layerTest({ chunkSize: 32, ...config }).pipe(Layer.provideMerge(native))
  const targets = Layer.effect(
    LivenessTargets,
    Effect.gen(function*() {
      return [(yield* LmcacheDrivenTransfer).target, (yield* Blend).target]
    })
  )
  const layer = Layer.mergeAll(Management.layer, Reaper.layer).pipe(
    Layer.provideMerge(Connections.layer),
    Layer.provideMerge(LivenessSettingsLive),
    Layer.provideMerge(Layer.mergeAll(targets, L1Store.layerCacheControl, RequestBarrier.layerNoop)),
    Layer.provideMerge(modules),
    Layer.provideMerge(captureLogs(logs))
  )
  /** The server's mappings of segment `name` (the first mapping of a table segment is the test's writer). */
  const serverMaps = (name: string) => mapped.filter((m) => m.name === name).slice(name.startsWith("mpcache-test-rope-") ? 1 : 0)
  return { layer, logs, serverMaps }
}

/** Worker caches have head size 8 (LivenessEnv's `workerCache`). */
const HEAD = 8

/** Registers instance `n` (KV cache, PING, one empty STORE: both liveness flags) and a RoPE table for it. */
const registerWithRope = (n: number, maxPosition = 64) =>
  Effect.gen(function*() {
    const transfer = yield* LmcacheDrivenTransfer
    const management = yield* Management
    const blend = yield* Blend
    const cache = yield* workerCache
    yield* transfer.register(id(n), cache.descriptors, "m", 1, "vllm")
    yield* management.ping(id(n))
    assert.isTrue(yield* transfer.store(emptyKey, id(n), [[]]))
    const table = yield* makeTableSegment(maxPosition, HEAD)
    yield* blend.registerRope(id(n), [table], HEAD, true, [0], [null])
    return { cache, table, name: table.shm_name! }
  })

const match = (over: Partial<CbMatch> = {}): CbMatch => ({ old_st: 0, old_ed: 16, cur_st: 0, cur_ed: 16, hash: new Uint8Array(32), ...over })

describe("RoPE state lifecycle", () => {
  it.effect("CB_REGISTER_ROPE needs the instance's kv_cache context: not_registered without one", () => {
    const env = blendEnv()
    return Effect.gen(function*() {
      const blend = yield* Blend
      const transfer = yield* LmcacheDrivenTransfer
      const table = yield* makeTableSegment(64, HEAD)
      const never = yield* Effect.flip(blend.registerRope(id(1), [table], HEAD, true, [], []))
      assert.instanceOf(never, NotRegistered)
      assert.strictEqual(
        never.message,
        "cb_register_rope: instance 1 holds no LMCache-driven kv_cache context (never registered, unregistered or reaped); register_kv_cache first"
      )
      const cache = yield* workerCache
      yield* transfer.register(id(1), cache.descriptors, "m", 1, "vllm")
      yield* transfer.unregister(id(1))
      assert.instanceOf(yield* Effect.flip(blend.registerRope(id(1), [table], HEAD, true, [], [])), NotRegistered)
      assert.deepStrictEqual(env.serverMaps(table.shm_name!), [], "nothing mapped")
      assert.isFalse(yield* blend.hasRope(id(1)))
    }).pipe(Effect.scoped, Effect.provide(env.layer))
  })

  it.effect("reaping an instance drops its RoPE state (tables unmapped once, logged); a later CB retrieve is not_registered; other instances keep theirs", () => {
    const env = blendEnv()
    return Effect.gen(function*() {
      const blend = yield* Blend
      const management = yield* Management
      const transfer = yield* LmcacheDrivenTransfer
      const one = yield* registerWithRope(1)
      const two = yield* registerWithRope(2)
      assert.deepStrictEqual(yield* management.pingRegistered(id(1), ["kv_cache", "cb_rope"]), [])
      yield* TestClock.adjust("100 seconds")
      yield* management.ping(id(2))
      yield* TestClock.adjust("50 seconds") // the scan at 150 s: 1 silent 150 s > 120 s; 2 silent 50 s
      assert.isFalse(yield* transfer.isRegistered(id(1)))
      assert.isFalse(yield* blend.hasRope(id(1)))
      assert.isTrue(yield* blend.hasRope(id(2)))
      assert.deepStrictEqual(env.serverMaps(one.name).map((m) => [m.isClosed(), m.releases()]), [[true, 1]])
      assert.deepStrictEqual(env.serverMaps(two.name).map((m) => [m.isClosed(), m.releases()]), [[false, 0]])
      assert.deepStrictEqual(
        env.logs.filter((l) => l.text.includes("dropped CB rope state")).map((l) => [l.level, l.text]),
        [["Info", "dropped CB rope state for reaped instance 1"]]
      )
      assert.deepStrictEqual(yield* management.pingRegistered(id(1), ["kv_cache", "cb_rope"]), ["kv_cache", "cb_rope"])
      assert.deepStrictEqual(yield* management.pingRegistered(id(2), ["kv_cache", "cb_rope"]), [])
      const key = { ...emptyKey, token_ids: [], start: 0, end: 0 }
      const gone = yield* Effect.flip(blend.retrievePreComputed(key, [match()], [[0]], id(1)))
      assert.instanceOf(gone, NotRegistered)
      // Registered again (a fresh KV context), the instance still has no RoPE state: it was dropped, not hidden.
      yield* transfer.register(id(1), one.cache.descriptors, "m", 1, "vllm")
      const noRope = yield* Effect.flip(blend.retrievePreComputed(key, [match()], [[0]], id(1)))
      assert.instanceOf(noRope, NotRegistered)
      assert.include(noRope.message, "cb_retrieve_pre_computed: instance 1 has no CB RoPE state")
      assert.deepStrictEqual(yield* management.pingRegistered(id(1), ["kv_cache", "cb_rope"]), ["cb_rope"])
      // Instance 2's state still serves: an empty match list is a successful no-op.
      assert.isTrue(yield* blend.retrievePreComputed(key, [], [[]], id(2)))
      assert.deepStrictEqual(blend.ropeInstances(), [id(2)])
      yield* (yield* Reaper).scan(0)
      assert.deepStrictEqual(env.serverMaps(one.name).map((m) => m.releases()), [1], "released once, not again")
    }).pipe(Effect.scoped, Effect.provide(env.layer))
  })

  it.effect("the blend target is a state mirror: no liveness of its own, never reaps, holds = has RoPE state", () => {
    const env = blendEnv()
    return Effect.gen(function*() {
      const blend = yield* Blend
      yield* registerWithRope(3)
      assert.strictEqual(blend.target.kind, "cb_rope")
      assert.isTrue(yield* blend.target.holdsInstance(id(3)))
      assert.isFalse(yield* blend.target.holdsInstance(id(4)))
      assert.strictEqual(yield* blend.target.trackedInstanceCount(), 0)
      assert.deepStrictEqual(yield* blend.target.instances(), [])
      const rule = { nowMs: 1e12, reapTimeoutMs: 1, registrationGraceMs: 1, suspects: new Map(), disconnectGraceMs: 0 }
      assert.deepStrictEqual(yield* blend.target.reapStaleInstances(rule), [])
      assert.isTrue(yield* blend.hasRope(id(3)))
      yield* blend.target.dropInstanceState(id(4)) // nothing held: a no-op, no log
      assert.isFalse(env.logs.some((l) => l.text.includes("reaped instance 4")))
    }).pipe(Effect.scoped, Effect.provide(env.layer))
  })

  it.effect("CB_UNREGISTER_ROPE drops only the RoPE state: the KV context stays, the tables are unmapped once; an unknown id succeeds", () => {
    const env = blendEnv()
    return Effect.gen(function*() {
      const blend = yield* Blend
      const transfer = yield* LmcacheDrivenTransfer
      const management = yield* Management
      const { name } = yield* registerWithRope(5)
      yield* blend.unregisterRope(id(5))
      yield* blend.unregisterRope(id(5))
      yield* blend.unregisterRope(id(77))
      assert.isFalse(yield* blend.hasRope(id(5)))
      assert.isTrue(yield* transfer.isRegistered(id(5)))
      assert.deepStrictEqual(env.serverMaps(name).map((m) => [m.isClosed(), m.releases()]), [[true, 1]])
      assert.deepStrictEqual(yield* management.pingRegistered(id(5), ["kv_cache", "cb_rope"]), ["cb_rope"])
      assert.strictEqual(env.logs.filter((l) => l.level === "Warn" && l.text.includes("no CB RoPE state found")).length, 2)
    }).pipe(Effect.scoped, Effect.provide(env.layer))
  })

  it.effect("re-registering identical arguments is a no-op; different ones replace the state (old tables unmapped once); a bad replacement keeps the old state", () => {
    const env = blendEnv()
    return Effect.gen(function*() {
      const blend = yield* Blend
      const { table, name } = yield* registerWithRope(6)
      yield* blend.registerRope(id(6), [table], HEAD, true, [0], [null])
      assert.strictEqual(env.serverMaps(name).length, 1, "identical: nothing remapped")
      // Another style is a different state: replaced.
      yield* blend.registerRope(id(6), [table], HEAD, false, [0], [null])
      assert.deepStrictEqual(env.serverMaps(name).map((m) => m.releases()), [1, 0])
      // A bad replacement fails and leaves the current state as it was.
      const bad = yield* Effect.flip(blend.registerRope(id(6), [{ ...table, dtype: "float16" }], HEAD, true, [0], [null]))
      assert.instanceOf(bad, InvalidArgument)
      const other = yield* makeTableSegment(128, HEAD)
      const missing = yield* Effect.flip(blend.registerRope(id(6), [other, { ...table, shm_name: "mpcache-test-rope-missing" }], HEAD, true, [0], [null]))
      assert.instanceOf(missing, InvalidArgument)
      assert.include(missing.message, "cb_register_rope: cos_sin_caches[1]: shared-memory segment mpcache-test-rope-missing does not exist")
      assert.deepStrictEqual(env.serverMaps(other.shm_name!).map((m) => [m.isClosed(), m.releases()]), [[true, 1]], "the half-built state is released")
      assert.isTrue(yield* blend.hasRope(id(6)))
      assert.deepStrictEqual(env.serverMaps(name).map((m) => m.releases()), [1, 0])
      // A good replacement with another table: the previous one is unmapped.
      yield* blend.registerRope(id(6), [other], HEAD, true, [], [])
      assert.deepStrictEqual(env.serverMaps(name).map((m) => m.releases()), [1, 1])
      assert.deepStrictEqual(env.serverMaps(other.shm_name!).map((m) => m.releases()), [1, 0])
      assert.isTrue(env.logs.some((l) => l.text.startsWith("replaced CB RoPE state for instance 6")))
    }).pipe(Effect.scoped, Effect.provide(env.layer))
  })

  it.effect("server shutdown releases every RoPE state's tables exactly once", () => {
    const env = blendEnv()
    return Effect.gen(function*() {
      const scope = yield* Scope.make()
      const context = yield* Layer.buildWithScope(env.layer, scope)
      const names = yield* Effect.gen(function*() {
        const a = yield* registerWithRope(7)
        const b = yield* registerWithRope(8)
        return [a.name, b.name]
      }).pipe(Effect.provideContext(context))
      yield* Scope.close(scope, Exit.void)
      assert.deepStrictEqual(names.map((n) => env.serverMaps(n).map((m) => [m.isClosed(), m.releases()])), [[[true, 1]], [[true, 1]]])
    }).pipe(Effect.scoped)
  })

  it.effect("bad tables and mismatched heads get invalid_argument naming the field; nothing stays mapped", () => {
    const env = blendEnv()
    return Effect.gen(function*() {
      const blend = yield* Blend
      const transfer = yield* LmcacheDrivenTransfer
      const cache = yield* workerCache
      yield* transfer.register(id(9), cache.descriptors, "m", 1, "vllm")
      const table = yield* makeTableSegment(64, HEAD)
      const message = (caches: ReadonlyArray<TensorDescriptor>, headSize = HEAD, rot: ReadonlyArray<readonly [number, number] | null> = []) =>
        Effect.map(Effect.flip(blend.registerRope(id(9), caches, headSize, true, [], rot)), (e) => {
          assert.instanceOf(e, InvalidArgument)
          return e.message
        })
      const cuda: TensorDescriptor = { kind: "cuda_ipc", ipc_handle: new Uint8Array(64), device_uuid: "GPU-0", nbytes: table.nbytes, dtype: "float32", shape: table.shape, stride: table.stride, storage_offset: 0 }
      assert.strictEqual(yield* message([cuda]), "cb_register_rope: cos_sin_caches[0].kind: cuda_ipc: CUDA IPC backend not available on this host")
      assert.include(yield* message([{ ...table, shape: [64, 6], stride: [6, 1] }]), "cos_sin_caches[0].shape[1]: rotary_dim 6 must equal head_size 8")
      assert.include(yield* message([{ ...table, nbytes: table.nbytes + 4 }]), `cb_register_rope: cos_sin_caches[0]: openMapping: segment ${table.shm_name} holds 2048 bytes, the descriptor claims 2052`)
      assert.strictEqual(
        yield* message([{ ...table, shape: [32, 16], stride: [16, 1] }], 16, [[0, 16]]),
        "cb_register_rope: head_size: 16 does not match the head size (8) of the instance's registered KV cache"
      )
      const int8 = yield* makePagedKvCache({ backing: "cpu_shm", namePrefix: `mpcache-test-int8-${randomUUID()}`, numLayers: 1, numBlocks: 4, blockSizeTokens: 16, numHeads: 1, headSize: HEAD, dtype: "int8" })
      yield* transfer.register(id(10), int8.descriptors, "m8", 1, "vllm")
      const int8Error = yield* Effect.flip(blend.registerRope(id(10), [table], HEAD, true, [], []))
      assert.include(int8Error.message, "registered KV cache has dtype int8, which blend cannot re-rotate")
      assert.deepStrictEqual(env.serverMaps(table.shm_name!), [], "every check runs before anything is mapped")
      assert.deepStrictEqual(blend.ropeInstances(), [])
    }).pipe(Effect.scoped, Effect.provide(env.layer))
  })
})

describe("CB_REGISTER_ROPE and the mapping budget (issue 24 item 4)", () => {
  /** A worker's one-layer KV cache, mapped on the worker's side by a native layer of its own. */
  const ownCache = makePagedKvCache({ backing: "cpu_shm", namePrefix: `mpcache-test-budget-${randomUUID()}`, numLayers: 1, numBlocks: 4, blockSizeTokens: 16, numHeads: 1, headSize: HEAD, dtype: "float16" })
    .pipe(Effect.provide(Layer.fresh(NativeMemoryLive)))

  it.effect("more cos/sin segments than --max-segments-per-register: overloaded naming it, nothing mapped, no state", () => {
    const env = blendEnv({ maxSegmentsPerRegister: 1 })
    return Effect.gen(function*() {
      const blend = yield* Blend
      const transfer = yield* LmcacheDrivenTransfer
      yield* transfer.register(id(3), (yield* ownCache).descriptors, "m", 1, "vllm")
      const t1 = yield* makeTableSegment(64, HEAD)
      const t2 = yield* makeTableSegment(64, HEAD)
      const refused = yield* Effect.flip(blend.registerRope(id(3), [t1, t2], HEAD, true, [0, 1], [null, null]))
      assert.instanceOf(refused, Overloaded)
      assert.deepStrictEqual([refused.field, refused.message], [
        "max-segments-per-register",
        "cb_register_rope: instance 3: cos_sin_caches names more than 1 distinct segments, over --max-segments-per-register (1); nothing was mapped: let layers share segments (one segment with offsets, DESIGN §3.2) or raise the limit"
      ])
      assert.deepStrictEqual([env.serverMaps(t1.shm_name!), env.serverMaps(t2.shm_name!)], [[], []])
      assert.isFalse(yield* blend.hasRope(id(3)))
    }).pipe(Effect.scoped, Effect.provide(env.layer))
  })

  it.effect("a table past --max-mappings: overloaded naming it, nothing of it mapped, the state held before kept", () => {
    const env = blendEnv({ maxMappings: 2 })
    return Effect.gen(function*() {
      const blend = yield* Blend
      const transfer = yield* LmcacheDrivenTransfer
      yield* transfer.register(id(4), (yield* ownCache).descriptors, "m", 1, "vllm")
      const t1 = yield* makeTableSegment(64, HEAD)
      yield* blend.registerRope(id(4), [t1], HEAD, true, [0], [null])
      // A replacement: its table would be mapped while the old one still is (2 held + 1).
      const t2 = yield* makeTableSegment(32, HEAD)
      const refused = yield* Effect.flip(blend.registerRope(id(4), [t2], HEAD, true, [0], [null]))
      assert.instanceOf(refused, Overloaded)
      assert.deepStrictEqual([refused.field, refused.actual], ["max-mappings", "2 held + 1 asked"])
      assert.deepStrictEqual(env.serverMaps(t2.shm_name!), [])
      assert.deepStrictEqual(env.serverMaps(t1.shm_name!).map((m) => m.isClosed()), [false])
      assert.isTrue(yield* blend.hasRope(id(4)))
    }).pipe(Effect.scoped, Effect.provide(env.layer))
  })
})

describe("CB_RETRIEVE_PRE_COMPUTED match plan", () => {
  const limits = { chunkSizeTokens: 32, blockSizeTokens: 16, numBlocks: 8, maxPosition: 100 }
  const plan = (matches: ReadonlyArray<CbMatch>, blocks: ReadonlyArray<number> = [0, 1, 2, 3, 4, 5, 6, 7]) => planMatches(matches, blocks, limits)
  const error = (r: ReturnType<typeof planMatches>) => ("error" in r ? r.error : "valid")

  it("old_st/old_ed are positions in the original request: the object's token offset is old_st mod chunk_size", () => {
    const r = plan([match({ old_st: 40, old_ed: 64, cur_st: 100, cur_ed: 124 }), match({ old_st: 3, old_ed: 4, cur_st: 0, cur_ed: 1 })])
    assert.deepStrictEqual("matches" in r ? r.matches.map((m) => [m.objectTokenOffset, m.curSt, m.numTokens, m.delta]) : r, [
      [8, 100, 24, 60],
      [3, 0, 1, -3]
    ])
  })

  it("an empty match is skipped; a whole chunk and a range ending at the chunk's end are accepted", () => {
    const r = plan([match({ old_st: 5, old_ed: 5, cur_st: 9, cur_ed: 9 }), match({ old_st: 32, old_ed: 64, cur_st: 64, cur_ed: 96 })])
    assert.deepStrictEqual("matches" in r ? r.matches.map((m) => m.index) : r, [1])
  })

  it("each violation names the match and the rule", () => {
    assert.include(error(plan([match({ hash: new Uint8Array(31) })])), "matches[0].hash: expected 32 bytes")
    assert.include(error(plan([match({ old_st: 0, old_ed: 16, cur_st: 0, cur_ed: 15 })])), "matches[0]: the old range [0, 16) has 16 tokens but the current range [0, 15) has 15")
    assert.include(error(plan([match({ old_st: 10, old_ed: 5 })])), "matches[0]: old_ed (5) is below old_st (10)")
    assert.include(error(plan([match({ cur_st: 10, cur_ed: 5 })])), "matches[0]: cur_ed (5) is below cur_st (10)")
    assert.include(error(plan([match({ old_st: 20, old_ed: 40, cur_st: 0, cur_ed: 20 })])), "crosses the end of chunk 0 (tokens [0, 32)")
    assert.include(error(plan([match({ old_st: 0, old_ed: 16, cur_st: 120, cur_ed: 136 })])), "ends in block 8 (block size 16) but block_ids[0] has 8 ids")
    assert.include(error(plan([match()], [9])), "block_ids[0][0] = 9 (used by matches[0]) is outside the registered 8 blocks")
    assert.include(error(plan([match({ old_st: 0, old_ed: 1, cur_st: 100, cur_ed: 101 })])), "the shift 100 (cur_st − old_st) needs cos/sin row 100, but the table has 100 rows")
    assert.include(error(plan([match({ old_st: 0, old_ed: 16, cur_st: 0, cur_ed: 16 }), match({ old_st: 32, old_ed: 48, cur_st: 15, cur_ed: 31 })])), "matches[0] and matches[1] both write current position 15")
    assert.strictEqual(error(plan([match({ old_st: 0, old_ed: 16, cur_st: 0, cur_ed: 16 }), match({ old_st: 32, old_ed: 48, cur_st: 16, cur_ed: 32 })])), "valid")
  })
})
