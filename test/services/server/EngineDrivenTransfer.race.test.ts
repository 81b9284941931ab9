/**
 * A randomized race on the engine-driven module (DESIGN §4: the pair
 * (context entry, transfer strategy) is inserted and removed atomically):
 * many fibers registering, preparing, committing, unregistering and reaping
 * the same few ids at once. Afterwards no registered context lacks its
 * strategy or holds a closed one, every released context's strategy is
 * closed with nothing pending, L1 holds exactly the reservations of the
 * live strategies, no operation died, and once everything is unregistered
 * no reservation, read lock or layout reference is left.
 */
import { assert, describe, it } from "@effect/vitest"
import { Context, Effect, Exit, Layer, Random, Scope } from "effect"
import { NativeMemoryLive } from "../../../src/layers/NativeMemory.ts"
import { ServerConfig } from "../../../src/services/server/ServerConfig.ts"
import type { CacheKey } from "../../../src/schema/CacheKey.ts"
import { makeInstanceId } from "../../../src/schema/InstanceId.ts"
import { type EngineDrivenContext, EngineDrivenTransfer } from "../../../src/services/server/EngineDrivenTransfer.ts"
import { L1Store } from "../../../src/services/server/L1Store.ts"
import { LayoutRegistry } from "../../../src/services/server/LayoutRegistry.ts"
import { Lookup } from "../../../src/services/server/Lookup.ts"

const IDS = [1, 2, 3]
const FIBERS = 24
const OPS_PER_FIBER = 60
const CHUNK = 32
const CHUNK_BYTES = 2 * 2 * CHUNK * 8 * 2

const key = (r: number): CacheKey => ({
  model_name: "race",
  world_size: 1,
  worker_id: 0,
  // Requests share their first chunk in pairs, so reservations and locks overlap across requests.
  token_ids: Array.from({ length: 96 }, (_, i) => (i < 32 ? Math.floor(r / 2) * 1000 + i : r * 31 + i) % 5000),
  start: 0,
  end: 96,
  request_id: `r${r}`,
  cache_salt: ""
})

describe("engine-driven liveness race", () => {
  it.live("register / prepare / commit / unregister / reap of the same ids at once: never a context without its strategy, nothing leaked", () =>
    Effect.gen(function*() {
      const moduleScope = yield* Scope.make()
      const ctx = yield* Layer.buildWithScope(
        EngineDrivenTransfer.layer.pipe(
          Layer.provideMerge(Lookup.layer),
          Layer.provideMerge(Layer.mergeAll(L1Store.layer, LayoutRegistry.layer).pipe(Layer.provideMerge(NativeMemoryLive))),
          Layer.provideMerge(ServerConfig.layerTest({ chunkSize: CHUNK, l1SizeGb: (64 * CHUNK_BYTES) / 2 ** 30 }))
        ),
        moduleScope
      )
      const ed = Context.get(ctx, EngineDrivenTransfer)
      const l1 = Context.get(ctx, L1Store)
      const layouts = Context.get(ctx, LayoutRegistry)
      const created = new Set<EngineDrivenContext>()
      const outcomes = new Map<string, number>()
      const count = (k: string) => outcomes.set(k, (outcomes.get(k) ?? 0) + 1)
      const registration = (n: number) => ({
        instance_id: makeInstanceId(BigInt(n)),
        model_name: "race",
        world_size: 1,
        block_size: 16,
        num_layers: 2,
        hidden_dim_size: 8,
        dtype_str: "float16" as const,
        use_mla: false
      })

      const op = Effect.gen(function*() {
        const n = IDS[yield* Random.nextIntBetween(0, IDS.length - 1)]!
        const id = makeInstanceId(BigInt(n))
        const k = key(yield* Random.nextIntBetween(0, 11))
        // Weighted: registers and transfers often, unregisters and reaps now and then.
        const which = [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 3, 3, 3, 4, 4, 5, 5, 6][yield* Random.nextIntBetween(0, 17)]!
        const emptyCommit = yield* Random.nextBoolean
        yield* Effect.sleep(`${yield* Random.nextIntBetween(0, 2)} millis`)
        const exit = yield* Effect.exit(
          which === 0
            ? ed.register(registration(n)).pipe(
              Effect.andThen(ed.contextOf(id)),
              Effect.map((c) => {
                if (c !== undefined) created.add(c)
                return "register"
              })
            )
            : which === 1
            ? ed.prepareStore(k, id).pipe(
              Effect.tap(() => Effect.sleep(`${n} millis`)),
              Effect.andThen(emptyCommit ? ed.commitStore(k, id, new Uint8Array(0)) : Effect.succeed(false)),
              Effect.map((ok) => `prepare_store+commit:${ok}`)
            )
            : which === 2
            ? ed.commitStore(k, id, emptyCommit ? new Uint8Array(0) : new Uint8Array(CHUNK_BYTES)).pipe(
              Effect.map((ok) => `commit_store:${ok}`)
            )
            : which === 3
            ? ed.prepareRetrieve(k, id).pipe(Effect.map((r) => `prepare_retrieve:${r.success}`))
            : which === 4
            ? ed.prepareRetrieve(k, id).pipe(
              Effect.tap(() => Effect.sleep(`${n} millis`)),
              Effect.andThen(ed.commitRetrieve(k, id)),
              Effect.map((ok) => `prepare_retrieve+commit:${ok}`)
            )
            : which === 5
            ? ed.unregister(id).pipe(Effect.as("unregister"))
            : ed.target.reapStaleInstances({
              nowMs: Number.MAX_SAFE_INTEGER,
              reapTimeoutMs: 1,
              registrationGraceMs: 1,
              suspects: new Map(),
              disconnectGraceMs: 0
            }).pipe(Effect.map((r) => `reap:${r.length > 0}`))
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

      // Every registered context holds an open strategy; every released one is closed with nothing pending.
      const live = new Set<EngineDrivenContext>()
      for (const n of IDS) {
        const c = yield* ed.contextOf(makeInstanceId(BigInt(n)))
        if (c === undefined) continue
        assert.isTrue(c.strategy.isOpen(), `context ${n} holds an open strategy`)
        live.add(c)
      }
      for (const c of created) {
        if (live.has(c)) continue
        assert.isFalse(c.strategy.isOpen())
        assert.deepStrictEqual([c.strategy.pendingStores().requests, c.strategy.pendingRetrieves().requests], [0, 0])
      }
      const pendingChunks = [...live].reduce((a, c) => a + c.strategy.pendingStores().chunks, 0)
      assert.strictEqual(l1.stats().reservedObjects, pendingChunks)
      assert.strictEqual(yield* ed.target.trackedInstanceCount(), live.size)

      yield* Effect.forEach(IDS, (n) => ed.unregister(makeInstanceId(BigInt(n))), { discard: true })
      assert.deepStrictEqual([l1.stats().reservedObjects, l1.stats().lockedObjects], [0, 0])
      assert.isUndefined(yield* layouts.get("race", 1))
      for (const c of created) assert.isFalse(c.strategy.isOpen())
      yield* Scope.close(moduleScope, Exit.void)

      const seen = JSON.stringify([...outcomes])
      for (const k of ["register", "prepare_store+commit:true", "prepare_retrieve:true", "prepare_retrieve+commit:true", "reap:true", "fail:NotRegistered"]) {
        assert.isTrue(outcomes.has(k), `${k} happened: ${seen}`)
      }
    }), 60_000)
})
