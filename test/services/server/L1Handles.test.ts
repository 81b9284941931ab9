/**
 * L1 reservations and read locks as scoped handles (issue 25 item 2,
 * src/services/server/internal/L1Handles.ts): the handles themselves, then
 * the LMCache-driven STORE and RETRIEVE with a defect or an interruption
 * injected at every step (test/support/FaultSteps.ts) — after each run L1
 * holds no reservation and no read lock. The engine-driven PREPARE/COMMIT
 * and the LOOKUP prefetch / L2 fetch get the same in their own test files.
 */
import { randomUUID } from "node:crypto"
import { assert, describe, it } from "@effect/vitest"
import { Context, Effect, Exit, Layer, Scope } from "effect"
import { NativeMemoryLive } from "../../../src/layers/NativeMemory.ts"
import type { CacheKey } from "../../../src/schema/CacheKey.ts"
import { makeInstanceId } from "../../../src/schema/InstanceId.ts"
import { makePagedKvCache } from "../../../src/services/client/PagedKvCache.ts"
import * as L1Handles from "../../../src/services/server/internal/L1Handles.ts"
import { L1Store } from "../../../src/services/server/L1Store.ts"
import { LayoutRegistry } from "../../../src/services/server/LayoutRegistry.ts"
import { LmcacheDrivenTransfer } from "../../../src/services/server/LmcacheDrivenTransfer.ts"
import { Lookup } from "../../../src/services/server/Lookup.ts"
import { MappingBudget } from "../../../src/services/server/MappingBudget.ts"
import type { ObjectKey } from "../../../src/services/server/ObjectKey.ts"
import { ServerConfig } from "../../../src/services/server/ServerConfig.ts"
import { atEveryStep, faultyL1, faultyNative, makeFaultSteps } from "../../support/FaultSteps.ts"
import { writeTokens } from "../../support/KvData.ts"

const key = (n: number): ObjectKey => ({
  hash: new Uint8Array(32).fill(n),
  modelName: "m",
  kvRank: 0,
  cacheSalt: ""
})

const put = (l1: L1Store["Service"], k: ObjectKey, size: number) =>
  Effect.gen(function*() {
    const r = yield* l1.reserveWrite(k, size)
    if (r._tag !== "Reserved") return assert.fail(r._tag)
    assert.isTrue(yield* l1.commit(r.reservation))
  })

describe("L1Handles", () => {
  const counts = (l1: L1Store["Service"]) => {
    const s = l1.stats()
    return { reserved: s.reservedObjects, locked: s.lockedObjects, used: s.usedBytes }
  }

  it.effect("a held reservation is aborted when its scope closes, by success, failure, defect or interruption, unless committed", () =>
    Effect.gen(function*() {
      const l1 = yield* L1Store.make(1000)
      const ends = [
        Effect.void,
        Effect.fail("wire error"),
        Effect.die(new Error("defect")),
        Effect.interrupt
      ] as const
      for (const [i, end] of ends.entries()) {
        const exit = yield* Effect.exit(Effect.scoped(Effect.gen(function*() {
          const r = yield* L1Handles.reserve(l1, key(i), 100)
          assert.strictEqual(r._tag, "Reserved")
          assert.deepStrictEqual(counts(l1), { reserved: 1, locked: 0, used: 100 })
          yield* end
        })))
        assert.strictEqual(Exit.isSuccess(exit), i === 0)
        assert.deepStrictEqual(counts(l1), { reserved: 0, locked: 0, used: 0 })
        assert.isFalse(l1.contains(key(i)))
      }
      // Committed through the handle: published, and the close aborts nothing.
      yield* Effect.scoped(Effect.gen(function*() {
        const r = yield* L1Handles.reserve(l1, key(9), 100)
        if (r._tag !== "Reserved") return assert.fail(r._tag)
        assert.isTrue(yield* L1Handles.commit(l1, r.hold))
        assert.isFalse(yield* L1Handles.commit(l1, r.hold))
      }))
      assert.isTrue(l1.contains(key(9)))
      assert.deepStrictEqual(counts(l1), { reserved: 0, locked: 0, used: 100 })
    }))

  it.effect("a held read lock is unlocked when its scope closes; a moved one passes to its new owner", () =>
    Effect.gen(function*() {
      const l1 = yield* L1Store.make(1000)
      yield* put(l1, key(1), 100)
      const exit = yield* Effect.exit(Effect.scoped(Effect.gen(function*() {
        assert.isDefined(yield* L1Handles.readLock(l1, key(1)))
        assert.isUndefined(yield* L1Handles.readLock(l1, key(2)))
        assert.strictEqual(l1.stats().lockedObjects, 1)
        return yield* Effect.die(new Error("defect"))
      })))
      assert.isTrue(Exit.hasDies(exit))
      assert.strictEqual(l1.stats().lockedObjects, 0)
      const moved = yield* Effect.scoped(Effect.gen(function*() {
        const lock = yield* L1Handles.readLock(l1, key(1))
        const h = L1Handles.moveRead(lock!)
        assert.isUndefined(L1Handles.moveRead(lock!))
        return h!
      }))
      assert.strictEqual(l1.stats().lockedObjects, 1)
      l1.unlockRead(moved)
      assert.strictEqual(l1.stats().lockedObjects, 0)
    }))

  it.effect("holdFor: holds pass to the record that adopts them; a failed, dead, interrupted or refused use leaves nothing", () =>
    Effect.gen(function*() {
      const l1 = yield* L1Store.make(1000)
      const owner = yield* Scope.make()
      const records = new Map<string, L1Handles.Held>()
      const use = (end: Effect.Effect<void, string>) =>
        Effect.gen(function*() {
          yield* L1Handles.reserve(l1, key(1), 100)
          yield* end
        })
      const adopt = (accept: boolean) => (_: void, holds: Scope.Closeable) => {
        if (!accept) return [holds]
        const displaced = records.get("k")
        records.set("k", { holds })
        return displaced === undefined ? [] : [displaced.holds]
      }
      for (const end of [Effect.fail("wire error"), Effect.die(new Error("defect")), Effect.interrupt]) {
        yield* Effect.exit(L1Handles.holdFor(owner, use(end), adopt(true)))
        assert.deepStrictEqual([counts(l1).reserved, records.size], [0, 0])
      }
      yield* L1Handles.holdFor(owner, use(Effect.void), adopt(false))
      assert.deepStrictEqual([counts(l1).reserved, records.size], [0, 0])
      yield* L1Handles.holdFor(owner, use(Effect.void), adopt(true))
      assert.deepStrictEqual([counts(l1).reserved, records.size], [1, 1])
      // A COMMIT takes the record into its scope: released however the COMMIT ends.
      yield* Effect.exit(Effect.scoped(Effect.gen(function*() {
        const taken = yield* L1Handles.takeHeld(() => {
          const r = records.get("k")
          records.delete("k")
          return r
        })
        assert.isDefined(taken)
        return yield* Effect.die(new Error("defect mid-commit"))
      })))
      assert.deepStrictEqual([counts(l1).reserved, records.size], [0, 0])
      // The owner's close releases what is still pending.
      yield* L1Handles.holdFor(owner, use(Effect.void), adopt(true))
      assert.strictEqual(counts(l1).reserved, 1)
      yield* Scope.close(owner, Exit.void)
      assert.deepStrictEqual(counts(l1), { reserved: 0, locked: 0, used: 0 })
    }))
})

describe("LMCache-driven STORE and RETRIEVE: a defect or an interruption at every step leaves L1 holding nothing", () => {
  const faults = makeFaultSteps()
  const env = LmcacheDrivenTransfer.layer.pipe(
    Layer.provideMerge(Lookup.layer),
    Layer.provideMerge(Layer.mergeAll(faultyL1(faults).pipe(Layer.provide(L1Store.layer)), LayoutRegistry.layer, MappingBudget.layer)),
    Layer.provideMerge(faultyNative(faults).pipe(Layer.provideMerge(NativeMemoryLive))),
    Layer.provideMerge(ServerConfig.layerTest({ chunkSize: 32 }))
  )
  const ID = makeInstanceId(7n)
  /** Two chunks of 32 tokens: blocks 1–4 of 16 tokens. */
  const cacheKey = (requestId: string): CacheKey => ({
    model_name: "faults",
    world_size: 1,
    worker_id: 0,
    token_ids: Array.from({ length: 64 }, (_, i) => 500 + i),
    start: 0,
    end: 64,
    request_id: requestId,
    cache_salt: ""
  })
  const BLOCKS = [[1, 2, 3, 4]]

  /** A registered worker with its tokens written; the transfer and L1 (faults disarmed). */
  const registered = Effect.gen(function*() {
    const cache = yield* makePagedKvCache({
      backing: "cpu_shm",
      namePrefix: `mpcache-faults-${randomUUID()}`,
      numLayers: 2,
      numBlocks: 8,
      blockSizeTokens: 16,
      numHeads: 1,
      headSize: 8,
      dtype: "float16"
    })
    yield* writeTokens(cache, 3, [1, 2, 3, 4])
    const transfer = yield* LmcacheDrivenTransfer
    yield* transfer.register(ID, cache.descriptors, "faults", 1, "vllm")
    return { transfer, l1: yield* L1Store, lookup: yield* Lookup }
  })

  const holdsNothing = (l1: L1Store["Service"], label: string) => {
    const s = l1.stats()
    assert.deepStrictEqual({ reserved: s.reservedObjects, locked: s.lockedObjects }, { reserved: 0, locked: 0 }, label)
  }

  it.effect("STORE: every reservation is aborted or committed, whatever ends it", () =>
    Effect.gen(function*() {
      const { l1, transfer } = yield* registered
      const steps = yield* atEveryStep(faults, {
        setup: Effect.asVoid(l1.clear(false)),
        path: transfer.store(cacheKey("s"), ID, BLOCKS),
        check: (exit, run) =>
          Effect.sync(() => {
            holdsNothing(l1, run.label)
            // A defect never answers success: the run dies, or the copy's failure answers false.
            if (run.fired && run.kind === "defect") assert.isFalse(Exit.isSuccess(exit) && exit.value, run.label)
            if (!run.fired) assert.deepStrictEqual([Exit.isSuccess(exit) && exit.value, l1.stats().objects], [true, 2], run.label)
          })
      })
      assert.deepStrictEqual(steps, ["l1.reserveWrite", "l1.reserveWrite", "native.gatherAll", "native.gatherAll", "l1.commit", "l1.commit"])
    }).pipe(Effect.provide(env)))

  it.effect("RETRIEVE: every read lock is released, whatever ends it", () =>
    Effect.gen(function*() {
      const { l1, transfer } = yield* registered
      const steps = yield* atEveryStep(faults, {
        setup: Effect.gen(function*() {
          yield* l1.clear(false)
          assert.isTrue(yield* transfer.store(cacheKey("r"), ID, BLOCKS))
        }),
        path: transfer.retrieve(cacheKey("r"), ID, [[5, 6, 7, 0]], 0),
        check: (exit, run) =>
          Effect.sync(() => {
            holdsNothing(l1, run.label)
            if (run.fired && run.kind === "defect") assert.isFalse(Exit.isSuccess(exit) && exit.value, run.label)
            if (!run.fired) assert.isTrue(Exit.isSuccess(exit) && exit.value, run.label)
          })
      })
      assert.deepStrictEqual(steps, ["l1.lockRead", "l1.lockRead", "native.scatterAll", "native.scatterAll"])
    }).pipe(Effect.provide(env)))

  it.effect("RETRIEVE of a looked-up request: the prefetch locks it takes over are released too", () =>
    Effect.gen(function*() {
      const { l1, transfer, lookup } = yield* registered
      yield* atEveryStep(faults, {
        setup: Effect.gen(function*() {
          yield* lookup.endSession("q")
          yield* l1.clear(false)
          assert.isTrue(yield* transfer.store(cacheKey("q"), ID, BLOCKS))
          yield* lookup.lookup(cacheKey("q"))
          assert.strictEqual(l1.stats().lockedObjects, 2)
        }),
        path: transfer.retrieve(cacheKey("q"), ID, [[5, 6, 7, 0]], 0),
        check: (_, run) =>
          Effect.gen(function*() {
            // The locks the RETRIEVE did not take stay the session's until it ends.
            yield* lookup.endSession("q")
            holdsNothing(l1, run.label)
          })
      })
    }).pipe(Effect.provide(env)))
})
