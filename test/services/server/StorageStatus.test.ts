/**
 * The storage block of `/api/status` (StorageStatus.ts): the `native` block
 * counts workers' memory only — the server's own L1 pool, mapped by the
 * addon too, is reported under `l1` and taken out — and the `l1` block is
 * the store's counters. Real addon, real shared memory.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect, Layer } from "effect"
import { NativeMemoryLive } from "../../../src/layers/NativeMemory.ts"
import { NativeMemory } from "../../../src/native/Native.ts"
import { L1Store } from "../../../src/services/server/L1Store.ts"
import { ServerConfig } from "../../../src/services/server/ServerConfig.ts"
import { storageModule } from "../../../src/services/server/StorageStatus.ts"

const POOL_BYTES = 2 ** 20
const pooled = L1Store.layer.pipe(
  Layer.provideMerge(Layer.mergeAll(ServerConfig.layerTest({ l1SizeGb: POOL_BYTES / 2 ** 30, endpoint: "ipc:///tmp/storage-status" }), NativeMemoryLive))
)

describe("StorageStatus", () => {
  it.effect("the native block leaves the L1 pool out and counts a worker's mapping", () =>
    Effect.gen(function*() {
      const native = yield* NativeMemory
      const l1 = yield* L1Store
      const storage = yield* storageModule
      assert.strictEqual(storage.name, "storage")
      assert.deepStrictEqual(storage.rows, [])
      const before = (yield* storage.status!()) as Record<string, unknown>
      assert.deepStrictEqual(before.native, { open_mappings: 0, mapped_bytes: 0 })
      // The addon's own counters (process-wide: a fault test run before this file in the same worker counts there).
      assert.deepStrictEqual(before.fault_guard, { guarded_faults: native.guardedFaults(), cuda_faults: native.cudaFaults() })
      assert.strictEqual((before.l1 as { pool: string }).pool, l1.pool!.shmName)
      assert.strictEqual((before.l1 as { capacity_bytes: number }).capacity_bytes, POOL_BYTES)

      // A worker's segment, mapped as a REGISTER maps one.
      const name = `mpcache-test-storage-${process.pid}`
      yield* Effect.acquireRelease(native.createSegment(name, 8192), () => Effect.ignore(native.unlinkSegment(name)))
      yield* native.map(name, 8192)
      const after = (yield* storage.status!()) as Record<string, unknown>
      assert.deepStrictEqual(after.native, { open_mappings: 1, mapped_bytes: 8192 })
    }).pipe(Effect.scoped, Effect.provide(pooled)))

  it.effect("the l1 block is the store's counters (in-process L1: no pool)", () =>
    Effect.gen(function*() {
      const l1 = yield* L1Store
      const r = yield* l1.reserveWrite({ hash: new Uint8Array(32).fill(1), modelName: "m", kvRank: 0, cacheSalt: "" }, 100)
      assert.strictEqual(r._tag, "Reserved")
      const storage = yield* storageModule
      const status = (yield* storage.status!()) as Record<string, unknown>
      assert.deepStrictEqual(status.l1, {
        pool: null,
        capacity_bytes: 1000,
        prefaulted_bytes: 0,
        used_bytes: 100,
        objects: 1,
        reserved_objects: 1,
        locked_objects: 0,
        evictions: 0
      })
    }).pipe(Effect.provide(Layer.mergeAll(L1Store.layerTest(1000), NativeMemoryLive))))
})
