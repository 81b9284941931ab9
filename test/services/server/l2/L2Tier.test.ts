/**
 * The L2 tier over the in-memory L2Store (issue 15 items 4–6) on TestClock:
 * write-through holds the L1 read lock until the SET ends, joins writes of
 * one key, drops past the in-flight bytes; LOOKUP continues into L2 and its
 * prefetch answers nil while pending, then the count it really got; a
 * corrupt value is a miss and is deleted; timeouts open the breaker, after
 * which L2 is not asked. With `--l2-secret-file` (issue 24 item 14) values
 * are written authenticated, and planted or forged ones are never served.
 */
import { afterAll, assert, describe, it } from "@effect/vitest"
import { mkdtempSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Effect, Exit, Fiber, Layer } from "effect"
import { TestClock } from "effect/testing"
import { NativeMemoryLive } from "../../../../src/layers/NativeMemory.ts"
import type { CacheKey } from "../../../../src/schema/CacheKey.ts"
import { chunkHashes, hashHex } from "../../../../src/services/kv/TokenHasher.ts"
import { KvEvents } from "../../../../src/services/server/kvevents/KvEvents.ts"
import type { KvEventRecord } from "../../../../src/services/server/kvevents/KvEventLog.ts"
import { originOf } from "../../../../src/services/server/kvevents/L1EventSink.ts"
import { L1Store } from "../../../../src/services/server/L1Store.ts"
import { type KvLayout, LayoutRegistry } from "../../../../src/services/server/LayoutRegistry.ts"
import { Lookup, objectKeysOf } from "../../../../src/services/server/Lookup.ts"
import { ServerConfig } from "../../../../src/services/server/ServerConfig.ts"
import { l2Defaults } from "../../../../src/services/server/l2/L2Config.ts"
import { L2Store, makeMemoryL2, type MemoryL2 } from "../../../../src/services/server/l2/L2Store.ts"
import { L2Tier, layerL2Tier } from "../../../../src/services/server/l2/L2Tier.ts"
import { macKeyOf } from "../../../../src/services/server/l2/L2Mac.ts"
import { authenticated, checksummed, HEADER_BYTES, l2KeyOf, layoutFingerprint, MAC_HEADER_BYTES } from "../../../../src/services/server/l2/L2Value.ts"
import { eventually } from "../../../support/Eventually.ts"
import { atEveryStep, type FaultSteps, faultyL1, faultyL2Store, makeFaultSteps } from "../../../support/FaultSteps.ts"

const CHUNK = 4
const BYTES = 64
const layout: KvLayout = { numLayers: 1, hiddenDim: 4, elementBytes: 2, dtype: "float16", chunkBytes: BYTES }
const fp = layoutFingerprint(layout, CHUNK)
const tokens = Array.from({ length: 18 }, (_, i) => 100 + i)
const cacheKey = (over: Partial<CacheKey> = {}): CacheKey => ({
  model_name: "m",
  world_size: 2,
  worker_id: null,
  token_ids: tokens,
  start: 0,
  end: 16,
  request_id: "req-1",
  cache_salt: "",
  ...over
})
const keysOf = (rank: number) => objectKeysOf(cacheKey(), chunkHashes(tokens, CHUNK, 4), rank)
const bytesOf = (chunk: number, rank: number) => Buffer.alloc(BYTES, 16 * chunk + rank + 1)

/** The breaker starts probing (L2Breaker.ts): the clock walks until its first PING has closed it. */
const breakerClosed = Layer.effectDiscard(Effect.gen(function*() {
  const tier = yield* L2Tier
  for (let ms = 0; tier.status()?.state !== "ok"; ms++) {
    if (ms > 10_000) return assert.fail(`the breaker is still ${tier.status()?.state} after 10 s`)
    yield* TestClock.adjust("1 millis")
  }
}))

/** The tier over `memory`; with `faults`, L1's calls and L2's GETs are fault steps (test/support/FaultSteps.ts). */
const envOf = (memory: MemoryL2, l2 = {}, faults?: FaultSteps) =>
  Layer.mergeAll(Lookup.layer, layerL2Tier).pipe(
    Layer.provideMerge(breakerClosed),
    Layer.provideMerge(layerL2Tier),
    Layer.provideMerge(
      faults === undefined ? L2Store.layerTest(memory) : faultyL2Store(faults).pipe(Layer.provide(L2Store.layerTest(memory)))
    ),
    Layer.provideMerge(
      Layer.mergeAll(faults === undefined ? L1Store.layer : faultyL1(faults).pipe(Layer.provide(L1Store.layer)), LayoutRegistry.layer).pipe(
        Layer.provide(NativeMemoryLive)
      )
    ),
    Layer.provideMerge(
      ServerConfig.layerTest({
        chunkSize: CHUNK,
        l1SizeGb: 4096 / 2 ** 30,
        l2: { ...l2Defaults, url: "redis://127.0.0.1:6379", breakerFailures: 3, ...l2 }
      })
    ),
    Layer.provideMerge(KvEvents.layerTest())
  )

/** Commits chunk `chunk` of `rank` to L1 (announcing `origin`) and returns its key. */
const putL1 = (chunk: number, rank: number, origin?: ReturnType<typeof originOf>) =>
  Effect.gen(function*() {
    const l1 = yield* L1Store
    const k = keysOf(rank)[chunk]!
    const r = yield* l1.reserveWrite(k, BYTES, origin)
    if (r._tag !== "Reserved") return assert.fail("expected a reservation")
    r.reservation.bytes.set(bytesOf(chunk, rank))
    yield* l1.commit(r.reservation)
    return k
  })

/** Plants chunk `chunk` of `rank` in the in-memory L2. */
const putL2 = (memory: MemoryL2, chunk: number, rank: number, format = checksummed) => {
  const k = l2KeyOf("mpc", fp, keysOf(rank)[chunk]!)
  memory.values.set(k, format.encode(k, fp, bytesOf(chunk, rank)))
}

/** Chunks 0–2 of both ranks planted in L2, rank 1's chunk 1 with one payload byte flipped; its L2 key. */
const plantWithCorrupt = (memory: MemoryL2) => {
  for (const c of [0, 1, 2]) for (const r of [0, 1]) putL2(memory, c, r)
  const bad = l2KeyOf("mpc", fp, keysOf(1)[1]!)
  const v = Buffer.from(memory.values.get(bad)!)
  v[HEADER_BYTES + 5] = v[HEADER_BYTES + 5]! ^ 0xff
  memory.values.set(bad, v)
  return bad
}

/** The layout registered; chunk 0 of both ranks in L1 and `l2Chunks` of both ranks in L2. */
const seeded = (memory: MemoryL2, l2Chunks: ReadonlyArray<number>) =>
  Effect.gen(function*() {
    yield* (yield* LayoutRegistry).register("m", 2, layout)
    yield* putL1(0, 0)
    yield* putL1(0, 1)
    for (const c of l2Chunks) for (const r of [0, 1]) putL2(memory, c, r)
  })

/** QUERY_PREFETCH_STATUS once the prefetch fiber has run (it is nil until then). */
const prefetched = (requestId: string) =>
  Effect.gen(function*() {
    const lookup = yield* Lookup
    return yield* eventually(`the prefetch of ${requestId}`, lookup.queryPrefetchStatus(requestId).pipe(Effect.map((n) => n ?? undefined)))
  })

describe("write-through", () => {
  it.effect("the L1 object stays read-locked until its SET ends; then the value is in L2, header and bytes", () => {
    const memory = makeMemoryL2()
    memory.delayMs = 100
    return Effect.gen(function*() {
      const l1 = yield* L1Store
      const tier = yield* L2Tier
      const k = yield* putL1(0, 0)
      yield* tier.writeThrough(k, layout)
      assert.strictEqual(l1.stats().lockedObjects, 1)
      assert.deepInclude(tier.status(), { queue_depth: 1, inflight_bytes: HEADER_BYTES + BYTES })
      yield* TestClock.adjust("99 millis")
      assert.strictEqual(l1.stats().lockedObjects, 1)
      yield* TestClock.adjust("1 millis")
      assert.strictEqual(l1.stats().lockedObjects, 0)
      assert.deepInclude(tier.status(), { queue_depth: 0, inflight_bytes: 0, writes: 1 })
      const l2Key = l2KeyOf("mpc", fp, k)
      const stored = memory.values.get(l2Key)
      assert.isTrue(stored !== undefined && Buffer.from(stored).equals(checksummed.encode(l2Key, fp, bytesOf(0, 0))))
      assert.deepInclude(tier.status(), { authenticated: false, unauthenticated_values: 0 })
    }).pipe(Effect.provide(envOf(memory)))
  })

  it.effect("a second write of a key in flight is joined; past --l2-max-inflight-bytes a new write is dropped and counted", () => {
    const memory = makeMemoryL2()
    memory.delayMs = 100
    return Effect.gen(function*() {
      const tier = yield* L2Tier
      const a = yield* putL1(0, 0)
      const b = yield* putL1(1, 0)
      yield* tier.writeThrough(a, layout)
      yield* tier.writeThrough(a, layout)
      yield* tier.writeThrough(b, layout)
      assert.deepInclude(tier.status(), { queue_depth: 1, dropped_writes: 1 })
      yield* TestClock.adjust("100 millis")
      assert.deepStrictEqual(memory.log, ["PING", `SET ${l2KeyOf("mpc", fp, a)}`])
      // Room again: b goes now.
      yield* tier.writeThrough(b, layout)
      yield* TestClock.adjust("100 millis")
      assert.strictEqual(memory.values.size, 2)
    }).pipe(Effect.provide(envOf(memory, { maxInflightBytes: 1.5 * (HEADER_BYTES + BYTES) })))
  })
})

describe("LOOKUP with L2", () => {
  it.effect("the prefix is L1's plus the contiguous L2 hits for every rank; QUERY_PREFETCH_STATUS is nil until the GETs end", () => {
    const memory = makeMemoryL2()
    return Effect.gen(function*() {
      yield* (yield* LayoutRegistry).register("m", 2, layout)
      const lookup = yield* Lookup
      const l1 = yield* L1Store
      yield* putL1(0, 0)
      yield* putL1(0, 1)
      putL2(memory, 1, 0)
      putL2(memory, 1, 1)
      putL2(memory, 2, 0)
      putL2(memory, 2, 1)
      putL2(memory, 3, 0) // rank 1 of chunk 3 is missing: the prefix ends at 3
      memory.delayMs = 10
      const looking = yield* Effect.forkChild(lookup.lookup(cacheKey()))
      yield* TestClock.adjust("10 millis") // the EXISTS step
      yield* Fiber.join(looking)
      assert.strictEqual(yield* lookup.queryPrefetchStatus("req-1"), null)
      yield* TestClock.adjust("10 millis") // the GETs (concurrent)
      assert.strictEqual(yield* prefetched("req-1"), 3)
      // L1 holds chunks 0..2 of both ranks, all read-locked for the RETRIEVE.
      assert.deepInclude(l1.stats(), { objects: 6, lockedObjects: 6 })
      assert.deepInclude(lookup.stats(), { heldLocks: 6 })
      const h = yield* lookup.acquireForRetrieve("req-1", keysOf(1)[2]!)
      assert.isTrue(h !== undefined && h.bytes.equals(bytesOf(2, 1)))
      yield* lookup.endSession("req-1")
      assert.strictEqual(l1.stats().lockedObjects, 1)
    }).pipe(Effect.provide(envOf(memory)))
  })

  it.effect("FREE_LOOKUP_LOCKS while the prefetch runs: the freed chunks arrive unlocked, the count stands", () => {
    const memory = makeMemoryL2()
    return Effect.gen(function*() {
      yield* seeded(memory, [1, 2])
      const lookup = yield* Lookup
      const l1 = yield* L1Store
      yield* lookup.lookup(cacheKey())
      memory.delayMs = 10 // the GETs are in flight when the scheduler frees chunks 2 and 3
      yield* Effect.yieldNow
      yield* lookup.freeLookupLocks(cacheKey({ start: 2 * CHUNK, end: 4 * CHUNK }))
      yield* TestClock.adjust("10 millis")
      assert.strictEqual(yield* prefetched("req-1"), 3)
      assert.deepInclude(l1.stats(), { objects: 6, lockedObjects: 4 })
      assert.deepInclude(lookup.stats(), { heldLocks: 4 })
    }).pipe(Effect.provide(envOf(memory)))
  })

  it.effect("a defect or an interruption at every step of the LOOKUP, its prefetch and each L2 fetch leaves L1 holding nothing (issue 25 item 2)", () => {
    const memory = makeMemoryL2()
    const faults = makeFaultSteps()
    return Effect.gen(function*() {
      yield* seeded(memory, [1, 2])
      const lookup = yield* Lookup
      const l1 = yield* L1Store
      const steps = yield* atEveryStep(faults, {
        setup: Effect.gen(function*() {
          yield* l1.clear(false)
          yield* putL1(0, 0)
          yield* putL1(0, 1)
        }),
        path: Effect.andThen(lookup.lookup(cacheKey()), prefetched("req-1")),
        check: (exit, run) =>
          Effect.gen(function*() {
            // Whatever the session kept goes with it; a prefetch still running finds it gone and keeps nothing.
            yield* lookup.endSession("req-1")
            yield* eventually(
              `L1 holding nothing after a ${run.label}`,
              Effect.sync(() => l1.stats().reservedObjects + l1.stats().lockedObjects === 0 ? true : undefined)
            )
            if (!run.fired) assert.isTrue(Exit.isSuccess(exit) && exit.value === 3, run.label)
          })
      })
      // The L1 prefix (2 locks), then per fetched object: L1 asked first, GET, reserve, fill, commit, lock.
      assert.strictEqual(steps.length, 2 + 4 * 6)
      assert.deepStrictEqual(
        [...new Set(steps)].sort(),
        ["l1.commit", "l1.fill", "l1.lockRead", "l1.reserveWrite", "l2.get"]
      )
    }).pipe(Effect.provide(envOf(memory, {}, faults)))
  })

  it.effect("a repeated LOOKUP of a request id replaces what it held, a prefetch still running included", () => {
    const memory = makeMemoryL2()
    return Effect.gen(function*() {
      yield* seeded(memory, [1, 2])
      const lookup = yield* Lookup
      const l1 = yield* L1Store
      memory.delayMs = 10
      const first = yield* Effect.forkChild(lookup.lookup(cacheKey()))
      yield* TestClock.adjust("10 millis") // its EXISTS; its GETs are now in flight
      yield* Fiber.join(first)
      assert.strictEqual(yield* lookup.queryPrefetchStatus("req-1"), null)
      // Again, for chunks [0, 2) only: L1 holds chunk 0, L2 chunk 1.
      const again = yield* Effect.forkChild(lookup.lookup(cacheKey({ end: 2 * CHUNK })))
      yield* TestClock.adjust("10 millis")
      yield* Fiber.join(again)
      yield* TestClock.adjust("10 millis") // the second prefetch's GETs
      assert.strictEqual(yield* prefetched("req-1"), 2)
      // Only the second LOOKUP's locks: chunks 0 and 1 of both ranks; the first's chunk 2 is not held.
      assert.deepInclude(lookup.stats(), { sessions: 1, heldLocks: 4, pendingJobs: 0 })
      assert.deepInclude(l1.stats(), { lockedObjects: 4, reservedObjects: 0 })
      yield* lookup.endSession("req-1")
      assert.deepInclude(l1.stats(), { lockedObjects: 0, reservedObjects: 0 })
    }).pipe(Effect.provide(envOf(memory)))
  })

  it.effect("a corrupt value shortens the prefix, is deleted and counted; the objects past it are not left locked", () => {
    const memory = makeMemoryL2()
    return Effect.gen(function*() {
      yield* (yield* LayoutRegistry).register("m", 2, layout)
      const lookup = yield* Lookup
      const tier = yield* L2Tier
      const l1 = yield* L1Store
      const bad = plantWithCorrupt(memory)
      yield* lookup.lookup(cacheKey())
      assert.strictEqual(yield* prefetched("req-1"), 1)
      assert.isFalse(memory.values.has(bad))
      assert.strictEqual(tier.status()?.corrupt_values, 1)
      // Chunk 0 of both ranks locked for the session; chunk 1 rank 0 and chunk 2 are in L1, unlocked.
      assert.deepInclude(l1.stats(), { objects: 5, lockedObjects: 2 })
    }).pipe(Effect.provide(envOf(memory)))
  })

  it.effect("EXISTS past the lookup timeout answers L1 only; the 3rd timeout opens the breaker and L2 is no longer asked", () => {
    const memory = makeMemoryL2()
    return Effect.gen(function*() {
      yield* (yield* LayoutRegistry).register("m", 2, layout)
      const lookup = yield* Lookup
      const tier = yield* L2Tier
      yield* putL1(0, 0)
      yield* putL1(0, 1)
      putL2(memory, 1, 0)
      putL2(memory, 1, 1)
      memory.delayMs = 1000
      for (let i = 0; i < 3; i++) {
        const looking = yield* Effect.forkChild(lookup.lookup(cacheKey({ request_id: `r${i}` })))
        yield* TestClock.adjust("49 millis")
        assert.isUndefined(looking.pollUnsafe())
        yield* TestClock.adjust("1 millis")
        yield* Fiber.join(looking)
        assert.strictEqual(yield* lookup.queryPrefetchStatus(`r${i}`), 1)
      }
      assert.strictEqual(tier.status()?.state, "open")
      assert.strictEqual(tier.status()?.last_error, "EXISTS did not answer within 50 ms")
      const asked = memory.log.length
      yield* lookup.lookup(cacheKey({ request_id: "r3" }))
      assert.strictEqual(yield* lookup.queryPrefetchStatus("r3"), 1)
      assert.strictEqual(memory.log.length, asked)
      // Writes are skipped while open.
      yield* tier.writeThrough(keysOf(0)[0]!, layout)
      assert.strictEqual(tier.status()?.dropped_writes, 1)
    }).pipe(Effect.provide(envOf(memory)))
  })
})

describe("with --l2-secret-file (issue 24 item 14)", () => {
  const SECRET = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
  const dir = mkdtempSync(join(tmpdir(), "mpcache-l2-tier-secret-"))
  afterAll(() => rmSync(dir, { recursive: true, force: true }))
  const secretFile = join(dir, "l2.secret")
  writeFileSync(secretFile, `${SECRET}\n`, { mode: 0o600 })
  const fleet = authenticated(macKeyOf(Buffer.from(SECRET)))

  it.effect("the write-through sends an authenticated value (version 2, the MAC under the fleet's key), framed in L1's headroom", () => {
    const memory = makeMemoryL2()
    return Effect.gen(function*() {
      const tier = yield* L2Tier
      const k = yield* putL1(0, 0)
      yield* tier.writeThrough(k, layout)
      assert.deepInclude(tier.status(), { inflight_bytes: MAC_HEADER_BYTES + BYTES, authenticated: true })
      yield* eventually("the write", Effect.sync(() => (tier.status()?.writes === 1 ? true : undefined)))
      const l2Key = l2KeyOf("mpc", fp, k)
      const stored = memory.values.get(l2Key)
      assert.isTrue(stored !== undefined && Buffer.from(stored).equals(fleet.encode(l2Key, fp, bytesOf(0, 0))))
      assert.deepInclude(tier.status(), { writes: 1, inflight_bytes: 0 })
    }).pipe(Effect.provide(envOf(memory, { secretFile })))
  })

  it.effect("a planted checksummed value and a forged one are never served: the prefix stops before them, each deleted and counted by reason", () => {
    const memory = makeMemoryL2()
    return Effect.gen(function*() {
      yield* (yield* LayoutRegistry).register("m", 2, layout)
      const lookup = yield* Lookup
      const tier = yield* L2Tier
      const l1 = yield* L1Store
      for (const c of [0, 1, 2]) for (const r of [0, 1]) putL2(memory, c, r, fleet)
      // Chunk 1 of rank 1: a well-formed checksummed value, what any Redis client can write. Chunk 2 of rank 0: the
      // authenticated format under a key the attacker guessed.
      const planted = l2KeyOf("mpc", fp, keysOf(1)[1]!)
      memory.values.set(planted, checksummed.encode(planted, fp, Buffer.alloc(BYTES, 0x66)))
      const forged = l2KeyOf("mpc", fp, keysOf(0)[2]!)
      memory.values.set(forged, authenticated(macKeyOf(Buffer.alloc(32, 1))).encode(forged, fp, Buffer.alloc(BYTES, 0x66)))
      yield* lookup.lookup(cacheKey())
      assert.strictEqual(yield* prefetched("req-1"), 1)
      assert.isFalse(memory.values.has(planted))
      assert.isFalse(memory.values.has(forged))
      assert.deepInclude(tier.status(), { authenticated: true, unauthenticated_values: 2, corrupt_values: 0 })
      // Chunk 0 of both ranks locked for the session, from L2 byte for byte; nothing of the planted bytes is in L1.
      const h = yield* lookup.acquireForRetrieve("req-1", keysOf(1)[0]!)
      assert.isTrue(h !== undefined && h.bytes.equals(bytesOf(0, 1)))
      assert.isUndefined(l1.lockRead(keysOf(1)[1]!))
      assert.isUndefined(l1.lockRead(keysOf(0)[2]!))
    }).pipe(Effect.provide(envOf(memory, { secretFile })))
  })
})

describe("KV events from L2 (issue 28 item 2)", () => {
  const hashes = chunkHashes(tokens, CHUNK, 4)
  /** The log's records as [seq, kind, medium, chunk indexes, token ids, parent's chunk index]. */
  const records = Effect.gen(function*() {
    const { log } = yield* KvEvents
    const indexOf = (h: Uint8Array | null) => (h === null ? null : hashes.findIndex((x) => hashHex(x) === hashHex(h)))
    return log.read({ cursor: 0, maxEvents: 100, model: "m" }).records.map((r: KvEventRecord) =>
      r.kind === "stored"
        ? [r.seq, r.kind, r.medium, [indexOf(r.chunkHash)], Array.from(r.tokenIds), indexOf(r.parentHash)]
        : [r.seq, r.kind, r.medium, r.chunkHashes.map(indexOf), [], null]
    )
  })

  it.effect("a chunk is announced in STORAGE when its rank 0 write-through ends, with its tokens and parent; rank 1 adds nothing", () => {
    const memory = makeMemoryL2()
    memory.delayMs = 10
    return Effect.gen(function*() {
      const tier = yield* L2Tier
      const origin = originOf(tokens, CHUNK, 1, hashes)
      const k0 = yield* putL1(1, 0, origin)
      const k1 = yield* putL1(1, 1, origin)
      yield* tier.writeThrough(k1, layout, origin)
      yield* tier.writeThrough(k0, layout, origin)
      assert.deepStrictEqual(yield* records, [[1, "stored", "CPU", [1], [104, 105, 106, 107], 0]])
      yield* TestClock.adjust("10 millis")
      assert.strictEqual(tier.status()?.writes, 2)
      assert.deepStrictEqual(yield* records, [
        [1, "stored", "CPU", [1], [104, 105, 106, 107], 0],
        [2, "stored", "STORAGE", [1], [104, 105, 106, 107], 0]
      ])
    }).pipe(Effect.provide(envOf(memory)))
  })

  it.effect("a write that fails announces nothing; a dropped one neither", () => {
    const memory = makeMemoryL2()
    return Effect.gen(function*() {
      const tier = yield* L2Tier
      const origin = originOf(tokens, CHUNK, 0, hashes)
      const k0 = yield* putL1(0, 0, origin)
      memory.down = true
      yield* tier.writeThrough(k0, layout, origin)
      yield* TestClock.adjust("1 millis")
      assert.strictEqual(tier.status()?.failed_writes, 1)
      assert.deepStrictEqual(yield* records, [[1, "stored", "CPU", [0], [100, 101, 102, 103], null]])
    }).pipe(Effect.provide(envOf(memory)))
  })

  it.effect("GET replies that arrive out of order are placed in prompt order: each chunk's CPU record after its parent's", () => {
    const memory = makeMemoryL2()
    return Effect.gen(function*() {
      yield* (yield* LayoutRegistry).register("m", 2, layout)
      const lookup = yield* Lookup
      const l1 = yield* L1Store
      for (const c of [0, 1, 2, 3]) for (const r of [0, 1]) putL2(memory, c, r)
      // Chunk 0's replies come last, chunk 3's first, chunk 1's rank 1 after its rank 0.
      const late = (c: number, r: number, ms: number) => memory.getDelayMs.set(l2KeyOf("mpc", fp, keysOf(r)[c]!), ms)
      late(0, 0, 40), late(0, 1, 40), late(1, 0, 20), late(1, 1, 30), late(2, 0, 10), late(2, 1, 10), late(3, 0, 1), late(3, 1, 1)
      const looking = yield* Effect.forkChild(lookup.lookup(cacheKey()))
      yield* TestClock.adjust("1 millis") // EXISTS; chunk 3's replies are in, held until chunk 2 is placed
      yield* Fiber.join(looking)
      yield* TestClock.adjust("30 millis")
      assert.deepStrictEqual(yield* records, [])
      assert.strictEqual(l1.stats().objects, 0)
      yield* TestClock.adjust("10 millis")
      assert.strictEqual(yield* prefetched("req-1"), 4)
      assert.deepStrictEqual(yield* records, [
        [1, "stored", "CPU", [0], [100, 101, 102, 103], null],
        [2, "stored", "CPU", [1], [104, 105, 106, 107], 0],
        [3, "stored", "CPU", [2], [108, 109, 110, 111], 1],
        [4, "stored", "CPU", [3], [112, 113, 114, 115], 2]
      ])
      assert.deepInclude(l1.stats(), { objects: 8, lockedObjects: 8 })
    }).pipe(Effect.provide(envOf(memory)))
  })

  it.effect("a value found corrupt is removed from STORAGE; the chunks fetched into L1 before it are stored in CPU", () => {
    const memory = makeMemoryL2()
    return Effect.gen(function*() {
      yield* (yield* LayoutRegistry).register("m", 2, layout)
      const lookup = yield* Lookup
      plantWithCorrupt(memory)
      yield* lookup.lookup(cacheKey())
      assert.strictEqual(yield* prefetched("req-1"), 1)
      // The GETs run side by side: the bad value is refused before any good one is placed. Chunk 1 is in CPU
      // (rank 0 fetched) but no longer in STORAGE; chunk 2 went to L1 too (its ranks were fetched alongside).
      assert.deepStrictEqual(yield* records, [
        [1, "removed", "STORAGE", [1], [], null],
        [2, "stored", "CPU", [0], [100, 101, 102, 103], null],
        [3, "stored", "CPU", [1], [104, 105, 106, 107], 0],
        [4, "stored", "CPU", [2], [108, 109, 110, 111], 1]
      ])
    }).pipe(Effect.provide(envOf(memory)))
  })
})
