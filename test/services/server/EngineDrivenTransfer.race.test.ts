/**
 * A randomized race on the engine-driven module (DESIGN §4: the pair
 * (context entry, transfer strategy) is inserted and removed atomically):
 * many fibers registering, preparing, committing, unregistering and reaping
 * the same few ids at once. Afterwards no registered context lacks its
 * strategy or holds a closed one, every released context's strategy is
 * closed with nothing pending, L1 holds exactly the reservations of the
 * live strategies, no operation died, and once everything is unregistered
 * no reservation, read lock or layout reference is left.
 *
 * Then the PREPARE-expiry race (issue 18), on TestClock with a seeded Random
 * so that a failing seed replays the same interleaving: a 5 ms prepare TTL,
 * commits landing before and after it, unregisters and reaps at random, and
 * a driver fiber moving the clock. Afterwards no COMMIT published later than
 * the TTL allows, every reservation was finished (committed or aborted) and
 * every read lock released exactly once, and once the TTL has passed nothing
 * is pending, reserved or locked.
 */
import { assert, describe, it } from "@effect/vitest"
import { Clock, Context, Effect, Exit, Layer, Random, Scope } from "effect"
import { TestClock } from "effect/testing"
import { NativeMemoryLive } from "../../../src/layers/NativeMemory.ts"
import { ServerConfig } from "../../../src/services/server/ServerConfig.ts"
import type { CacheKey } from "../../../src/schema/CacheKey.ts"
import { makeInstanceId } from "../../../src/schema/InstanceId.ts"
import { type EngineDrivenContext, EngineDrivenTransfer } from "../../../src/services/server/EngineDrivenTransfer.ts"
import { L1Store, type ReadHandle, type Reservation } from "../../../src/services/server/L1Store.ts"
import { LayoutRegistry } from "../../../src/services/server/LayoutRegistry.ts"
import { Lookup } from "../../../src/services/server/Lookup.ts"
import { makeOutcomes, runClockedRace } from "../../support/Race.ts"

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

/** The one layout every instance of the races registers. */
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

/** REGISTER of instance `n`, remembering the context it then holds (to judge released ones afterwards). */
const registerRemembering = (ed: EngineDrivenTransfer["Service"], created: Set<EngineDrivenContext>, n: number) =>
  ed.register(registration(n)).pipe(
    Effect.andThen(ed.contextOf(makeInstanceId(BigInt(n)))),
    Effect.map((c) => {
      if (c !== undefined) created.add(c)
      return "register"
    })
  )

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
      const { outcomes, record } = makeOutcomes("")

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
            ? registerRemembering(ed, created, n)
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
        record(exit)
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

/** Seeds of the expiry race; a failure names its seed, and that seed replays it. */
const SEEDS = ["expiry-1", "expiry-2", "expiry-3", "expiry-4"]
const TTL_MS = 5

/**
 * L1 with a count of how often each reservation was finished (commit or
 * abort) and each read lock released, to catch a double release, and when
 * each reservation was committed.
 */
const probedL1 = (finished: Map<Reservation, Array<string>>, released: Map<ReadHandle, number>) =>
  Layer.effect(
    L1Store,
    Effect.gen(function*() {
      const l1 = yield* L1Store
      const finish = (r: Reservation, how: string) => finished.set(r, [...(finished.get(r) ?? []), how])
      return {
        ...l1,
        reserveWrite: (key, size) =>
          Effect.tap(l1.reserveWrite(key, size), (r) =>
            Effect.sync(() => {
              if (r._tag === "Reserved") finished.set(r.reservation, [])
            })),
        commit: (r) => Effect.tap(l1.commit(r), () => Effect.sync(() => finish(r, "commit"))),
        abort: (r) => Effect.tap(l1.abort(r), () => Effect.sync(() => finish(r, "abort"))),
        lockRead: (key) => {
          const h = l1.lockRead(key)
          if (h !== undefined) released.set(h, 0)
          return h
        },
        unlockRead: (h) => {
          released.set(h, (released.get(h) ?? 0) + 1)
          l1.unlockRead(h)
        }
      } satisfies L1Store["Service"]
    })
  ).pipe(Layer.provideMerge(L1Store.layer))

describe("engine-driven PREPARE-expiry race (issue 18)", () => {
  for (const seed of SEEDS) {
    it.effect(`seed ${seed}: PREPARE expiry racing COMMIT, unregister and reap: never a publish after the TTL, every reservation and lock released once, nothing left`, () =>
      Effect.gen(function*() {
        const finished = new Map<Reservation, Array<string>>()
        const released = new Map<ReadHandle, number>()
        const moduleScope = yield* Scope.make()
        // A failed run still closes the module (the L1 pool's name is per endpoint and process).
        yield* Effect.addFinalizer(() => Scope.close(moduleScope, Exit.void))
        const ctx = yield* Layer.buildWithScope(
          EngineDrivenTransfer.layer.pipe(
            Layer.provideMerge(Lookup.layer),
            Layer.provideMerge(Layer.mergeAll(probedL1(finished, released), LayoutRegistry.layer).pipe(Layer.provideMerge(NativeMemoryLive))),
            Layer.provideMerge(
              ServerConfig.layerTest({ chunkSize: CHUNK, l1SizeGb: (64 * CHUNK_BYTES) / 2 ** 30, prepareTtlSeconds: TTL_MS / 1000 })
            )
          ),
          moduleScope
        )
        const ed = Context.get(ctx, EngineDrivenTransfer)
        const l1 = Context.get(ctx, L1Store)
        const created = new Set<EngineDrivenContext>()
        const { outcomes, record, seen } = makeOutcomes(`seed ${seed}: `)
        const late: Array<string> = []
        const now = Clock.currentTimeMillis
        let requests = 0

        const op = Effect.gen(function*() {
          const n = IDS[yield* Random.nextIntBetween(0, IDS.length - 1)]!
          const id = makeInstanceId(BigInt(n))
          // Every transfer is its own request (its own pending key), so that a COMMIT's answer is about its own
          // PREPARE; the tokens still overlap, so reservations and locks of different requests meet.
          const r = yield* Random.nextIntBetween(0, 11)
          const k = { ...key(r), request_id: `r${r}-${++requests}` }
          const which = [0, 0, 0, 1, 1, 1, 1, 1, 2, 2, 2, 3, 4][yield* Random.nextIntBetween(0, 12)]!
          // Around the TTL: some commits in time, some at it, some late.
          const wait = yield* Random.nextIntBetween(0, 2 * TTL_MS)
          const abort = (yield* Random.nextIntBetween(0, 5)) === 0
          yield* Effect.sleep(`${yield* Random.nextIntBetween(0, 2)} millis`)
          const exit = yield* Effect.exit(
            which === 0
              ? registerRemembering(ed, created, n)
              : which === 1
              ? Effect.gen(function*() {
                const prepared = yield* ed.prepareStore(k, id)
                const at = yield* now
                yield* Effect.sleep(`${wait} millis`)
                const commitAt = yield* now
                const ok = yield* ed.commitStore(k, id, new Uint8Array(abort ? 1 : 0))
                if (ok && (abort || commitAt - at > TTL_MS)) late.push(`${k.request_id} of ${n}: prepared at ${at}, committed ${ok} at ${commitAt}`)
                return `prepare_store+${abort ? "abort" : "commit"}:${prepared.context.slots.length > 0 ? ok : "nothing"}`
              })
              : which === 2
              ? Effect.gen(function*() {
                const prepared = yield* ed.prepareRetrieve(k, id)
                const at = yield* now
                yield* Effect.sleep(`${wait} millis`)
                const commitAt = yield* now
                const ok = yield* ed.commitRetrieve(k, id)
                if (ok && prepared.success && commitAt - at > TTL_MS) late.push(`retrieve ${k.request_id} of ${n}: prepared at ${at}, committed at ${commitAt}`)
                return `prepare_retrieve+commit:${prepared.success ? ok : "miss"}`
              })
              : which === 3
              ? ed.unregister(id).pipe(Effect.as("unregister"))
              : Effect.flatMap(now, (nowMs) =>
                ed.target.reapStaleInstances({
                  nowMs: nowMs + 1_000_000,
                  reapTimeoutMs: 1,
                  registrationGraceMs: 1,
                  suspects: new Map(),
                  disconnectGraceMs: 0
                })).pipe(Effect.map((r) => `reap:${r.length > 0}`))
          )
          record(exit)
        })

        yield* runClockedRace(op, { fibers: FIBERS, opsPerFiber: OPS_PER_FIBER, seed })
        assert.deepStrictEqual(late, [], `seed ${seed}: no COMMIT published after the TTL or after an abort: ${JSON.stringify(late)}`)
        // Past the TTL nothing is pending anywhere, live contexts included.
        yield* TestClock.adjust(`${TTL_MS + 1} millis`)
        const live = new Set<EngineDrivenContext>()
        for (const n of IDS) {
          const c = yield* ed.contextOf(makeInstanceId(BigInt(n)))
          if (c === undefined) continue
          assert.isTrue(c.strategy.isOpen(), `seed ${seed}: context ${n} holds an open strategy`)
          live.add(c)
        }
        for (const c of created) {
          assert.deepStrictEqual([c.strategy.pendingStores().requests, c.strategy.pendingRetrieves().requests], [0, 0], seen())
        }
        const block = (yield* ed.status())["engine_driven"] as { pending_stores: number; pending_retrieves: number }
        assert.deepStrictEqual([block.pending_stores, block.pending_retrieves, l1.stats().reservedObjects, l1.stats().lockedObjects], [0, 0, 0, 0], seen())
        // Every reservation was finished exactly once, every read lock released exactly once.
        const twice = [...finished.values()].filter((how) => how.length !== 1).map((how) => how.join("+") || "never")
        assert.deepStrictEqual(twice, [], seen())
        assert.deepStrictEqual([...released.values()].filter((c) => c !== 1), [], seen())
        const expired = [...created].reduce((a, c) => a + c.strategy.expired().stores + c.strategy.expired().retrieves, 0)

        yield* Effect.forEach(IDS, (n) => ed.unregister(makeInstanceId(BigInt(n))), { discard: true })
        yield* Scope.close(moduleScope, Exit.void)
        assert.isTrue(expired > 0, `some PREPARE expired: ${seen()}`)
        for (const k of ["register", "prepare_store+commit:true", "prepare_store+commit:false", "prepare_store+abort:false", "prepare_retrieve+commit:true", "prepare_retrieve+commit:false", "reap:true", "unregister", "fail:NotRegistered"]) {
          assert.isTrue(outcomes.has(k), `${k} happened: ${seen()}`)
        }
      }), 60_000)
  }
})
