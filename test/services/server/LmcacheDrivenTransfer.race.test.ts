/**
 * A randomized race: many fibers registering, transferring, unregistering
 * and reaping the same few ids at once. Afterwards every mapping was
 * released exactly once, no registered entry lacks its resources, and no
 * operation died.
 */
import { randomUUID } from "node:crypto"
import { assert, describe, it } from "@effect/vitest"
import { Context, Effect, Exit, Layer, Random, Scope } from "effect"
import { NativeMemoryLive } from "../../../src/layers/NativeMemory.ts"
import { ServerConfig } from "../../../src/services/server/ServerConfig.ts"
import type { ShmMapping } from "../../../src/native/Native.ts"
import type { CacheKey } from "../../../src/schema/CacheKey.ts"
import { makeInstanceId } from "../../../src/schema/InstanceId.ts"
import { L1Store } from "../../../src/services/server/L1Store.ts"
import { LayoutRegistry } from "../../../src/services/server/LayoutRegistry.ts"
import { LmcacheDrivenTransfer } from "../../../src/services/server/LmcacheDrivenTransfer.ts"
import { Lookup } from "../../../src/services/server/Lookup.ts"
import { makePagedKvCache, type PagedKvCache } from "../../../src/services/client/PagedKvCache.ts"
import { writeTokens } from "../../support/KvData.ts"
import { nativeProbe } from "../../support/NativeProbe.ts"

const IDS = [1, 2, 3]
const FIBERS = 24
const OPS_PER_FIBER = 40


const key = (n: number): CacheKey => ({
  model_name: "race",
  world_size: 1,
  worker_id: 0,
  token_ids: Array.from({ length: 32 }, (_, i) => (n * 31 + i) % 1000),
  start: 0,
  end: 32,
  request_id: `r${n}`,
  cache_salt: ""
})

describe("liveness race", () => {
  it.live("register / store / retrieve / unregister / reap of the same ids at once: one release per mapping, no entry without resources", () =>
    Effect.gen(function*() {
      const caches = new Map<number, PagedKvCache>()
      for (const n of IDS) {
        const cache = yield* makePagedKvCache({
          namePrefix: `mpcache-race-${randomUUID()}`,
          numLayers: 2,
          numBlocks: 8,
          blockSizeTokens: 16,
          numHeads: 1,
          headSize: 16,
          dtype: "float16"
        })
        yield* writeTokens(cache, n, [1, 2])
        caches.set(n, cache)
      }
      const opened: Array<ShmMapping> = []
      const moduleScope = yield* Scope.make()
      const ctx = yield* Layer.buildWithScope(
        LmcacheDrivenTransfer.layer.pipe(
          Layer.provideMerge(Lookup.layer),
          Layer.provideMerge(Layer.mergeAll(L1Store.layer, LayoutRegistry.layer).pipe(Layer.provideMerge(nativeProbe(opened)))),
          Layer.provideMerge(ServerConfig.layerTest({ chunkSize: 32 }))
        ),
        moduleScope
      )
      const transfer = Context.get(ctx, LmcacheDrivenTransfer)
      const outcomes = new Map<string, number>()
      const count = (k: string) => outcomes.set(k, (outcomes.get(k) ?? 0) + 1)

      const op = Effect.gen(function*() {
        const n = IDS[yield* Random.nextIntBetween(0, IDS.length - 1)]!
        const id = makeInstanceId(BigInt(n))
        const which = yield* Random.nextIntBetween(0, 4)
        yield* Effect.sleep(`${yield* Random.nextIntBetween(0, 3)} millis`)
        const exit = yield* Effect.exit(
          which === 0
            ? transfer.register(id, caches.get(n)!.descriptors, "race", 1, "vllm").pipe(Effect.as("register"))
            : which === 1
            ? transfer.store(key(yield* Random.nextIntBetween(0, 50)), id, [[1, 2]]).pipe(Effect.map((ok) => `store:${ok}`))
            : which === 2
            ? transfer.retrieve(key(yield* Random.nextIntBetween(0, 50)), id, [[3, 4]], 0).pipe(Effect.map((ok) => `retrieve:${ok}`))
            : which === 3
            ? transfer.unregister(id).pipe(Effect.as("unregister"))
            : transfer.target.reapStaleInstances({
              nowMs: Number.MAX_SAFE_INTEGER,
              reapTimeoutMs: 1,
              registrationGraceMs: 1,
              suspects: new Map(),
              disconnectGraceMs: 0
            }).pipe(Effect.map((r) => `reap:${r.length}`))
        )
        if (Exit.isSuccess(exit)) count(exit.value)
        else {
          const reason = exit.cause.reasons[0]
          assert.strictEqual(reason?._tag, "Fail", `no defect: ${String(exit.cause)}`)
          count(`fail:${reason?._tag === "Fail" ? (reason.error as { _tag: string })._tag : "?"}`)
        }
      })

      yield* Effect.forEach(
        Array.from({ length: FIBERS }, (_, i) => i),
        () => Effect.repeat(op, { times: OPS_PER_FIBER - 1 }),
        { concurrency: "unbounded", discard: true }
      )

      // Every registered id holds open mappings of exactly its own segments; nothing else is open.
      const instances = yield* transfer.target.instances()
      const expectedOpen = instances.flatMap((i) => caches.get(Number(i.instance_id))!.segmentNames).sort()
      const open = opened.filter((m) => !m.isClosed()).map((m) => m.name).sort()
      assert.deepStrictEqual(open, expectedOpen)
      assert.isTrue(opened.every((m) => m.releases() <= 1))

      yield* Scope.close(moduleScope, Exit.void)
      assert.deepStrictEqual(opened.map((m) => m.releases()), opened.map(() => 1))
      assert.isTrue(outcomes.has("register") && outcomes.has("store:true") && outcomes.has("fail:NotRegistered"), JSON.stringify([...outcomes]))
      assert.isTrue([...outcomes.keys()].some((k) => k.startsWith("reap:") && k !== "reap:0"), JSON.stringify([...outcomes]))
    }).pipe(Effect.scoped, Effect.provide(NativeMemoryLive)), 60_000)
})
