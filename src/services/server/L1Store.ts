/**
 * The L1 store (DESIGN §4; upstream L1 storage manager): host memory of
 * `--l1-size-gb`, least recently used first out. Its memory is one POSIX
 * shared-memory segment created by the server (the L1 pool; upstream's L1 is
 * a shared segment too), so the engine-driven transfer can hand out slots in
 * it; each object (one chunk of one kv rank, `[2, num_layers, chunk_size,
 * num_heads × head_size]`) is an extent of the pool, and its `bytes` a view.
 * The pool is mapped once and reused, and its pages are prefaulted in the
 * background at start, so copies never pay first-touch faults.
 *
 * - Write reservations (`reserveWrite`) are invisible to lookups and reads
 *   until `commit`; `abort` drops them (a failed copy never publishes).
 * - Read locks (`lockRead`, taken by LOOKUP's prefetch or a RETRIEVE) pin an
 *   object until `unlockRead`.
 * - Headroom (`headroomBytes`, 0 unless L2 is on): each object's extent
 *   starts that many bytes before its `bytes`, so the L2 write-through can
 *   put its value header there and send header + bytes as one view of the
 *   pool, without copying the object (issue 15 item 3; src/services/server/l2/L2Value.ts).
 * - Eviction takes committed, unlocked objects in LRU order and never touches
 *   a locked or reserved one; when nothing more can be evicted the
 *   reservation is refused — capacity is never exceeded. What to evict is
 *   planned before anything goes: a placement that cannot fit even after
 *   evicting (free space fragmented around locked or reserved objects)
 *   evicts nothing.
 * - Requests hold reservations and read locks as scoped handles
 *   (internal/L1Handles.ts, issue 25 item 2): whatever ends a request
 *   releases what it held.
 * - CLEAR force removes locked and reserved objects from the index at once,
 *   but their extents return to the free list only when the last lock is
 *   released or the reservation is committed (refused) or aborted: a copy
 *   thread, a socket write or a worker may still be reading or writing those
 *   bytes, and handing them to another object meanwhile would corrupt it.
 *
 * Every operation is synchronous on the JS thread, so each is atomic with
 * respect to the others without a transaction.
 *
 * The pool belongs to the server (DESIGN §5): it is unlinked at shutdown, and
 * at start a pool left by a crashed run (its process gone) is unlinked.
 */
import { readdirSync, existsSync, statfsSync } from "node:fs"
import { Context, Duration, Effect, Layer, Metric, Option, Schema } from "effect"
import { ServerConfig } from "./ServerConfig.ts"
import { NativeMemory, type NativeError } from "../../native/Native.ts"
import type { InvalidArgument } from "../../schema/WireError.ts"
import { CacheControl } from "./CacheControl.ts"
import { makeExtentAllocator } from "./internal/ExtentAllocator.ts"
import { type GroupShare, type L1Shares, makeL1Shares } from "./internal/L1Shares.ts"
import { KvEvents } from "./kvevents/KvEvents.ts"
import type { L1EventSink, ChunkOrigin } from "./kvevents/L1EventSink.ts"
import { objectKeyString, type ObjectKey } from "./ObjectKey.ts"
import { fromStart } from "../metrics/Series.ts"

interface L1Object {
  readonly key: ObjectKey
  readonly keyString: string
  /** Its salt group, whose L1 share it counts against (internal/L1Shares.ts); "" without shares. */
  readonly owner: string
  /** Byte offset of the object in the pool. */
  readonly offset: number
  readonly bytes: Buffer
  /** The object's whole extent: the headroom, then `bytes`. */
  readonly extent: Buffer
  committed: boolean
  readLocks: number
  /** What its commit announces to the KV event log (its tokens and parent); dropped once committed. */
  origin: ChunkOrigin | undefined
}

/** A reserved, not yet visible object; fill `bytes` (pool bytes at `offset`), then commit or abort. */
export interface Reservation {
  /** The object's key (the L2 write-through of a commit names it). */
  readonly key: ObjectKey
  readonly keyString: string
  readonly offset: number
  readonly bytes: Buffer
  /** What `reserveWrite` was given: the L2 write-through of its commit announces it too (kvevents/L2EventSink.ts). */
  readonly origin: ChunkOrigin | undefined
}

/** A read-locked object; its bytes stay valid until unlocked. */
export interface ReadHandle {
  readonly keyString: string
  /** The object's salt group under tenancy ("" without): what the KV event log files it under. */
  readonly saltGroup: string
  readonly offset: number
  readonly bytes: Buffer
  /**
   * The object's extent: `headroomBytes` bytes the object owns, then `bytes` (the same view as `bytes`
   * without headroom). Only the L2 write-through writes the headroom (its value header); nothing reads it.
   */
  readonly extent: Buffer
}

/** Outcome of reserving one key: reserved, already cached (nothing to write), or no room. */
export type ReserveResult =
  | { readonly _tag: "Reserved"; readonly reservation: Reservation }
  | { readonly _tag: "Exists" }
  | { readonly _tag: "Full" }

/** Sizes and counters, for status and metrics. */
export interface L1Stats {
  readonly capacityBytes: number
  readonly usedBytes: number
  readonly objects: number
  readonly reservedObjects: number
  readonly lockedObjects: number
  readonly evictions: number
  /** With shares (tenancy), each salt group's bytes, weight, share and evictions (issue 27 item 2). */
  readonly groups?: ReadonlyArray<GroupShare>
}

/** The shared-memory segment holding L1 (absent for an in-process test store). */
export interface L1Pool {
  readonly shmName: string
  readonly sizeBytes: number
  /** Bytes of the pool prefaulted so far by the background prefault (`sizeBytes` once done; 0 with `--no-l1-prefault`). */
  readonly prefaultedBytes: () => number
}

/** The L1 pool cannot be created (no room in /dev/shm, …). */
export class L1PoolError extends Schema.TaggedError<L1PoolError>()("L1PoolError", { message: Schema.String }) {}

const usedBytesGauge = fromStart(Metric.gauge("mpcache_l1_used_bytes", { description: "Bytes held by L1 objects (committed and reserved)" }))
const evictionsTotal = fromStart(Metric.counter("mpcache_l1_evictions_total", { description: "L1 objects evicted (LRU)", incremental: true }))
// With tenancy (issue 27 item 2), by salt group (label `tenant`: the group, a tenant's own name unless it shares one).
const tenantBytesGauge = Metric.gauge("mpcache_l1_tenant_bytes", { description: "Bytes held in L1 by each salt group's objects (committed and reserved)" })
const tenantShareGauge = Metric.gauge("mpcache_l1_tenant_share_bytes", {
  description: "Each salt group's L1 share now: the capacity times its weight over the weights of the groups holding L1"
})
const tenantEvictionsTotal = Metric.counter("mpcache_l1_tenant_evictions_total", { description: "L1 objects evicted, by salt group", incremental: true })

/** Bytes prefaulted per background step (each step is one job on the libuv pool). */
const PREFAULT_STEP_BYTES = 64 * 2 ** 20

/**
 * The weight of a salt group in L1 (issue 27 item 2: tenants share L1 by weight, internal/L1Shares.ts); the server
 * assembly sets it from `Tenancy.l1WeightOf` when CURVE is on. Default: none, one LRU for every object.
 */
export const L1ShareWeights = Context.Reference<((group: string) => number) | undefined>("mpcache/services/server/L1ShareWeights", {
  defaultValue: () => undefined
})

/** The L1 store. */
export class L1Store extends Context.Service<L1Store, {
  /**
   * Reserves a `sizeBytes` object for `key` (mode "new": an existing key is not rewritten). `origin`, the
   * chunk's tokens and parent, is what its commit announces in the KV event log (issue 28 item 2).
   */
  readonly reserveWrite: (key: ObjectKey, sizeBytes: number, origin?: ChunkOrigin) => Effect.Effect<ReserveResult>
  /** Makes a reservation visible. False when it was dropped meanwhile (CLEAR force). */
  readonly commit: (reservation: Reservation) => Effect.Effect<boolean>
  /**
   * Copies `bytes` (exactly the reservation's size) into a pending reservation: on the libuv pool
   * when L1 is the shared pool (the JS thread goes on reading sockets meanwhile), in place otherwise.
   * A reservation dropped meanwhile by CLEAR force keeps its extent until committed or aborted
   * (above), so the copy never lands in another object. Dies on a size mismatch (a caller's bug).
   */
  readonly fill: (reservation: Reservation, bytes: Uint8Array) => Effect.Effect<void>
  /** Drops a reservation (a failed or abandoned write). */
  readonly abort: (reservation: Reservation) => Effect.Effect<void>
  /**
   * Whether `reservation` is still pending (not committed, aborted, or dropped
   * by CLEAR force), i.e. its bytes are still its own to write. Check it in
   * the same synchronous step as a write made long after the reservation.
   */
  readonly isPending: (reservation: Reservation) => boolean
  /** Whether `key` is committed. */
  readonly contains: (key: ObjectKey) => boolean
  /** Calls `f` with each committed object's key and salt group, in no particular order (the admin L1 listing). */
  readonly forEachCommitted: (f: (key: ObjectKey, saltGroup: string) => void) => void
  /** The salt group an object of `cacheSalt` belongs to ("" without tenancy shares; internal/L1Shares.ts). */
  readonly saltGroupOf: (cacheSalt: string) => string
  /** Read-locks a committed object and marks it used; undefined when absent or not committed. */
  readonly lockRead: (key: ObjectKey) => ReadHandle | undefined
  /** Releases one read lock. */
  readonly unlockRead: (handle: ReadHandle) => void
  /** Marks keys most recently used (END_SESSION). */
  readonly touch: (keys: ReadonlyArray<ObjectKey>) => void
  /** Drops committed, unlocked objects (force: also locked and reserved ones). Returns how many. */
  readonly clear: (force: boolean) => Effect.Effect<number>
  readonly stats: () => L1Stats
  /** The shared pool, when L1 lives in one. */
  readonly pool: L1Pool | undefined
}>()("mpcache/services/L1Store") {
  /**
   * An in-process L1 of `capacityBytes` over a plain Buffer, with `headroomBytes` before each object (unit tests);
   * with `shareWeightOf`, shared between salt groups by those weights (internal/L1Shares.ts, issue 27 item 2).
   */
  static readonly make = (
    capacityBytes: number,
    headroomBytes = 0,
    shareWeightOf?: (group: string) => number,
    events?: L1EventSink
  ) =>
    Effect.sync(() =>
      makeL1(
        Buffer.allocUnsafeSlow(capacityBytes),
        undefined,
        headroomBytes,
        fillInPlace,
        shareWeightOf === undefined ? undefined : makeL1Shares(capacityBytes, shareWeightOf),
        events
      )
    )
  /**
   * The server's L1: a shared-memory pool of `--l1-size-gb` GiB, mapped for
   * the life of the layer; with tenancy (CURVE on), shared between salt groups
   * by the weights `Tenancy` gives. Fails with L1PoolError when /dev/shm
   * cannot hold it, or the segment cannot be created or mapped.
   */
  static readonly layer = Layer.effect(this, Effect.suspend(() => makePooled))
  /**
   * For tests: an in-process L1 of `capacityBytes` over a plain Buffer (`make`), with `headroomBytes`
   * before each object; needs nothing else (no /dev/shm pool, no addon). Default 1 MiB, no headroom.
   */
  static readonly layerTest = (capacityBytes = 2 ** 20, headroomBytes = 0) =>
    Layer.effect(this, this.make(capacityBytes, headroomBytes))
  /** CLEAR acts on this L1. */
  static readonly layerCacheControl = Layer.effect(
    CacheControl,
    Effect.gen(function*() {
      const l1 = yield* L1Store
      return { clear: l1.clear }
    })
  )
}

const fnv = (s: string): string => {
  let h = 2166136261
  for (let i = 0; i < s.length; i++) h = Math.imul(h ^ s.charCodeAt(i), 16777619)
  return (h >>> 0).toString(16).padStart(8, "0")
}

/**
 * Unlinks L1 pools left by crashed servers: `mpcache-l1-<endpoint hash>-<pid>` whose process is gone
 * (this endpoint's first, then any other's — a crashed server's pool is nobody's, and tmpfs pages are RAM).
 */
const cleanStalePools = (unlink: (name: string) => Effect.Effect<void, NativeError>) =>
  Effect.gen(function*() {
    let names: Array<string> = []
    try {
      names = readdirSync("/dev/shm").filter((n) => n.startsWith(POOL_PREFIX))
    } catch {
      return
    }
    for (const name of names) {
      const pid = Number(name.slice(name.lastIndexOf("-") + 1))
      if (Number.isInteger(pid) && pid > 0 && pid !== process.pid && !existsSync(`/proc/${pid}`)) {
        yield* unlink(name).pipe(
          Effect.andThen(Effect.logWarning(`removed the L1 pool ${name} left by a crashed server (pid ${pid})`)),
          Effect.ignore
        )
      }
    }
  })

const POOL_PREFIX = "mpcache-l1-"

/** A native failure with its errno first (ENOSPC, ENOMEM, EACCES …), then the addon's words. */
const errnoText = (e: InvalidArgument | NativeError): string =>
  e._tag === "NativeError" && e.errno !== "" ? `${e.errno} (${e.call}): ${e.message}` : e.message

const makePooled = Effect.gen(function*() {
  const config = yield* ServerConfig
  const native = yield* NativeMemory
  // With tenancy, L1 is shared between salt groups by weight (issue 27 item 2); without, one LRU.
  const l1WeightOf = yield* L1ShareWeights
  // What L1 commits and drops reaches the KV event log, when the server has one on (issue 28).
  const events = Option.getOrUndefined(yield* Effect.serviceOption(KvEvents))?.l1
  const capacityBytes = Math.floor(config.l1SizeGb * 2 ** 30)
  const shmName = `${POOL_PREFIX}${fnv(config.endpoint)}-${process.pid}`
  // What every failure names: the segment, its size and the flag that sets it.
  const poolText = `L1 pool /dev/shm/${shmName} of ${capacityBytes} bytes (--l1-size-gb ${config.l1SizeGb})`
  yield* cleanStalePools(native.unlinkSegment)
  const freeBytes = yield* Effect.try({
    try: () => {
      const s = statfsSync("/dev/shm")
      return s.bavail * s.bsize
    },
    catch: () => new L1PoolError({ message: "cannot read the free space of /dev/shm" })
  })
  if (freeBytes < capacityBytes) {
    return yield* new L1PoolError({
      message: `--l1-size-gb ${config.l1SizeGb}: the L1 pool needs ${capacityBytes} bytes of /dev/shm but only ${freeBytes} are free; lower --l1-size-gb or enlarge /dev/shm`
    })
  }
  yield* Effect.acquireRelease(
    native.createSegment(shmName, capacityBytes),
    () => Effect.ignore(native.unlinkSegment(shmName))
  ).pipe(Effect.mapError((e) => new L1PoolError({ message: `${poolText}: cannot create it: ${errnoText(e)}` })))
  // The server's own memory: not counted against the bounds on worker memory (MappingBudget).
  const mapping = yield* native.map(shmName, capacityBytes, { owned: true }).pipe(
    Effect.mapError((e: InvalidArgument | NativeError) => new L1PoolError({ message: `${poolText}: cannot map it: ${errnoText(e)}` }))
  )
  const view = yield* native.view(mapping).pipe(Effect.mapError((e) => new L1PoolError({ message: e.message })))
  let prefaultedBytes = 0
  if (config.l1Prefault) {
    const started = Date.now()
    yield* Effect.gen(function*() {
      for (let off = 0; off < capacityBytes; off += PREFAULT_STEP_BYTES) {
        const length = Math.min(PREFAULT_STEP_BYTES, capacityBytes - off)
        yield* native.prefault(mapping, off, length, { touch: true })
        prefaultedBytes += length
      }
      yield* Effect.logInfo(`L1 pool ${shmName}: ${capacityBytes} bytes prefaulted in ${Duration.format(Duration.millis(Date.now() - started))}`)
    }).pipe(Effect.catch((e) => Effect.logWarning(`L1 prefault stopped: ${e.message}`)), Effect.forkScoped)
  }
  yield* Effect.logInfo(`L1 pool ${shmName}: ${capacityBytes} bytes in /dev/shm`)
  // A failed copy into the server's own mapping (closed: the server is stopping) is a defect here.
  const fillOnPool = (r: Reservation, bytes: Uint8Array) =>
    native.scatter(mapping, Float64Array.of(r.offset, 0, bytes.length), bytes).pipe(Effect.orDie)
  return makeL1(
    Buffer.from(view, 0, capacityBytes),
    { shmName, sizeBytes: capacityBytes, prefaultedBytes: () => prefaultedBytes },
    config.l2 === undefined ? 0 : L2_HEADROOM_BYTES,
    fillOnPool,
    l1WeightOf === undefined ? undefined : makeL1Shares(capacityBytes, l1WeightOf),
    events
  )
})

const fillInPlace = (r: Reservation, bytes: Uint8Array) => Effect.sync(() => r.bytes.set(bytes))

/**
 * Headroom before each object when L2 is on: the L2 value header (32 bytes) rounded up to 64, so every
 * object's bytes stay on the 64-byte boundaries the copy threads get today.
 */
export const L2_HEADROOM_BYTES = 64

const makeL1 = (
  memory: Buffer,
  pool: L1Pool | undefined,
  headroomBytes: number,
  copyInto: (r: Reservation, bytes: Uint8Array) => Effect.Effect<void>,
  shares?: L1Shares,
  events?: L1EventSink
): L1Store["Service"] => {
  const capacityBytes = memory.length
  const extents = makeExtentAllocator(capacityBytes)
  // Map iteration order is insertion order: re-inserting on use keeps it LRU-first.
  const objects = new Map<string, L1Object>()
  // Objects CLEAR force dropped while locked or reserved, by offset: their extents wait for the last
  // unlock, or for the reservation's commit or abort.
  const cleared = new Map<number, L1Object>()
  let usedBytes = 0
  let evictions = 0

  /** The used-bytes gauge and, with shares, each group's bytes, share and new evictions. */
  const updateGauges: Effect.Effect<void> = Effect.suspend(() => {
    const used = Metric.update(usedBytesGauge, usedBytes)
    if (shares === undefined) return used
    const evicted = shares.takeEvictions()
    return used.pipe(
      Effect.andThen(Effect.forEach(shares.groups(), (g) => {
        const tenant = { tenant: g.group }
        return Metric.update(Metric.withAttributes(tenantBytesGauge, tenant), g.bytes).pipe(
          Effect.andThen(Metric.update(Metric.withAttributes(tenantShareGauge, tenant), Math.round(g.shareBytes))),
          Effect.andThen(Metric.update(Metric.withAttributes(tenantEvictionsTotal, tenant), evicted.get(g.group) ?? 0))
        )
      }, { discard: true }))
    )
  })

  /** An object as the KV event log names it: its key and salt group. */
  const announced = (o: L1Object) => ({ key: o.key, saltGroup: o.owner })

  const markUsed = (o: L1Object) => {
    objects.delete(o.keyString)
    objects.set(o.keyString, o)
  }

  const releaseExtent = (o: L1Object, evicted = false) => {
    extents.release(o.offset - headroomBytes, o.extent.length)
    usedBytes -= o.extent.length
    shares?.removed(o.owner, o.extent.length, evicted)
  }

  const drop = (o: L1Object, evicted = false) => {
    objects.delete(o.keyString)
    releaseExtent(o, evicted)
  }

  const owns = (o: L1Object | undefined, ref: { readonly offset: number; readonly bytes: Buffer }): o is L1Object =>
    o !== undefined && o.offset === ref.offset && o.bytes.length === ref.bytes.length

  /** The force-cleared object `ref` names, when its extent still waits. */
  const clearedOf = (ref: { readonly offset: number; readonly bytes: Buffer }): L1Object | undefined => {
    const o = cleared.get(ref.offset)
    return owns(o, ref) ? o : undefined
  }
  const releaseCleared = (o: L1Object) => {
    cleared.delete(o.offset)
    releaseExtent(o)
  }

  /**
   * An extent of `needed` bytes, evicting LRU committed unlocked objects as needed; undefined when impossible.
   * What to evict is planned first (issue 25 item 2): the shortest run of evictable objects, LRU first, whose
   * extents and the free ones leave a contiguous extent of `needed`. When even all of them would not (free bytes
   * enough, but fragmented around locked or reserved objects), nothing is evicted.
   */
  /** An object's extent as the allocator sees it (its headroom, then its bytes). */
  const extentOf = (o: L1Object) => ({ offset: o.offset - headroomBytes, length: o.extent.length })

  const place = (needed: number, owner: string): number | undefined => {
    const direct = extents.allocate(needed)
    if (direct !== undefined) return direct
    const lru: Array<L1Object> = []
    // forEach, not for…of: this runs for every placement once L1 is full, and an iterator allocates per step.
    objects.forEach((o) => {
      if (o.committed && o.readLocks === 0) lru.push(o)
    })
    // With shares, the order the rule takes them in (first as many as free `needed`; all of them only when the free
    // space is too fragmented for that); without, least recently used first.
    let evictable = shares === undefined ? lru : shares.evictionOrder(lru, owner, needed, needed)
    if (shares !== undefined && !extents.wouldFit(needed, evictable.map(extentOf))) {
      evictable = shares.evictionOrder(lru, owner, needed, Number.POSITIVE_INFINITY)
    }
    let evictableBytes = 0
    for (const o of evictable) evictableBytes += o.extent.length
    if (extents.freeBytes() + evictableBytes < needed) return undefined
    const extentsOf = (n: number) => evictable.slice(0, n).map(extentOf)
    // Usually the first few LRU objects make room (objects of one size): try them one by one, then search.
    let count = 0
    const quick = Math.min(evictable.length, 4)
    for (let n = 1; n <= quick && count === 0; n++) if (extents.wouldFit(needed, extentsOf(n))) count = n
    if (count === 0) {
      if (!extents.wouldFit(needed, extentsOf(evictable.length))) return undefined
      // Fitting is monotone in how many are evicted: the smallest count that fits, by bisection.
      let lo = quick + 1
      let hi = evictable.length
      while (lo < hi) {
        const mid = (lo + hi) >>> 1
        if (extents.wouldFit(needed, extentsOf(mid))) hi = mid
        else lo = mid + 1
      }
      count = lo
    }
    for (let n = 0; n < count; n++) drop(evictable[n]!, true)
    evictions += count
    if (events !== undefined && count > 0) events.removed(evictable.slice(0, count).map(announced))
    return extents.allocate(needed)
  }

  const reserveWrite = (key: ObjectKey, sizeBytes: number, origin?: ChunkOrigin) =>
    Effect.suspend(() => {
      const keyString = objectKeyString(key)
      if (objects.has(keyString)) return Effect.succeed<ReserveResult>({ _tag: "Exists" })
      const before = evictions
      const extentBytes = headroomBytes + sizeBytes
      const owner = shares?.ownerOf(key.cacheSalt) ?? ""
      const start = extentBytes > capacityBytes ? undefined : place(extentBytes, owner)
      if (start === undefined) return Effect.succeed<ReserveResult>({ _tag: "Full" })
      const offset = start + headroomBytes
      shares?.added(owner, extentBytes)
      const o: L1Object = {
        key,
        keyString,
        owner,
        offset,
        bytes: memory.subarray(offset, offset + sizeBytes),
        extent: memory.subarray(start, offset + sizeBytes),
        committed: false,
        readLocks: 0,
        origin: events === undefined ? undefined : origin
      }
      objects.set(keyString, o)
      usedBytes += extentBytes
      return updateGauges.pipe(
        Effect.andThen(evictions > before ? Metric.update(evictionsTotal, evictions - before) : Effect.void),
        Effect.as<ReserveResult>({ _tag: "Reserved", reservation: { key, keyString, offset, bytes: o.bytes, origin } })
      )
    })

  const commit = (r: Reservation) =>
    Effect.suspend(() => {
      const o = objects.get(r.keyString)
      if (owns(o, r)) {
        if (o.committed) return Effect.succeed(false)
        o.committed = true
        markUsed(o)
        events?.committed(o.key, o.owner, o.origin)
        o.origin = undefined
        return Effect.succeed(true)
      }
      // Dropped by CLEAR force while being written: refused, and its extent is free from now on.
      const c = clearedOf(r)
      if (c === undefined || c.committed) return Effect.succeed(false)
      releaseCleared(c)
      return updateGauges.pipe(Effect.as(false))
    })

  const abort = (r: Reservation) =>
    Effect.suspend(() => {
      const o = objects.get(r.keyString)
      if (owns(o, r)) {
        if (!o.committed) drop(o)
      } else {
        const c = clearedOf(r)
        if (c !== undefined && !c.committed) releaseCleared(c)
      }
      return updateGauges
    })

  const lockRead = (key: ObjectKey): ReadHandle | undefined => {
    const o = objects.get(objectKeyString(key))
    if (o === undefined || !o.committed) return undefined
    o.readLocks++
    markUsed(o)
    return { keyString: o.keyString, saltGroup: o.owner, offset: o.offset, bytes: o.bytes, extent: o.extent }
  }

  // Synchronous (its callers are): a released extent shows in the used-bytes gauge at the next update.
  const unlockRead = (h: ReadHandle) => {
    const o = objects.get(h.keyString)
    if (owns(o, h)) {
      if (o.readLocks > 0) o.readLocks--
      return
    }
    const c = clearedOf(h)
    if (c === undefined || !c.committed || c.readLocks === 0) return
    c.readLocks--
    if (c.readLocks === 0) releaseCleared(c)
  }

  const clear = (force: boolean) =>
    Effect.suspend(() => {
      let dropped = 0
      // The committed objects that leave: the KV event log hears of them once, together.
      const gone: Array<L1Object> = []
      // As in `place`: deleting the entry just visited leaves the iteration intact.
      for (const o of objects.values()) {
        if (o.committed && o.readLocks === 0) drop(o)
        else if (force) {
          objects.delete(o.keyString)
          cleared.set(o.offset, o)
        } else continue
        if (o.committed) gone.push(o)
        dropped++
      }
      if (events !== undefined && gone.length > 0) events.removed(gone.map(announced))
      return updateGauges.pipe(Effect.as(dropped))
    })

  const fill = (r: Reservation, bytes: Uint8Array) =>
    bytes.length === r.bytes.length
      ? copyInto(r, bytes)
      : Effect.die(new RangeError(`L1 fill: ${bytes.length} bytes for a reservation of ${r.bytes.length}`))

  return {
    reserveWrite,
    commit,
    fill,
    abort,
    isPending: (r) => {
      const o = objects.get(r.keyString)
      return owns(o, r) && !o.committed
    },
    contains: (key) => objects.get(objectKeyString(key))?.committed === true,
    saltGroupOf: (cacheSalt) => shares?.ownerOf(cacheSalt) ?? "",
    forEachCommitted: (f) => {
      for (const o of objects.values()) if (o.committed) f(o.key, o.owner)
    },
    lockRead,
    unlockRead,
    touch: (keys) => {
      for (const k of keys) {
        const o = objects.get(objectKeyString(k))
        if (o !== undefined && o.committed) markUsed(o)
      }
    },
    clear,
    stats: () => {
      let reserved = 0
      let locked = 0
      for (const o of objects.values()) {
        if (!o.committed) reserved++
        if (o.readLocks > 0) locked++
      }
      return {
        capacityBytes,
        usedBytes,
        objects: objects.size,
        reservedObjects: reserved,
        lockedObjects: locked,
        evictions,
        ...(shares === undefined ? {} : { groups: shares.groups() })
      }
    },
    pool
  }
}
