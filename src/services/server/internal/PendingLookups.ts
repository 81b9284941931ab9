/**
 * The pending lookups of the lookup module (issue 24 item 6; DESIGN §4): what
 * the server keeps for a request id between its LOOKUP and its end — the
 * read locks of its prefetch and its not yet reported hit count — bounded in
 * count per peer, in count per server and in read locks per server.
 *
 * Threat: a peer (or many) sending LOOKUPs with fresh request ids, each kept
 * for the lock TTL (300 s), grows the heap until the process dies (issue 24:
 * 3,000 LOOKUPs with 1 MiB ids → 5.4 GiB RSS). Over a bound, the **oldest**
 * pending lookup is released first — its locks freed, its count forgotten —
 * and the release is counted by reason. A released lookup costs its request
 * nothing but the prefetch: QUERY_PREFETCH_STATUS answers 0, and a RETRIEVE
 * locks the chunks afresh if they are still in L1.
 *
 * Age is the order of the latest LOOKUP naming the request id (a repeated
 * LOOKUP makes it the newest, under the peer that sent it). A repeated
 * LOOKUP **replaces** what the request id held (issue 25 item 2): the
 * earlier lookup's locks are unlocked and its count forgotten before the new
 * one locks, so repeating a LOOKUP never adds locks, and never keeps locks
 * the latest LOOKUP did not find. One request id holds at most one lock per
 * L1 object, so its locks never outnumber the distinct objects it found.
 *
 * @internal Pure bookkeeping: no Effect, no clock; the caller passes times in
 * Clock milliseconds and an `unlock` for the handles it hands over.
 */

/** The handle of one read lock (L1Store's ReadHandle): released by the `unlock` given to the table. */
export interface LockHandle {
  readonly keyString: string
}

/** One read lock a pending lookup holds: on the object of chunk `chunkIndex` for `kvRank`. */
export interface HeldLock<K, H extends LockHandle> {
  readonly key: K
  readonly chunkIndex: number
  readonly kvRank: number
  readonly handle: H
}

/** A FREE_LOOKUP_LOCKS range received while an L2 prefetch ran: chunks [first, last) of ranks below `ranksBelow`, or of `rank`. */
export interface FreedRange {
  readonly first: number
  readonly last: number
  /** One rank, or null: every rank below `ranksBelow`. */
  readonly rank: number | null
  readonly ranksBelow: number
}

/** The unreported answer of a LOOKUP: hit chunks, or null while its L2 prefetch runs. */
export interface LookupJob {
  hits: number | null
  /** FREE_LOOKUP_LOCKS ranges received while the prefetch ran, whose chunks it must not lock (at most {@link MAX_FREED_RANGES}). */
  readonly freed: Array<FreedRange>
}

/**
 * FREE_LOOKUP_LOCKS ranges a running prefetch remembers: 64. Past that the
 * list becomes one range covering everything (the prefetch then locks
 * nothing; a RETRIEVE locks afresh), so repeated frees cannot grow it.
 */
export const MAX_FREED_RANGES = 64

/** What the server keeps for one request id. */
export interface PendingLookup<K, H extends LockHandle> {
  readonly requestId: string
  /** The routing id (hex) of the peer whose LOOKUP last named it: the per-peer bound counts it there. */
  peer: string
  /** One lock per object, by the object's key string. */
  readonly locks: Map<string, HeldLock<K, H>>
  /** The unreported answer; undefined once reported (then only locks keep the entry). */
  job: LookupJob | undefined
  /** Last LOOKUP, QUERY_PREFETCH_STATUS or RETRIEVE naming it (Clock ms): the TTL counts from here. */
  lastActivityMs: number
}

/** The bounds (flags `--max-pending-lookups`, `--max-pending-lookups-per-peer`, `--max-lookup-locks`). */
export interface PendingLookupLimits {
  readonly maxPendingLookups: number
  readonly maxPendingLookupsPerPeer: number
  readonly maxLookupLocks: number
}

/** Why a pending lookup was released before its end: the lock TTL, or the bound (flag) it was over. */
export type ReleaseReason = "ttl" | "max_pending_lookups_per_peer" | "max_pending_lookups" | "max_lookup_locks"

/** Every reason, in the order status lists them. */
export const RELEASE_REASONS: ReadonlyArray<ReleaseReason> = ["ttl", "max_pending_lookups_per_peer", "max_pending_lookups", "max_lookup_locks"]

/** The table; see the module header. */
export interface PendingLookups<K, H extends LockHandle> {
  /** The pending lookup of `requestId`, if any. */
  readonly get: (requestId: string) => PendingLookup<K, H> | undefined
  /**
   * A fresh, empty pending lookup for `requestId`, the newest, under `peer`:
   * an earlier one of the id is ended first (its locks unlocked, its count
   * forgotten; not counted as a release), so a repeated LOOKUP replaces and
   * never adds. Then releases the oldest ones over the per-peer and
   * per-server counts. Returns it; it is never the one released (bounds ≥ 1).
   */
  readonly admit: (requestId: string, peer: string, nowMs: number) => PendingLookup<K, H>
  /**
   * Room for `wanted` more locks: releases the oldest pending lookups other
   * than `keep` while the locks held plus `wanted` pass `--max-lookup-locks`.
   * Returns how many locks may be taken (`wanted` or fewer, when `keep`'s own
   * locks leave less).
   */
  readonly makeRoomForLocks: (wanted: number, keep: PendingLookup<K, H>) => number
  /** Locks still allowed before `--max-lookup-locks`. */
  readonly lockRoom: () => number
  /** Holds `handle` for `p`; a second lock on an object `p` already holds is unlocked at once. */
  readonly hold: (p: PendingLookup<K, H>, key: K, chunkIndex: number, kvRank: number, handle: H) => void
  /** Removes and returns `p`'s lock on the object `keyString` (it passes to the caller); drops `p` if nothing is left. */
  readonly take: (p: PendingLookup<K, H>, keyString: string) => H | undefined
  /** Unlocks `p`'s locks that `matches`; drops `p` if nothing is left. */
  readonly unlockWhere: (p: PendingLookup<K, H>, matches: (held: HeldLock<K, H>) => boolean) => void
  /** Remembers a FREE_LOOKUP_LOCKS range for `job`'s running prefetch (bounded, see {@link MAX_FREED_RANGES}). */
  readonly rememberFreed: (job: LookupJob, range: FreedRange) => void
  /** Drops `p` when it holds no lock and no unreported answer. */
  readonly dropIfIdle: (p: PendingLookup<K, H>) => void
  /** Ends `p` (END_SESSION): unlocks everything it holds and forgets it. */
  readonly end: (p: PendingLookup<K, H>) => void
  /** Releases the pending lookups idle longer than `ttlMs` at `nowMs`; returns how many. */
  readonly sweep: (nowMs: number, ttlMs: number) => number
  /** Releases everything (shutdown). */
  readonly clear: () => void
  /** Counts for status. */
  readonly stats: () => {
    readonly pending: number
    readonly heldLocks: number
    readonly pendingJobs: number
    readonly peers: number
    readonly released: Readonly<Record<ReleaseReason, number>>
  }
  /**
   * Releases by reason since the last call (for the caller's metrics and
   * logs; the totals in `stats` keep counting), and the peers whose lookups
   * went for the per-peer bound.
   */
  readonly drainReleases: () => { readonly counts: Readonly<Record<ReleaseReason, number>>; readonly peers: ReadonlyArray<string> }
}

const zeroCounts = (): Record<ReleaseReason, number> => ({ ttl: 0, max_pending_lookups_per_peer: 0, max_pending_lookups: 0, max_lookup_locks: 0 })

/**
 * An empty table with `limits` (each ≥ 1, validated by ServerConfig);
 * `unlock` releases a handle it gives up.
 */
export const makePendingLookups = <K, H extends LockHandle>(
  limits: PendingLookupLimits,
  unlock: (handle: H) => void
): PendingLookups<K, H> => {
  /** Every pending lookup, oldest LOOKUP first (a Map keeps insertion order; re-admission moves to the end). */
  const all = new Map<string, PendingLookup<K, H>>()
  /** The same, per peer. */
  const byPeer = new Map<string, Map<string, PendingLookup<K, H>>>()
  let heldLocks = 0
  const released = zeroCounts()
  let sinceDrain = zeroCounts()
  let peersSinceDrain = new Set<string>()

  const unlink = (p: PendingLookup<K, H>) => {
    if (all.get(p.requestId) !== p) return
    all.delete(p.requestId)
    const mine = byPeer.get(p.peer)
    mine?.delete(p.requestId)
    if (mine !== undefined && mine.size === 0) byPeer.delete(p.peer)
  }

  const unlockAll = (p: PendingLookup<K, H>) => {
    for (const held of p.locks.values()) unlock(held.handle)
    heldLocks -= p.locks.size
    p.locks.clear()
  }

  const end = (p: PendingLookup<K, H>) => {
    unlockAll(p)
    unlink(p)
  }

  const release = (p: PendingLookup<K, H>, reason: ReleaseReason) => {
    end(p)
    released[reason]++
    sinceDrain[reason]++
    if (reason === "max_pending_lookups_per_peer") peersSinceDrain.add(p.peer)
  }

  const dropIfIdle = (p: PendingLookup<K, H>) => {
    if (p.locks.size === 0 && p.job === undefined) unlink(p)
  }

  const oldestOf = (m: ReadonlyMap<string, PendingLookup<K, H>>, except?: PendingLookup<K, H>) => {
    for (const p of m.values()) if (p !== except) return p
    return undefined
  }

  return {
    get: (requestId) => all.get(requestId),

    admit: (requestId, peer, nowMs) => {
      const earlier = all.get(requestId)
      if (earlier !== undefined) end(earlier)
      const p: PendingLookup<K, H> = { requestId, peer, locks: new Map(), job: undefined, lastActivityMs: nowMs }
      all.set(requestId, p)
      let mine = byPeer.get(peer)
      if (mine === undefined) byPeer.set(peer, mine = new Map())
      mine.set(requestId, p)
      while (mine.size > limits.maxPendingLookupsPerPeer) release(oldestOf(mine, p)!, "max_pending_lookups_per_peer")
      while (all.size > limits.maxPendingLookups) release(oldestOf(all, p)!, "max_pending_lookups")
      return p
    },

    makeRoomForLocks: (wanted, keep) => {
      while (heldLocks + wanted > limits.maxLookupLocks) {
        const oldest = oldestOf(all, keep)
        if (oldest === undefined) break
        release(oldest, "max_lookup_locks")
      }
      return Math.max(0, Math.min(wanted, limits.maxLookupLocks - heldLocks))
    },

    lockRoom: () => Math.max(0, limits.maxLookupLocks - heldLocks),

    hold: (p, key, chunkIndex, kvRank, handle) => {
      if (p.locks.has(handle.keyString)) {
        unlock(handle)
        return
      }
      p.locks.set(handle.keyString, { key, chunkIndex, kvRank, handle })
      heldLocks++
    },

    take: (p, keyString) => {
      const held = p.locks.get(keyString)
      if (held === undefined) return undefined
      p.locks.delete(keyString)
      heldLocks--
      dropIfIdle(p)
      return held.handle
    },

    unlockWhere: (p, matches) => {
      for (const [ks, held] of p.locks) {
        if (!matches(held)) continue
        unlock(held.handle)
        p.locks.delete(ks)
        heldLocks--
      }
      dropIfIdle(p)
    },

    rememberFreed: (job, range) => {
      if (job.freed.length < MAX_FREED_RANGES) job.freed.push(range)
      else job.freed.splice(0, job.freed.length, { first: 0, last: Number.POSITIVE_INFINITY, rank: null, ranksBelow: Number.POSITIVE_INFINITY })
    },

    dropIfIdle,
    end,

    sweep: (nowMs, ttlMs) => {
      let n = 0
      for (const p of all.values()) {
        if (nowMs - p.lastActivityMs > ttlMs) {
          release(p, "ttl")
          n++
        }
      }
      return n
    },

    clear: () => {
      for (const p of all.values()) unlockAll(p)
      all.clear()
      byPeer.clear()
    },

    stats: () => {
      let pendingJobs = 0
      for (const p of all.values()) if (p.job !== undefined) pendingJobs++
      return { pending: all.size, heldLocks, pendingJobs, peers: byPeer.size, released: { ...released } }
    },

    drainReleases: () => {
      const out = { counts: sinceDrain, peers: [...peersSinceDrain] }
      sinceDrain = zeroCounts()
      peersSinceDrain = new Set()
      return out
    }
  }
}
