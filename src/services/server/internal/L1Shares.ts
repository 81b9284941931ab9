/**
 * Tenants share L1 by weight (issue 27 item 2). With tenancy on, every L1 object belongs to the salt group its
 * key's `cache_salt` is namespaced under (TenantGuard's `namespaced`: `<group>|<salt>`; the tenants of one group
 * share its chunks, so they share its L1 bytes too). Each group has a weight, the sum of its tenants' weights
 * (`--tenant-l1-share-default`, `l1-share=W` in the authorized-keys file). A group's share of L1 is the capacity
 * times its weight over the weights of the groups holding L1 bytes now (and the one asking for room): an idle
 * group's share is lent to the others.
 *
 * Threat: one tenant storing far more than it re-reads. With one LRU for everyone, a tenant writing 10× its share
 * in a loop pushed every other tenant's working set out of L1; its neighbours' hit ratio fell to what its own
 * churn left them.
 *
 * Rule: when L1 must evict, it takes first from the group furthest over its share (bytes / share), least
 * recently used first within it, recomputing after each object; and a group asking for room while it is (or
 * would be) over its own share only ever takes from groups over theirs: a group under its share never loses a
 * chunk to a group over its share. When nothing more may be taken, the placement is refused (L1 full for it).
 *
 * Plain bookkeeping, synchronous, owned by the L1 store (L1Store.ts) that calls it on every extent it reserves
 * and releases.
 */

/** What the order needs of an eviction candidate: its group and its extent (headroom and bytes). */
export interface ShareCandidate {
  readonly owner: string
  readonly extent: { readonly length: number }
}

/** One group's row for status and metrics. */
export interface GroupShare {
  /** The salt group (the tenant's name unless it shares a group). */
  readonly group: string
  /** Bytes its objects hold (committed and reserved). */
  readonly bytes: number
  readonly weight: number
  /** Its share now, bytes: capacity × weight / the weights of the groups holding bytes. */
  readonly shareBytes: number
  /** Its objects evicted since start. */
  readonly evictions: number
}

export interface L1Shares {
  /** The group an object of this (namespaced) `cache_salt` belongs to. */
  readonly ownerOf: (cacheSalt: string) => string
  /** An extent of `bytes` was reserved for `owner`. */
  readonly added: (owner: string, bytes: number) => void
  /** An extent of `bytes` of `owner` was released; `evicted` when eviction took it. */
  readonly removed: (owner: string, bytes: number, evicted: boolean) => void
  /**
   * `candidates` (evictable objects, least recently used first) in the order the rule evicts them to make room
   * of `needed` bytes for `requester`: possibly a prefix of them, where the rule forbids taking more, and no
   * longer than it takes to free `enough` bytes (the caller asks for `needed` first, for everything when the free
   * space is fragmented).
   */
  readonly evictionOrder: <C extends ShareCandidate>(candidates: ReadonlyArray<C>, requester: string, needed: number, enough: number) => Array<C>
  /** Every group that holds bytes or was ever evicted from, by group name. */
  readonly groups: () => Array<GroupShare>
  /** Evictions per group since the last call (for the metrics' counters). */
  readonly takeEvictions: () => ReadonlyMap<string, number>
}

/**
 * The bookkeeping of an L1 of `capacityBytes` whose groups weigh `weightOf(group)` (> 0; read at each decision, so
 * a reloaded authorized-keys file counts from the next one).
 */
export const makeL1Shares = (capacityBytes: number, weightOf: (group: string) => number): L1Shares => {
  const bytes = new Map<string, number>()
  const evictions = new Map<string, number>()
  let unreported = new Map<string, number>()

  const weight = (g: string): number => {
    const w = weightOf(g)
    return Number.isFinite(w) && w > 0 ? w : 1
  }
  /** Each group's share, bytes, among the groups holding bytes and `also`. */
  const sharesAmong = (also: string | undefined): Map<string, number> => {
    const groups = new Set<string>()
    for (const [g, b] of bytes) if (b > 0) groups.add(g)
    if (also !== undefined) groups.add(also)
    let total = 0
    for (const g of groups) total += weight(g)
    const out = new Map<string, number>()
    for (const g of groups) out.set(g, (capacityBytes * weight(g)) / total)
    return out
  }

  return {
    ownerOf: (cacheSalt) => {
      const bar = cacheSalt.indexOf("|")
      return bar < 0 ? "" : cacheSalt.slice(0, bar)
    },
    added: (owner, n) => {
      bytes.set(owner, (bytes.get(owner) ?? 0) + n)
    },
    removed: (owner, n, evicted) => {
      const left = (bytes.get(owner) ?? 0) - n
      if (left > 0) bytes.set(owner, left)
      else bytes.delete(owner)
      if (evicted) {
        evictions.set(owner, (evictions.get(owner) ?? 0) + 1)
        unreported.set(owner, (unreported.get(owner) ?? 0) + 1)
      }
    },
    evictionOrder: (candidates, requester, needed, enough) => {
      const share = sharesAmong(requester)
      const used = new Map<string, number>()
      for (const g of share.keys()) used.set(g, bytes.get(g) ?? 0)
      // Each group's candidates, least recently used first.
      const queues = new Map<string, { readonly items: Array<(typeof candidates)[number]>; next: number }>()
      for (const c of candidates) {
        let q = queues.get(c.owner)
        if (q === undefined) {
          q = { items: [], next: 0 }
          queues.set(c.owner, q)
        }
        q.items.push(c)
      }
      const ratio = (g: string): number => (used.get(g) ?? 0) / (share.get(g) ?? capacityBytes)
      const requesterOver = (used.get(requester) ?? 0) + needed > (share.get(requester) ?? capacityBytes)
      const order: Array<(typeof candidates)[number]> = []
      let freed = 0
      for (;;) {
        let pick: string | undefined
        for (const [g, q] of queues) if (q.next < q.items.length && (pick === undefined || ratio(g) > ratio(pick))) pick = g
        if (pick === undefined) break
        // A group over its share takes only from groups over theirs (itself included).
        if (requesterOver && pick !== requester && ratio(pick) <= 1) break
        const q = queues.get(pick)!
        const c = q.items[q.next++]!
        used.set(pick, (used.get(pick) ?? 0) - c.extent.length)
        order.push(c)
        freed += c.extent.length
        if (freed >= enough) break
      }
      return order
    },
    takeEvictions: () => {
      const taken = unreported
      unreported = new Map()
      return taken
    },
    groups: () => {
      const share = sharesAmong(undefined)
      const names = new Set([...bytes.keys(), ...evictions.keys()])
      return [...names].sort().map((group) => ({
        group,
        bytes: bytes.get(group) ?? 0,
        weight: weight(group),
        shareBytes: share.get(group) ?? 0,
        evictions: evictions.get(group) ?? 0
      }))
    }
  }
}
