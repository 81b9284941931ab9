/**
 * The pending-lookup table (src/services/server/internal/PendingLookups.ts,
 * issue 24 item 6): release order and counts under each bound, one lock per
 * object, the TTL at its exact boundary, and the bounded FREE_LOOKUP_LOCKS
 * memory of a running prefetch. Handles are plain objects; `unlocked`
 * records every handle the table gives back.
 */
import { assert, describe, it } from "@effect/vitest"
import {
  type LookupJob,
  makePendingLookups,
  MAX_FREED_RANGES,
  type PendingLookupLimits
} from "../../../src/services/server/internal/PendingLookups.ts"

interface Handle {
  readonly keyString: string
}

const tableOf = (limits: Partial<PendingLookupLimits> = {}) => {
  const unlocked: Array<string> = []
  const table = makePendingLookups<string, Handle>(
    { maxPendingLookups: 100, maxPendingLookupsPerPeer: 100, maxLookupLocks: 100, ...limits },
    (h) => unlocked.push(h.keyString)
  )
  /** A pending lookup of `id` from `peer` holding one lock per key in `keys` (with a job, as a LOOKUP that hit). */
  const lookup = (id: string, peer: string, keys: ReadonlyArray<string> = [], nowMs = 0) => {
    const p = table.admit(id, peer, nowMs)
    keys.forEach((k, i) => table.hold(p, k, i, 0, { keyString: k }))
    p.job = { hits: keys.length, freed: [] }
    return p
  }
  const ids = () => {
    const out: Array<string> = []
    for (const id of ["a0", "a1", "a2", "a3", "b0", "b1", "c0", "x"]) if (table.get(id) !== undefined) out.push(id)
    return out
  }
  return { table, unlocked, lookup, ids }
}

describe("PendingLookups", () => {
  it("per peer: the peer's oldest goes first, its locks unlocked; other peers keep theirs", () => {
    const { table, unlocked, lookup, ids } = tableOf({ maxPendingLookupsPerPeer: 2 })
    lookup("b0", "b", ["kb"])
    lookup("a0", "a", ["k0"])
    lookup("a1", "a", ["k1"])
    lookup("a2", "a", ["k2"])
    assert.deepStrictEqual(ids(), ["a1", "a2", "b0"])
    assert.deepStrictEqual(unlocked, ["k0"])
    lookup("a3", "a")
    assert.deepStrictEqual(ids(), ["a2", "a3", "b0"])
    assert.deepStrictEqual(unlocked, ["k0", "k1"])
    assert.deepStrictEqual(table.stats(), {
      pending: 3,
      heldLocks: 2,
      pendingJobs: 3,
      peers: 2,
      released: { ttl: 0, max_pending_lookups_per_peer: 2, max_pending_lookups: 0, max_lookup_locks: 0 }
    })
    assert.deepStrictEqual(table.drainReleases(), {
      counts: { ttl: 0, max_pending_lookups_per_peer: 2, max_pending_lookups: 0, max_lookup_locks: 0 },
      peers: ["a"]
    })
    // Drained: the next drain is empty, the totals stand.
    assert.deepStrictEqual(table.drainReleases().counts, { ttl: 0, max_pending_lookups_per_peer: 0, max_pending_lookups: 0, max_lookup_locks: 0 })
    assert.strictEqual(table.stats().released.max_pending_lookups_per_peer, 2)
  })

  it("per server: the oldest of anyone goes; re-admission makes an id the newest and moves it to its new peer", () => {
    const { table, lookup, ids } = tableOf({ maxPendingLookups: 3, maxPendingLookupsPerPeer: 2 })
    lookup("a0", "a")
    lookup("a1", "a")
    lookup("b0", "b")
    table.admit("a0", "b", 0) // a0 is now b's, and the newest
    assert.deepStrictEqual([table.get("a0")?.peer, table.stats().peers], ["b", 2])
    lookup("c0", "c") // 4 > 3: a1, the oldest, goes
    assert.deepStrictEqual(ids(), ["a0", "b0", "c0"])
    lookup("b1", "b") // b has b0, a0, b1: its oldest (b0) goes for the per-peer bound; then 3 = 3
    assert.deepStrictEqual(ids(), ["a0", "b1", "c0"])
    assert.deepStrictEqual(table.stats().released, { ttl: 0, max_pending_lookups_per_peer: 1, max_pending_lookups: 1, max_lookup_locks: 0 })
  })

  it("locks: room is made by releasing the oldest others; what is left for the newest is all it may take", () => {
    const { table, unlocked, lookup, ids } = tableOf({ maxLookupLocks: 4 })
    lookup("a0", "a", ["k0", "k1"])
    lookup("a1", "a", ["k2"])
    const p = table.admit("b0", "b", 0)
    assert.strictEqual(table.makeRoomForLocks(1, p), 1) // 3 + 1 = 4: fits, nothing released
    assert.deepStrictEqual(ids(), ["a0", "a1", "b0"])
    assert.strictEqual(table.lockRoom(), 1)
    table.hold(p, "k3", 0, 0, { keyString: "k3" })
    assert.strictEqual(table.makeRoomForLocks(3, p), 3) // 4 + 3 > 4: a0 (2 locks) and a1 (1) go
    assert.deepStrictEqual(ids(), ["b0"])
    assert.deepStrictEqual(unlocked, ["k0", "k1", "k2"])
    assert.strictEqual(table.makeRoomForLocks(10, p), 3) // nobody else to release: 4 − 1 held
    assert.strictEqual(table.stats().released.max_lookup_locks, 2)
  })

  it("re-admission replaces: the earlier lookup of the id is ended (its locks unlocked, its count gone), not counted as a release", () => {
    const { table, unlocked, lookup } = tableOf()
    const first = lookup("x", "a", ["k0", "k1"])
    const second = table.admit("x", "a", 5)
    assert.notStrictEqual(second, first)
    assert.deepStrictEqual([unlocked, second.locks.size, second.job, second.lastActivityMs], [["k0", "k1"], 0, undefined, 5])
    assert.deepStrictEqual(table.stats(), {
      pending: 1,
      heldLocks: 0,
      pendingJobs: 0,
      peers: 1,
      released: { ttl: 0, max_pending_lookups_per_peer: 0, max_pending_lookups: 0, max_lookup_locks: 0 }
    })
  })

  it("one lock per object: a second handle on an object already held is given back at once", () => {
    const { table, unlocked } = tableOf()
    const p = table.admit("x", "a", 0)
    table.hold(p, "k", 0, 0, { keyString: "k" })
    table.hold(p, "k", 0, 0, { keyString: "k" })
    assert.deepStrictEqual([table.stats().heldLocks, unlocked], [1, ["k"]])
  })

  it("take passes a lock to the caller; a lookup with no lock and no unreported count is dropped", () => {
    const { table, unlocked, lookup } = tableOf()
    const p = lookup("x", "a", ["k0", "k1"])
    assert.deepStrictEqual(table.take(p, "k0"), { keyString: "k0" })
    assert.strictEqual(table.take(p, "k0"), undefined)
    p.job = undefined
    table.dropIfIdle(p)
    assert.isDefined(table.get("x"))
    table.unlockWhere(p, (held) => held.key === "k1")
    assert.isUndefined(table.get("x"))
    assert.deepStrictEqual([unlocked, table.stats().heldLocks, table.stats().peers], [["k1"], 0, 0])
  })

  it("ttl: released when idle strictly longer than the TTL, counted; activity restarts the wait", () => {
    const { table, lookup, ids } = tableOf()
    lookup("a0", "a", ["k0"], 0)
    lookup("a1", "a", ["k1"], 0)
    table.get("a1")!.lastActivityMs = 500
    assert.strictEqual(table.sweep(1000, 1000), 0)
    assert.strictEqual(table.sweep(1001, 1000), 1)
    assert.deepStrictEqual(ids(), ["a1"])
    assert.strictEqual(table.sweep(1501, 1000), 1)
    assert.deepStrictEqual(table.stats().released, { ttl: 2, max_pending_lookups_per_peer: 0, max_pending_lookups: 0, max_lookup_locks: 0 })
  })

  it("a running prefetch remembers at most MAX_FREED_RANGES frees; past it one range covers everything", () => {
    const { table } = tableOf()
    const job: LookupJob = { hits: null, freed: [] }
    for (let i = 0; i < MAX_FREED_RANGES; i++) table.rememberFreed(job, { first: i, last: i + 1, rank: 0, ranksBelow: 1 })
    assert.strictEqual(job.freed.length, MAX_FREED_RANGES)
    table.rememberFreed(job, { first: 99, last: 100, rank: 3, ranksBelow: 4 })
    assert.deepStrictEqual(job.freed, [{ first: 0, last: Number.POSITIVE_INFINITY, rank: null, ranksBelow: Number.POSITIVE_INFINITY }])
  })

  it("end and clear unlock everything", () => {
    const { table, unlocked, lookup } = tableOf()
    table.end(lookup("a0", "a", ["k0"]))
    lookup("a1", "b", ["k1", "k2"])
    table.clear()
    assert.deepStrictEqual([unlocked, table.stats().pending, table.stats().heldLocks, table.stats().peers], [["k0", "k1", "k2"], 0, 0, 0])
  })
})
