/**
 * Lookup and prefetch (DESIGN §3.1, §4; reference §3.6): the scheduler side.
 *
 * - LOOKUP hashes the key's complete chunks, counts the longest prefix
 *   present in L1 for every rank it names (worker_id nil = every rank of the
 *   world size), read-locks that prefix under the request's session and
 *   records a prefetch job. L1 is host memory, so the job is done at once.
 * - QUERY_PREFETCH_STATUS reports the hit chunk count once, then forgets it
 *   (an unknown or already reported id answers 0).
 * - FREE_LOOKUP_LOCKS releases the session's locks in the key's range;
 *   END_SESSION releases all of them and marks the keys recently used;
 *   RETRIEVE consumes them. Locks of a session idle longer than
 *   `--lookup-lock-ttl-seconds` are released by a sweeper, so a vanished
 *   scheduler cannot pin memory forever; a prefetch job nobody queries is
 *   dropped after the same TTL (with its session, or on its own when it has
 *   none), so `lookup.pending_jobs` always returns to 0.
 * - With an L2 (issue 15 item 5), LOOKUP continues past the L1 prefix: the
 *   chunks present in L2 for every rank (EXISTS under the lookup timeout)
 *   extend the prefix, and a prefetch fiber GETs them into fresh L1 objects
 *   locked under the session like L1 hits. QUERY_PREFETCH_STATUS answers nil
 *   while it runs, then the L1 prefix plus the chunks it got in order — a
 *   failed or corrupt GET shortens the count, so a RETRIEVE is never
 *   promised bytes it cannot get.
 */
import { Clock, Context, Duration, Effect, Layer, Metric, Schedule } from "effect"
import { ServerConfig } from "./ServerConfig.ts"
import type { CacheKey } from "../../schema/CacheKey.ts"
import { EndSession, FreeLookupLocks, Lookup as LookupOp, QueryPrefetchStatus } from "../../schema/Op.ts"
import { row, type ServerModule } from "./Handler.ts"
import { L1Store, type ReadHandle } from "./L1Store.ts"
import { type KvLayout, LayoutRegistry } from "./LayoutRegistry.ts"
import { objectKeyString, type ObjectKey } from "./ObjectKey.ts"
import { chunkHashes } from "../kv/TokenHasher.ts"
import { L2Tier } from "./l2/L2Tier.ts"

interface HeldLock {
  readonly key: ObjectKey
  readonly chunkIndex: number
  readonly handles: Array<ReadHandle>
}

/** A FREE_LOOKUP_LOCKS range: chunks [first, last) of `ranks`. */
interface Freed {
  readonly first: number
  readonly last: number
  readonly ranks: ReadonlySet<number>
}

interface Session {
  readonly locks: Map<string, HeldLock>
  lastActivityMs: number
}

const lookupsTotal = Metric.counter("mpcache_lookups_total", { description: "LOOKUP requests", incremental: true })
const lookupChunksTotal = Metric.counter("mpcache_lookup_chunks_total", { description: "Chunks looked up (per rank)", incremental: true })
const lookupHitChunksTotal = Metric.counter("mpcache_lookup_hit_chunks_total", { description: "Chunks found in L1 by LOOKUP (per rank)", incremental: true })

/** The ObjectKeys of chunks [first, last) of `key` for `rank`, given their hashes. */
export const objectKeysOf = (key: CacheKey, hashes: ReadonlyArray<Uint8Array>, rank: number): Array<ObjectKey> =>
  hashes.map((hash) => ({ hash, modelName: key.model_name, kvRank: rank, cacheSalt: key.cache_salt }))

/** The ranks a key names: its worker_id, or every rank of its world size when nil. */
export const ranksOf = (key: CacheKey): ReadonlyArray<number> =>
  key.worker_id === null ? Array.from({ length: key.world_size }, (_, r) => r) : [key.worker_id]

export class Lookup extends Context.Service<Lookup, {
  readonly lookup: (key: CacheKey) => Effect.Effect<void>
  readonly queryPrefetchStatus: (requestId: string) => Effect.Effect<number | null>
  readonly freeLookupLocks: (key: CacheKey) => Effect.Effect<void>
  readonly endSession: (requestId: string) => Effect.Effect<void>
  /**
   * A read handle on `key` for a RETRIEVE of `requestId`: the session's
   * prefetch lock when it holds one (it passes to the caller), else a fresh
   * lock if the object is in L1; undefined when it is not. The caller
   * releases it with `release`.
   */
  readonly acquireForRetrieve: (requestId: string, key: ObjectKey) => Effect.Effect<ReadHandle | undefined>
  readonly release: (handle: ReadHandle) => void
  /** Open sessions and read locks they hold, for status. */
  readonly stats: () => { readonly sessions: number; readonly heldLocks: number; readonly pendingJobs: number }
  /** Releases the locks of sessions idle longer than the TTL; returns how many sessions. */
  readonly sweepExpired: () => Effect.Effect<number>
  /** Rows: LOOKUP, QUERY_PREFETCH_STATUS, FREE_LOOKUP_LOCKS, END_SESSION — all NORMAL. */
  readonly module: ServerModule
}>()("mpcache/services/Lookup") {
  /** Needs the L1 store, the layout registry and the config; runs the lock-TTL sweeper in its scope. */
  static readonly layer = Layer.effect(
    this,
    Effect.gen(function*() {
      const config = yield* ServerConfig
      const l1 = yield* L1Store
      const layouts = yield* LayoutRegistry
      const l2 = yield* L2Tier
      const scope = yield* Effect.scope
      const chunk = config.chunkSizeTokens
      const ttlMs = config.lookupLockTtlSeconds * 1000
      const sessions = new Map<string, Session>()
      // request id → hit chunks and when the LOOKUP recorded it (Clock ms). A job is bounded by the lock
      // TTL like a session: one the scheduler never queries (a model nobody registered has no session)
      // must not stay for the life of the server (issue 18).
      // hits null: an L2 prefetch is still running (QUERY_PREFETCH_STATUS answers nil).
      // `freed`: FREE_LOOKUP_LOCKS ranges received while it ran, whose chunks it must not lock.
      const jobs = new Map<string, { hits: number | null; readonly atMs: number; readonly freed: Array<Freed> }>()
      // Since start, for the status page's L1 hit ratio (issue 17): LOOKUPs, and chunks looked up and
      // found, counted per rank like mpcache_lookup_chunks_total / mpcache_lookup_hit_chunks_total.
      const totals = { lookups: 0, lookedUpChunks: 0, hitChunks: 0 }

      const sessionOf = (requestId: string, nowMs: number): Session => {
        let s = sessions.get(requestId)
        if (s === undefined) {
          s = { locks: new Map(), lastActivityMs: nowMs }
          sessions.set(requestId, s)
        }
        s.lastActivityMs = nowMs
        return s
      }

      const holdLock = (session: Session, key: ObjectKey, chunkIndex: number, handle: ReadHandle) => {
        const held = session.locks.get(handle.keyString)
        if (held === undefined) session.locks.set(handle.keyString, { key, chunkIndex, handles: [handle] })
        else held.handles.push(handle)
      }

      /**
       * The L2 prefetch of chunks [from, from + count) for every rank: GETs into L1 objects, then the
       * handles of the contiguous run that arrived go to the session and the job's count is set; the
       * rest are released (their objects stay in L1, unlocked). A session or job gone meanwhile
       * (END_SESSION, the TTL) gets nothing: every handle is released.
       */
      const prefetch = (requestId: string, perRank: ReadonlyArray<ReadonlyArray<ObjectKey>>, from: number, count: number, layout: KvLayout) =>
        Effect.gen(function*() {
          const fetched = yield* Effect.forEach(
            Array.from({ length: count }, (_, i) => from + i),
            (i) => Effect.forEach(perRank, (keys) => l2.fetch(keys[i]!, layout), { concurrency: "unbounded" }),
            { concurrency: 8 }
          )
          let got = 0
          while (got < count && fetched[got]!.every((h) => h !== undefined)) got++
          const session = sessions.get(requestId)
          const job = jobs.get(requestId)
          const keep = session !== undefined && job !== undefined && job.hits === null
          fetched.forEach((handles, n) =>
            handles.forEach((h, r) => {
              if (h === undefined) return
              const k = perRank[r]![from + n]!
              const freed = job?.freed.some((f) => from + n >= f.first && from + n < f.last && f.ranks.has(k.kvRank)) ?? false
              if (keep && n < got && !freed) holdLock(session, k, from + n, h)
              else l1.unlockRead(h)
            })
          )
          if (keep) job.hits = from + got
          if (got < count) yield* Effect.logInfo(`lookup ${requestId}: L2 prefetch got ${got} of ${count} chunk(s); prefix ${from + got}`)
        })

      const releaseAll = (s: Session) => {
        for (const held of s.locks.values()) for (const h of held.handles) l1.unlockRead(h)
        s.locks.clear()
      }

      const lookup = (key: CacheKey) =>
        Effect.gen(function*() {
          const now = yield* Clock.currentTimeMillis
          const layout = yield* layouts.get(key.model_name, key.world_size)
          yield* Metric.update(lookupsTotal, 1)
          totals.lookups++
          if (layout === undefined) {
            jobs.set(key.request_id, { hits: 0, atMs: now, freed: [] })
            return yield* Effect.logWarning(
              `lookup: no registered layout for model ${key.model_name} (world size ${key.world_size}); 0 hits`
            )
          }
          const hashes = chunkHashes(key.token_ids, chunk, Math.floor(key.end / chunk))
          const ranks = ranksOf(key)
          const perRank = ranks.map((r) => objectKeysOf(key, hashes, r))
          let hits = 0
          while (hits < hashes.length && perRank.every((keys) => l1.contains(keys[hits]!))) hits++
          const session = sessionOf(key.request_id, now)
          for (const keys of perRank) {
            for (let i = 0; i < hits; i++) {
              const handle = l1.lockRead(keys[i]!)
              if (handle !== undefined) holdLock(session, keys[i]!, i, handle)
            }
          }
          const rest = Array.from({ length: hashes.length - hits }, (_, n) => perRank.map((keys) => keys[hits + n]!))
          const inL2 = l2.enabled && rest.length > 0 ? yield* l2.existsPrefix(rest, layout) : 0
          jobs.set(key.request_id, { hits: inL2 > 0 ? null : hits, atMs: now, freed: [] })
          if (inL2 > 0) yield* Effect.forkIn(prefetch(key.request_id, perRank, hits, inL2, layout), scope)
          yield* Metric.update(lookupChunksTotal, hashes.length * ranks.length)
          yield* Metric.update(lookupHitChunksTotal, hits * ranks.length)
          totals.lookedUpChunks += hashes.length * ranks.length
          totals.hitChunks += hits * ranks.length
        })

      const queryPrefetchStatus = (requestId: string) =>
        Effect.gen(function*() {
          const now = yield* Clock.currentTimeMillis
          const s = sessions.get(requestId)
          if (s !== undefined) s.lastActivityMs = now
          const job = jobs.get(requestId)
          if (job === undefined) return 0
          if (job.hits === null) return null
          jobs.delete(requestId)
          return job.hits
        })

      const freeLookupLocks = (key: CacheKey) =>
        Effect.sync(() => {
          const s = sessions.get(key.request_id)
          if (s === undefined) return
          const first = Math.floor(key.start / chunk)
          const last = Math.ceil(key.end / chunk)
          const ranks = new Set(ranksOf(key))
          const job = jobs.get(key.request_id)
          if (job !== undefined && job.hits === null) job.freed.push({ first, last, ranks })
          for (const [ks, held] of s.locks) {
            if (held.chunkIndex >= first && held.chunkIndex < last && ranks.has(held.key.kvRank)) {
              for (const h of held.handles) l1.unlockRead(h)
              s.locks.delete(ks)
            }
          }
        })

      const endSession = (requestId: string) =>
        Effect.sync(() => {
          jobs.delete(requestId)
          const s = sessions.get(requestId)
          if (s === undefined) return
          const keys = [...s.locks.values()].map((h) => h.key)
          releaseAll(s)
          sessions.delete(requestId)
          l1.touch(keys)
        })

      const acquireForRetrieve = (requestId: string, key: ObjectKey) =>
        Effect.gen(function*() {
          const now = yield* Clock.currentTimeMillis
          const s = sessions.get(requestId)
          if (s !== undefined) {
            s.lastActivityMs = now
            const ks = objectKeyString(key)
            const held = s.locks.get(ks)
            const handle = held?.handles.pop()
            if (held !== undefined && held.handles.length === 0) s.locks.delete(ks)
            if (handle !== undefined) return handle
          }
          return l1.lockRead(key)
        })

      const sweepExpired = () =>
        Effect.gen(function*() {
          const now = yield* Clock.currentTimeMillis
          let expired = 0
          for (const [id, s] of sessions) {
            if (now - s.lastActivityMs > ttlMs) {
              releaseAll(s)
              sessions.delete(id)
              jobs.delete(id)
              expired++
            }
          }
          for (const [id, job] of jobs) if (!sessions.has(id) && now - job.atMs > ttlMs) jobs.delete(id)
          if (expired > 0) {
            yield* Effect.logInfo(`released the lookup locks of ${expired} session(s) idle for over ${config.lookupLockTtlSeconds} s`)
          }
          return expired
        })

      yield* sweepExpired().pipe(
        Effect.repeat(Schedule.spaced(Duration.millis(Math.min(ttlMs / 4, 30_000)))),
        Effect.forkScoped
      )
      yield* Effect.addFinalizer(() =>
        Effect.sync(() => {
          for (const s of sessions.values()) releaseAll(s)
          sessions.clear()
          jobs.clear()
        })
      )

      const stats = () => {
        let heldLocks = 0
        for (const s of sessions.values()) for (const h of s.locks.values()) heldLocks += h.handles.length
        return { sessions: sessions.size, heldLocks, pendingJobs: jobs.size }
      }
      const module: ServerModule = {
        name: "lookup",
        status: () =>
          Effect.sync(() => {
            const k = stats()
            return {
              lookup: {
                sessions: k.sessions,
                held_locks: k.heldLocks,
                pending_jobs: k.pendingJobs,
                lookups: totals.lookups,
                looked_up_chunks: totals.lookedUpChunks,
                hit_chunks: totals.hitChunks
              }
            }
          }),
        rows: [
          row(LookupOp, "NORMAL", ([key]) => lookup(key)),
          row(QueryPrefetchStatus, "NORMAL", ([requestId]) => queryPrefetchStatus(requestId)),
          row(FreeLookupLocks, "NORMAL", ([key]) => freeLookupLocks(key)),
          row(EndSession, "NORMAL", ([requestId]) => endSession(requestId))
        ]
      }
      return {
        lookup,
        queryPrefetchStatus,
        freeLookupLocks,
        endSession,
        acquireForRetrieve,
        release: (h) => l1.unlockRead(h),
        stats,
        sweepExpired,
        module
      }
    })
  )
}
