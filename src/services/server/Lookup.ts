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
 * - Bounded (issue 24 items 5 and 6): a LOOKUP with `worker_id` nil visits
 *   the ranks chunk by chunk and stops at the first object L1 lacks, so its
 *   work is bounded by what is stored, not by `world_size`; a LOOKUP that
 *   finds nothing (no registered layout, no hit) keeps nothing; what a
 *   pending lookup keeps is bounded per peer, per server and in read locks
 *   (`--max-pending-lookups-per-peer`, `--max-pending-lookups`,
 *   `--max-lookup-locks`), the oldest released first and counted
 *   (src/services/server/internal/PendingLookups.ts).
 * - With an L2 (issue 15 item 5), LOOKUP continues past the L1 prefix: the
 *   chunks present in L2 for every rank (EXISTS under the lookup timeout)
 *   extend the prefix, and a prefetch fiber GETs them into fresh L1 objects
 *   locked under the session like L1 hits. QUERY_PREFETCH_STATUS answers nil
 *   while it runs, then the L1 prefix plus the chunks it got in order — a
 *   failed or corrupt GET shortens the count, so a RETRIEVE is never
 *   promised bytes it cannot get.
 * - A repeated LOOKUP of a request id replaces what it held (issue 25 item
 *   2): the earlier LOOKUP's locks are released and its prefetch, if still
 *   running, interrupted (releasing what it fetched) before the new one
 *   locks; a repeated LOOKUP that finds nothing leaves nothing. Every lock a
 *   RETRIEVE or a prefetch takes is a scoped handle (internal/L1Handles.ts):
 *   released by whatever ends it, a defect or an interruption included.
 */
import { Clock, Context, Deferred, Duration, Effect, Exit, Fiber, Layer, Metric, Schedule, type Scope } from "effect"
import { ServerConfig, type ServerConfigInput } from "./ServerConfig.ts"
import type { CacheKey } from "../../schema/CacheKey.ts"
import { EndSession, FreeLookupLocks, Lookup as LookupOp, QueryPrefetchStatus } from "../../schema/Op.ts"
import { row, type ServerModule } from "./Handler.ts"
import { L1Store, type ReadHandle } from "./L1Store.ts"
import { type KvLayout, LayoutRegistry } from "./LayoutRegistry.ts"
import { objectKeyString, type ObjectKey } from "./ObjectKey.ts"
import { chunkHashes } from "../kv/TokenHasher.ts"
import { originOf } from "./kvevents/L1EventSink.ts"
import { L2Tier } from "./l2/L2Tier.ts"
import { makeWarnWindow } from "./internal/WarnWindow.ts"
import * as L1Handles from "./internal/L1Handles.ts"
import {
  type LookupJob,
  makePendingLookups,
  type PendingLookup,
  RELEASE_REASONS,
  type ReleaseReason
} from "./internal/PendingLookups.ts"
import { byLabel, fromStart } from "../metrics/Series.ts"

const lookupsTotal = fromStart(Metric.counter("mpcache_lookups_total", { description: "LOOKUP requests", incremental: true }))
const lookupChunksTotal = fromStart(Metric.counter("mpcache_lookup_chunks_total", { description: "Chunks looked up (per rank)", incremental: true }))
const lookupHitChunksTotal = fromStart(
  Metric.counter("mpcache_lookup_hit_chunks_total", { description: "Chunks found in L1 by LOOKUP (per rank)", incremental: true })
)
const releasedTotal = Metric.counter("mpcache_lookup_sessions_released_total", {
  description:
    "Pending lookups released before their end, by reason: ttl (idle past --lookup-lock-ttl-seconds), or the bound they were the oldest over (max_pending_lookups_per_peer, max_pending_lookups, max_lookup_locks)",
  incremental: true
})
const releasedMetric: Readonly<Record<ReleaseReason, Metric.Metric<number, unknown>>> = byLabel(releasedTotal, "reason", RELEASE_REASONS)

/**
 * L2 keys one LOOKUP asks EXISTS about: 65,536 (chunks × ranks; 8 ranks of a
 * 2M-token prompt at 256-token chunks). Past it the prefix is not looked for
 * in L2 (a shorter prefix is always a correct answer).
 */
export const L2_EXISTS_MAX_KEYS = 1 << 16

/** One WARNING per this many ms for each kind of event a peer can repeat at will (a log line is not free). */
const WARN_WINDOW_MS = 10_000

/** The ObjectKeys of chunks [first, last) of `key` for `rank`, given their hashes. */
export const objectKeysOf = (key: CacheKey, hashes: ReadonlyArray<Uint8Array>, rank: number): Array<ObjectKey> =>
  hashes.map((hash) => ({ hash, modelName: key.model_name, kvRank: rank, cacheSalt: key.cache_salt }))

/** How many ranks a key names: 1 for its worker_id, or its world size when nil. */
export const rankCountOf = (key: CacheKey): number => key.worker_id === null ? key.world_size : 1

/** The `j`-th rank a key names (`j` < {@link rankCountOf}). */
export const rankAt = (key: CacheKey, j: number): number => key.worker_id ?? j

/** The ObjectKey of chunk `i` (hash `hashes[i]`) for the `j`-th rank `key` names, built only when asked about. */
const chunkKey = (key: CacheKey, hashes: ReadonlyArray<Uint8Array>, i: number, j: number): ObjectKey => ({
  hash: hashes[i]!,
  modelName: key.model_name,
  kvRank: rankAt(key, j),
  cacheSalt: key.cache_salt
})

type Pending = PendingLookup<ObjectKey, ReadHandle>

export class Lookup extends Context.Service<Lookup, {
  /**
   * LOOKUP: counts the prefix of `key`'s complete chunks every rank it names
   * holds (L1, then L2), read-locks it for the request and records the
   * count. `peer` (routing id hex; "" in-process) is whom the pending lookup
   * counts against. Keeps nothing when nothing was found.
   */
  readonly lookup: (key: CacheKey, peer?: string) => Effect.Effect<void>
  readonly queryPrefetchStatus: (requestId: string) => Effect.Effect<number | null>
  readonly freeLookupLocks: (key: CacheKey) => Effect.Effect<void>
  readonly endSession: (requestId: string) => Effect.Effect<void>
  /**
   * A read lock on `key` for a RETRIEVE of `requestId`, held by the current
   * Scope (released when it closes, by any exit): the session's prefetch
   * lock when it holds one (it passes to the caller), else a fresh lock if
   * the object is in L1; undefined (nothing held) when it is not.
   */
  readonly acquireForRetrieve: (requestId: string, key: ObjectKey) => Effect.Effect<ReadHandle | undefined, never, Scope.Scope>
  /**
   * Pending lookups (`sessions`: request ids the server keeps state for), the
   * read locks they hold, the unreported counts among them, the peers they
   * count against, and releases before their end by reason, for status.
   */
  readonly stats: () => {
    readonly sessions: number
    readonly heldLocks: number
    readonly pendingJobs: number
    readonly peers: number
    readonly released: Readonly<Record<ReleaseReason, number>>
  }
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
      const limits = config.lookupLimits
      // Request id → its locks and unreported count, oldest LOOKUP first, bounded (issue 24 item 6). A
      // count nobody queries is bounded by the lock TTL like the locks (issue 18).
      const pending = makePendingLookups<ObjectKey, ReadHandle>(limits, (h) => l1.unlockRead(h))
      // Since start, for the status page's L1 hit ratio (issue 17): LOOKUPs, and chunks looked up and
      // found, counted per rank like mpcache_lookup_chunks_total / mpcache_lookup_hit_chunks_total;
      // and LOOKUPs whose locked prefix --max-lookup-locks cut short.
      const totals = { lookups: 0, lookedUpChunks: 0, hitChunks: 0, cappedLookups: 0 }
      // At most one WARNING per kind per window; the next line says how many were not logged.
      const warnings = makeWarnWindow(WARN_WINDOW_MS)
      const warnThrottled = (kind: string, message: string) => warnings.warn(kind, message)
      // The running L2 prefetch of a pending lookup: interrupted when a LOOKUP of its id replaces it.
      const prefetches = new WeakMap<Pending, Fiber.Fiber<void>>()
      const stopPrefetch = (p: Pending | undefined) => {
        const fiber = p === undefined ? undefined : prefetches.get(p)
        return fiber === undefined ? Effect.void : Fiber.interrupt(fiber)
      }

      /** Counts the releases the table made since the last call, and warns about them (throttled). */
      const reportReleases = Effect.gen(function*() {
        const { counts, peers } = pending.drainReleases()
        for (const reason of RELEASE_REASONS) {
          const n = counts[reason]
          if (n === 0) continue
          yield* Metric.update(releasedMetric[reason], n)
          if (reason === "ttl") {
            yield* Effect.logInfo(`released the lookup locks of ${n} session(s) idle for over ${config.lookupLockTtlSeconds} s`)
          } else {
            const flag = reason.replaceAll("_", "-")
            const limit = reason === "max_pending_lookups_per_peer"
              ? limits.maxPendingLookupsPerPeer
              : reason === "max_pending_lookups"
              ? limits.maxPendingLookups
              : limits.maxLookupLocks
            const who = peers.length > 0 ? ` (peer ${peers.slice(0, 4).join(", ")}${peers.length > 4 ? ", …" : ""})` : ""
            yield* warnThrottled(reason, `lookup: released the ${n} oldest pending lookup(s) over --${flag} ${limit}${who}`)
          }
        }
      })

      /**
       * The L2 prefetch of chunks [from, from + count) for every rank of `key`: GETs into L1 objects,
       * each read-locked in the prefetch's scope; then the locks of the contiguous run that arrived move
       * to the pending lookup and the job's count is set; the scope's close releases the rest (their
       * objects stay in L1, unlocked). A lookup ended, released or looked up again meanwhile gets
       * nothing, and a prefetch interrupted or dead at any step leaves nothing locked or reserved.
       */
      const prefetch = (entry: Pending, job: LookupJob, key: CacheKey, hashes: ReadonlyArray<Uint8Array>, from: number, count: number, layout: KvLayout) =>
        Effect.scoped(Effect.gen(function*() {
          const ranks = rankCountOf(key)
          const keyAt = (i: number, j: number) => chunkKey(key, hashes, i, j)
          // The GETs run side by side; chunk n is placed in L1 once chunk n - 1 is done (placed or not), so the
          // CPU records go out parent first. The forEach starts chunks in order, so chunk 0 never waits.
          const done = yield* Effect.forEach(Array.from({ length: count }), () => Deferred.make<void>())
          const fetched = yield* Effect.forEach(
            Array.from({ length: count }, (_, n) => n),
            (n) => {
              const i = from + n
              const origin = originOf(key.token_ids, chunk, i, hashes)
              const inTurn = n === 0 ? Effect.void : Deferred.await(done[n - 1]!)
              return Effect.forEach(Array.from({ length: ranks }, (_, j) => keyAt(i, j)), (k) => l2.fetch(k, layout, origin, inTurn), {
                concurrency: "unbounded"
              }).pipe(Effect.ensuring(Deferred.succeed(done[n]!, undefined)))
            },
            { concurrency: 8 }
          )
          let got = 0
          while (got < count && fetched[got]!.every((h) => h !== undefined)) got++
          const keep = pending.get(entry.requestId) === entry && entry.job === job && job.hits === null
          // The locks of the run must fit under --max-lookup-locks; a run cut short is a shorter prefix.
          const fits = keep ? Math.min(got, Math.floor(pending.lockRoom() / ranks)) : 0
          if (keep && fits < got) totals.cappedLookups++
          // One synchronous step: each lock kept moves to the pending lookup; the others stay the scope's.
          fetched.forEach((locks, n) =>
            locks.forEach((lock, j) => {
              if (lock === undefined) return
              const i = from + n
              const rank = rankAt(key, j)
              const freed = job.freed.some((f) => i >= f.first && i < f.last && (f.rank === null ? rank < f.ranksBelow : f.rank === rank))
              if (keep && n < fits && !freed) pending.hold(entry, keyAt(i, j), i, rank, L1Handles.moveRead(lock)!)
            })
          )
          if (keep) job.hits = from + fits
          if (fits < count) yield* Effect.logInfo(`lookup ${entry.requestId}: L2 prefetch got ${fits} of ${count} chunk(s); prefix ${from + fits}`)
        })).pipe(
          // A prefetch that died or was interrupted got nothing: the count is the L1 prefix it started from,
          // never nil forever (what it fetched is released by its scope).
          Effect.onExit((exit) => Effect.sync(() => {
            if (Exit.isFailure(exit) && job.hits === null) job.hits = from
          }))
        )

      /** How many of chunks [from, …) every rank of `key` has in L2 (at most L2_EXISTS_MAX_KEYS keys asked). */
      const inL2From = (key: CacheKey, hashes: ReadonlyArray<Uint8Array>, from: number, layout: KvLayout) =>
        Effect.suspend(() => {
          const ranks = rankCountOf(key)
          const count = Math.min(hashes.length - from, Math.floor(L2_EXISTS_MAX_KEYS / ranks))
          if (!l2.enabled || count <= 0) return Effect.succeed(0)
          const rest = Array.from({ length: count }, (_, n) => Array.from({ length: ranks }, (_, j) => chunkKey(key, hashes, from + n, j)))
          return l2.existsPrefix(rest, layout)
        })

      const lookup = (key: CacheKey, peer = "") =>
        Effect.gen(function*() {
          const now = yield* Clock.currentTimeMillis
          const layout = yield* layouts.get(key.model_name, key.world_size)
          yield* Metric.update(lookupsTotal, 1)
          totals.lookups++
          if (layout === undefined) {
            // Keeps nothing (issue 24 item 6) and replaces what an earlier LOOKUP of the id held (issue 25
            // item 2): 0 is the answer now, as for an unknown id.
            yield* forget(key.request_id)
            return yield* warnThrottled(
              "no-layout",
              `lookup: no registered layout for model ${key.model_name} (world size ${key.world_size}); 0 hits`
            )
          }
          const hashes = chunkHashes(key.token_ids, chunk, Math.floor(key.end / chunk))
          const ranks = rankCountOf(key)
          const keyAt = (i: number, j: number) => chunkKey(key, hashes, i, j)
          // Chunk by chunk, every rank, stopping at the first object L1 lacks: each step but the last finds
          // a stored object, so the work is bounded by what is stored, never by world_size (issue 24 item 5).
          let hits = 0
          scan: while (hits < hashes.length) {
            for (let j = 0; j < ranks; j++) if (!l1.contains(keyAt(hits, j))) break scan
            hits++
          }
          yield* Metric.update(lookupChunksTotal, hashes.length * ranks)
          yield* Metric.update(lookupHitChunksTotal, hits * ranks)
          totals.lookedUpChunks += hashes.length * ranks
          totals.hitChunks += hits * ranks
          const inL2First = hits === 0 ? yield* inL2From(key, hashes, 0, layout) : 0
          if (hits === 0 && inL2First === 0) return yield* forget(key.request_id)
          // Replaces an earlier LOOKUP of the id: its locks are unlocked here, its prefetch stopped below.
          const earlier = pending.get(key.request_id)
          const entry = pending.admit(key.request_id, peer, now)
          const room = pending.makeRoomForLocks(hits * ranks, entry)
          const locked = Math.min(hits, Math.floor(room / ranks))
          if (locked < hits) totals.cappedLookups++
          for (let i = 0; i < locked; i++) {
            for (let j = 0; j < ranks; j++) {
              const k = keyAt(i, j)
              const handle = l1.lockRead(k)
              if (handle !== undefined) pending.hold(entry, k, i, k.kvRank, handle)
            }
          }
          yield* stopPrefetch(earlier)
          yield* reportReleases
          if (locked < hits) {
            yield* warnThrottled("capped", `lookup: --max-lookup-locks ${limits.maxLookupLocks} reached; request ${key.request_id} locked ${locked} of ${hits} hit chunk(s)`)
          }
          const inL2 = locked < hits ? 0 : hits === 0 ? inL2First : yield* inL2From(key, hashes, hits, layout)
          // Ended or released while L2 answered: its locks went with it.
          if (pending.get(key.request_id) !== entry) return
          if (inL2 === 0 && locked === 0) {
            // --max-lookup-locks left no room at all: nothing locked, nothing to report.
            entry.job = undefined
            pending.dropIfIdle(entry)
            return
          }
          const job: LookupJob = { hits: inL2 > 0 ? null : locked, freed: [] }
          entry.job = job
          if (inL2 > 0) prefetches.set(entry, yield* Effect.forkIn(prefetch(entry, job, key, hashes, locked, inL2, layout), scope))
        })

      /** A LOOKUP that found nothing: what an earlier LOOKUP of the id held goes (0 is the answer now). */
      const forget = (requestId: string) =>
        Effect.suspend(() => {
          const p = pending.get(requestId)
          if (p === undefined) return Effect.void
          pending.end(p)
          return stopPrefetch(p)
        })

      const queryPrefetchStatus = (requestId: string) =>
        Effect.gen(function*() {
          const now = yield* Clock.currentTimeMillis
          const p = pending.get(requestId)
          if (p === undefined) return 0
          p.lastActivityMs = now
          if (p.job === undefined) return 0
          if (p.job.hits === null) return null
          const hits = p.job.hits
          p.job = undefined
          pending.dropIfIdle(p)
          return hits
        })

      const freeLookupLocks = (key: CacheKey) =>
        Effect.sync(() => {
          const p = pending.get(key.request_id)
          if (p === undefined) return
          const first = Math.floor(key.start / chunk)
          const last = Math.ceil(key.end / chunk)
          const rank = key.worker_id
          const ranksBelow = key.world_size
          if (p.job !== undefined && p.job.hits === null) pending.rememberFreed(p.job, { first, last, rank, ranksBelow })
          pending.unlockWhere(
            p,
            (held) => held.chunkIndex >= first && held.chunkIndex < last && (rank === null ? held.kvRank < ranksBelow : held.kvRank === rank)
          )
        })

      const endSession = (requestId: string) =>
        Effect.sync(() => {
          const p = pending.get(requestId)
          if (p === undefined) return
          const keys = [...p.locks.values()].map((h) => h.key)
          pending.end(p)
          l1.touch(keys)
        })

      const acquireForRetrieve = (requestId: string, key: ObjectKey) =>
        Effect.map(
          L1Handles.holdRead(
            l1,
            Clock.clockWith((clock) =>
              Effect.sync(() => {
                const p = pending.get(requestId)
                if (p !== undefined) {
                  p.lastActivityMs = clock.currentTimeMillisUnsafe()
                  const handle = pending.take(p, objectKeyString(key))
                  if (handle !== undefined) return handle
                }
                return l1.lockRead(key)
              })
            )
          ),
          (lock) => lock?.handle
        )

      const sweepExpired = () =>
        Effect.gen(function*() {
          const now = yield* Clock.currentTimeMillis
          const expired = pending.sweep(now, ttlMs)
          yield* reportReleases
          return expired
        })

      yield* sweepExpired().pipe(
        Effect.repeat(Schedule.spaced(Duration.millis(Math.min(ttlMs / 4, 30_000)))),
        Effect.forkScoped
      )
      yield* Effect.addFinalizer(() => Effect.sync(() => pending.clear()))

      const stats = () => {
        const s = pending.stats()
        return { sessions: s.pending, heldLocks: s.heldLocks, pendingJobs: s.pendingJobs, peers: s.peers, released: s.released }
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
                peers: k.peers,
                max_pending_lookups: limits.maxPendingLookups,
                max_pending_lookups_per_peer: limits.maxPendingLookupsPerPeer,
                max_lookup_locks: limits.maxLookupLocks,
                released: k.released,
                capped_lookups: totals.cappedLookups,
                lookups: totals.lookups,
                looked_up_chunks: totals.lookedUpChunks,
                hit_chunks: totals.hitChunks
              }
            }
          }),
        rows: [
          row(LookupOp, "NORMAL", ([key], ctx) => lookup(key, ctx.peer)),
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
        stats,
        sweepExpired,
        module
      }
    })
  )
  /**
   * For tests: the real lookup over `ServerConfig.layerTest(overrides)`, an
   * in-process L1 of `l1CapacityBytes` over a plain Buffer (`L1Store.make`)
   * and the real layout registry, all three provided as well so a test can
   * fill L1 and register layouts; no L2 tier.
   */
  static readonly layerTest = (overrides: Partial<ServerConfigInput> = {}, l1CapacityBytes = 1 << 20) =>
    this.layer.pipe(Layer.provideMerge(Layer.mergeAll(
      ServerConfig.layerTest(overrides),
      Layer.effect(L1Store, L1Store.make(l1CapacityBytes)),
      LayoutRegistry.layerTest
    )))
}
