/**
 * The L1 store (DESIGN §4; upstream L1 storage manager): host memory of
 * `--l1-size-gb`, one Buffer per object (one chunk of one kv rank, laid out
 * `[2, num_layers, chunk_size, num_heads × head_size]`), least recently used
 * first out.
 *
 * - Write reservations (`reserveWrite`) are invisible to lookups and reads
 *   until `commit`; `abort` drops them (a failed copy never publishes).
 * - Read locks (`lockRead`, taken by LOOKUP's prefetch or a RETRIEVE) pin an
 *   object until `unlockRead`.
 * - Eviction takes committed, unlocked objects in LRU order and never touches
 *   a locked or reserved one; when nothing more can be evicted the
 *   reservation is refused — capacity is never exceeded.
 *
 * Every operation is synchronous on the JS thread, so each is atomic with
 * respect to the others without a transaction.
 */
import { Context, Effect, Layer, Metric } from "effect"
import { ServerConfig } from "../layers/ServerConfig.ts"
import { CacheControl } from "./CacheControl.ts"
import { objectKeyString, type ObjectKey } from "./ObjectKey.ts"

interface L1Object {
  readonly key: ObjectKey
  readonly keyString: string
  readonly bytes: Buffer
  committed: boolean
  readLocks: number
}

/** A reserved, not yet visible object; fill `bytes`, then commit or abort. */
export interface Reservation {
  readonly keyString: string
  readonly bytes: Buffer
}

/** A read-locked object; its bytes stay valid until unlocked. */
export interface ReadHandle {
  readonly keyString: string
  readonly bytes: Buffer
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
}

const usedBytesGauge = Metric.gauge("mpcache_l1_used_bytes", { description: "Bytes held by L1 objects (committed and reserved)" })
const evictionsTotal = Metric.counter("mpcache_l1_evictions_total", { description: "L1 objects evicted (LRU)", incremental: true })

/** The L1 store. */
export class L1Store extends Context.Service<L1Store, {
  /** Reserves a `sizeBytes` object for `key` (mode "new": an existing key is not rewritten). */
  readonly reserveWrite: (key: ObjectKey, sizeBytes: number) => Effect.Effect<ReserveResult>
  /** Makes a reservation visible. False when it was dropped meanwhile (CLEAR force). */
  readonly commit: (reservation: Reservation) => Effect.Effect<boolean>
  /** Drops a reservation (a failed or abandoned write). */
  readonly abort: (reservation: Reservation) => Effect.Effect<void>
  /** Whether `key` is committed. */
  readonly contains: (key: ObjectKey) => boolean
  /** Read-locks a committed object and marks it used; undefined when absent or not committed. */
  readonly lockRead: (key: ObjectKey) => ReadHandle | undefined
  /** Releases one read lock. */
  readonly unlockRead: (handle: ReadHandle) => void
  /** Marks keys most recently used (END_SESSION). */
  readonly touch: (keys: ReadonlyArray<ObjectKey>) => void
  /** Drops committed, unlocked objects (force: also locked and reserved ones). Returns how many. */
  readonly clear: (force: boolean) => Effect.Effect<number>
  readonly stats: () => L1Stats
}>()("mpcache/services/L1Store") {
  /** An L1 of `capacityBytes`. */
  static readonly make = (capacityBytes: number) => Effect.sync(() => makeL1(capacityBytes))
  /** Capacity from `--l1-size-gb` (GiB). */
  static readonly layer = Layer.effect(
    this,
    Effect.gen(function*() {
      const config = yield* ServerConfig
      return makeL1(Math.floor(config.l1SizeGb * 2 ** 30))
    })
  )
  /** CLEAR acts on this L1. */
  static readonly layerCacheControl = Layer.effect(
    CacheControl,
    Effect.gen(function*() {
      const l1 = yield* L1Store
      return { clear: l1.clear }
    })
  )
}

const makeL1 = (capacityBytes: number): L1Store["Service"] => {
  // Map iteration order is insertion order: re-inserting on use keeps it LRU-first.
  const objects = new Map<string, L1Object>()
  let usedBytes = 0
  let evictions = 0

  const markUsed = (o: L1Object) => {
    objects.delete(o.keyString)
    objects.set(o.keyString, o)
  }

  const drop = (o: L1Object) => {
    objects.delete(o.keyString)
    usedBytes -= o.bytes.length
  }

  /** Evicts LRU committed, unlocked objects until `needed` more bytes fit; false when they cannot. */
  const makeRoom = (needed: number): boolean => {
    if (usedBytes + needed <= capacityBytes) return true
    let evictable = 0
    for (const o of objects.values()) if (o.committed && o.readLocks === 0) evictable += o.bytes.length
    if (usedBytes - evictable + needed > capacityBytes) return false
    for (const o of objects.values()) {
      if (usedBytes + needed <= capacityBytes) break
      if (o.committed && o.readLocks === 0) {
        drop(o)
        evictions++
      }
    }
    return true
  }

  const reserveWrite = (key: ObjectKey, sizeBytes: number) =>
    Effect.suspend(() => {
      const keyString = objectKeyString(key)
      if (objects.has(keyString)) return Effect.succeed<ReserveResult>({ _tag: "Exists" })
      const before = evictions
      if (sizeBytes > capacityBytes || !makeRoom(sizeBytes)) return Effect.succeed<ReserveResult>({ _tag: "Full" })
      const o: L1Object = { key, keyString, bytes: Buffer.allocUnsafeSlow(sizeBytes), committed: false, readLocks: 0 }
      objects.set(keyString, o)
      usedBytes += sizeBytes
      return Metric.update(usedBytesGauge, usedBytes).pipe(
        Effect.andThen(evictions > before ? Metric.update(evictionsTotal, evictions - before) : Effect.void),
        Effect.as<ReserveResult>({ _tag: "Reserved", reservation: { keyString, bytes: o.bytes } })
      )
    })

  const commit = (r: Reservation) =>
    Effect.sync(() => {
      const o = objects.get(r.keyString)
      if (o === undefined || o.bytes !== r.bytes) return false
      o.committed = true
      markUsed(o)
      return true
    })

  const abort = (r: Reservation) =>
    Effect.suspend(() => {
      const o = objects.get(r.keyString)
      if (o !== undefined && o.bytes === r.bytes && !o.committed) drop(o)
      return Metric.update(usedBytesGauge, usedBytes)
    })

  const lockRead = (key: ObjectKey): ReadHandle | undefined => {
    const o = objects.get(objectKeyString(key))
    if (o === undefined || !o.committed) return undefined
    o.readLocks++
    markUsed(o)
    return { keyString: o.keyString, bytes: o.bytes }
  }

  const unlockRead = (h: ReadHandle) => {
    const o = objects.get(h.keyString)
    if (o !== undefined && o.bytes === h.bytes && o.readLocks > 0) o.readLocks--
  }

  const clear = (force: boolean) =>
    Effect.suspend(() => {
      let dropped = 0
      for (const o of [...objects.values()]) {
        if (force || (o.committed && o.readLocks === 0)) {
          drop(o)
          dropped++
        }
      }
      return Metric.update(usedBytesGauge, usedBytes).pipe(Effect.as(dropped))
    })

  return {
    reserveWrite,
    commit,
    abort,
    contains: (key) => objects.get(objectKeyString(key))?.committed === true,
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
      return { capacityBytes, usedBytes, objects: objects.size, reservedObjects: reserved, lockedObjects: locked, evictions }
    }
  }
}
