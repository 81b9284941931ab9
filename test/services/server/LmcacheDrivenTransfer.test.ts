/**
 * The transfer module's resource wiring: each registered context owns a
 * child Scope holding its mappings; UNREGISTER, a reap and server shutdown
 * all close it, and each mapping's release runs exactly once whichever path
 * gets there first.
 */
import { randomUUID } from "node:crypto"
import { assert, describe, it } from "@effect/vitest"
import { Context, Effect, Exit, Fiber, Layer, Scope } from "effect"
import { TestClock } from "effect/testing"
import { NativeMemoryLive } from "../../../src/layers/NativeMemory.ts"
import type { ShmMapping } from "../../../src/native/Native.ts"
import type { ReapedInstance } from "../../../src/services/liveness/LivenessTarget.ts"
import { makeInstanceId } from "../../../src/schema/InstanceId.ts"
import { LmcacheDrivenTransfer } from "../../../src/services/server/LmcacheDrivenTransfer.ts"
import { makePagedKvCache } from "../../../src/services/client/PagedKvCache.ts"
import { nativeProbe } from "../../support/NativeProbe.ts"


const transferLayer = (opened: Array<ShmMapping>) =>
  LmcacheDrivenTransfer.layerTest({ chunkSize: 32 }).pipe(Layer.provideMerge(nativeProbe(opened)))

const workerCache = makePagedKvCache({
  backing: "cpu_shm",
  namePrefix: `mpcache-test-${randomUUID()}`,
  numLayers: 2,
  numBlocks: 8,
  blockSizeTokens: 16,
  numHeads: 1,
  headSize: 8,
  dtype: "float16"
}).pipe(Effect.provide(NativeMemoryLive))

/** Runs `body` against a transfer module in its own scope; returns the mappings it opened after the scope closed. */
const withModule = (body: (t: LmcacheDrivenTransfer["Service"], moduleScope: Scope.Closeable) => Effect.Effect<void, unknown>) =>
  Effect.gen(function*() {
    const opened: Array<ShmMapping> = []
    const moduleScope = yield* Scope.make()
    const ctx = yield* Layer.buildWithScope(transferLayer(opened), moduleScope)
    const transfer = Context.get(ctx, LmcacheDrivenTransfer)
    yield* body(transfer, moduleScope)
    yield* Scope.close(moduleScope, Exit.void)
    return opened
  })

describe("each mapping is released exactly once", () => {
  it.live("unregister first, then server shutdown", () =>
    Effect.gen(function*() {
      const cache = yield* workerCache
      const opened = yield* withModule((t) =>
        Effect.gen(function*() {
          yield* t.register(makeInstanceId(1n), cache.descriptors, "m", 1, "vllm")
          yield* t.unregister(makeInstanceId(1n))
          yield* t.unregister(makeInstanceId(1n))
        })
      )
      assert.strictEqual(opened.length, 2)
      assert.deepStrictEqual(opened.map((m) => m.releases()), [1, 1])
    }).pipe(Effect.scoped))

  it.live("server shutdown alone releases every context", () =>
    Effect.gen(function*() {
      const cache = yield* workerCache
      const opened = yield* withModule((t) =>
        Effect.gen(function*() {
          yield* t.register(makeInstanceId(1n), cache.descriptors, "m", 1, "vllm")
          yield* t.register(makeInstanceId(2n), cache.descriptors, "m", 1, "vllm")
        })
      )
      assert.deepStrictEqual(opened.map((m) => m.releases()), [1, 1, 1, 1])
      assert.isTrue(opened.every((m) => m.isClosed()))
    }).pipe(Effect.scoped))

  it.live("unregister racing server shutdown", () =>
    Effect.gen(function*() {
      const cache = yield* workerCache
      const opened = yield* withModule((t, moduleScope) =>
        Effect.gen(function*() {
          yield* t.register(makeInstanceId(1n), cache.descriptors, "m", 1, "vllm")
          yield* Effect.all([t.unregister(makeInstanceId(1n)), Scope.close(moduleScope, Exit.void)], {
            concurrency: "unbounded",
            discard: true
          })
        })
      )
      assert.deepStrictEqual(opened.map((m) => m.releases()), [1, 1])
    }).pipe(Effect.scoped))

  it.effect("a reap releases through the same finalizer; a later unregister and shutdown do nothing more", () =>
    Effect.gen(function*() {
      const cache = yield* workerCache
      const opened = yield* withModule((t) =>
        Effect.gen(function*() {
          yield* t.register(makeInstanceId(1n), cache.descriptors, "m", 1, "vllm")
          yield* TestClock.adjust("3601 seconds")
          const reaped = yield* t.target.reapStaleInstances({
            nowMs: 3_601_000,
            reapTimeoutMs: 120_000,
            registrationGraceMs: 3_600_000,
            suspects: new Map(),
            disconnectGraceMs: 0
          })
          assert.deepStrictEqual(reaped, [{ id: makeInstanceId(1n), reason: "grace", silentMs: 3_601_000, windowMs: 3_600_000 }])
          assert.isFalse(yield* t.isRegistered(makeInstanceId(1n)))
          yield* t.unregister(makeInstanceId(1n))
        })
      )
      assert.deepStrictEqual(opened.map((m) => m.releases()), [1, 1])
    }).pipe(Effect.scoped))
})

describe("REGISTER of a held id racing a reap", () => {
  it.live("a reap popping the entry between REGISTER's look-up and its refresh: REGISTER registers anew, never answers success with nothing held", () =>
    Effect.gen(function*() {
      const cache = yield* workerCache
      const instance = makeInstanceId(1n)
      let reap: Fiber.Fiber<ReadonlyArray<ReapedInstance>> | undefined
      const opened = yield* withModule((t) =>
        Effect.gen(function*() {
          yield* t.register(instance, cache.descriptors, "m", 1, "vllm")
          // The same memory again, with a getter that starts a reap the first time REGISTER compares the
          // descriptors: after the look-up of the held entry, before its refresh. The reap's pop runs
          // synchronously inside runFork, so the interleaving is fixed.
          const [first, ...rest] = cache.descriptors
          const hooked = { ...first! }
          Object.defineProperty(hooked, "storage_offset", {
            enumerable: true,
            get: () => {
              reap ??= Effect.runFork(t.target.reapStaleInstances({
                nowMs: Number.MAX_SAFE_INTEGER,
                reapTimeoutMs: 1,
                registrationGraceMs: 1,
                suspects: new Map(),
                disconnectGraceMs: 0
              }))
              return first!.storage_offset
            }
          })
          yield* t.register(instance, [hooked, ...rest], "m", 1, "vllm")
          assert.isDefined(reap, "the reap ran inside REGISTER")
          const reaped = yield* Fiber.join(reap!)
          assert.deepStrictEqual(reaped.map((r) => r.id), [instance], "the reap popped the first context")
          assert.isTrue(yield* t.isRegistered(instance), "REGISTER answered success: the id is held")
          assert.strictEqual(yield* t.target.trackedInstanceCount(), 1)
        })
      )
      // The reaped context and the new one each mapped both segments once and released them once.
      assert.strictEqual(opened.length, 4)
      assert.deepStrictEqual(opened.map((m) => m.releases()), [1, 1, 1, 1])
    }).pipe(Effect.scoped))
})
