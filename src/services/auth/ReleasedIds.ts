/**
 * Instance ids that stay bound to the tenant that last held them (issue 24
 * item 13; docs/security.md "Tenant rules"). Threat: tenant B registering
 * the id tenant A just released (a clean UNREGISTER, or a reap after a pause
 * or a lost connection), so that A's re-REGISTER of its own id is
 * `forbidden` and A's worker is locked out of its identity.
 *
 * Rule: after the last registration of an id is released, the id stays
 * bound to its tenant for the registration grace
 * (`--worker-registration-grace-seconds`, default 3600 s), the window the
 * server already gives a registered instance that has not proven itself
 * alive: only that tenant may register it meanwhile (and so get it back
 * after a pause that got it reaped), and the binding ends when the tenant
 * registers it again or the grace has passed (strictly: `now − released >
 * grace`, as for the reaper's windows).
 *
 * Memory: at most `maxRecords` bindings. Past it, expired ones go first,
 * then the oldest binding of the tenant holding the most, so one tenant's
 * churn of fresh ids only ever pushes out its own bindings; a binding pushed
 * out early frees its id early (counted in `dropped`). Time is the caller's
 * Clock (TestClock in tests); nothing here reads the clock or forks.
 *
 * The bindings are not ownership: they hold no resource and name only ids
 * no target holds any more, so they stay beside the owners, which live in
 * the registry entries (issue 25 item 1, InstanceOwner.ts); an entry's
 * finalizer tells its owner, and Tenancy remembers the binding here.
 */
import type { InstanceId } from "../../schema/InstanceId.ts"

/**
 * What released an id: an UNREGISTER (an op whose `unregisters` is set)
 * leaving nothing held, a reap, or a fault release (a copy found the
 * worker's memory gone, issue 13 item 1; issue 25 item 1).
 */
export type ReleaseReason = "unregister" | "reap" | "fault"

/** One id's binding: its tenant, when and why it was released (Clock ms), and when the binding ends. */
export interface ReleasedBinding {
  readonly tenant: string
  readonly reason: ReleaseReason
  readonly releasedAtMs: number
  /** The binding holds while `now ≤ untilMs` (= releasedAtMs + grace). */
  readonly untilMs: number
}

/** The bookkeeping; every method is synchronous and O(1) amortised, except a sweep past the bound (O(tenants)). */
export interface ReleasedIds {
  /** `tenant` released `id` at `nowMs`: binds it until `nowMs + grace`, replacing an older binding of the id. */
  readonly remember: (id: InstanceId, tenant: string, reason: ReleaseReason, nowMs: number) => void
  /** The binding of `id` in force at `nowMs`; undefined when there is none (never bound, expired, pushed out). */
  readonly bindingOf: (id: InstanceId, nowMs: number) => ReleasedBinding | undefined
  /** Ends the binding of `id` (its tenant registered it again). */
  readonly forget: (id: InstanceId) => void
  /** Bindings held (expired ones not yet swept included). */
  readonly size: () => number
  /** Bindings pushed out before their grace ended, because of `maxRecords`. */
  readonly dropped: () => number
}

/** Default bound on the bindings held: 65,536, about 11 MiB of heap when full (docs/security.md, item 13). */
export const RELEASED_IDS_MAX = 65_536

/** An empty `ReleasedIds` with a grace of `graceMs` and at most `maxRecords` (≥ 1) bindings. */
export const makeReleasedIds = (options: { readonly graceMs: number; readonly maxRecords: number }): ReleasedIds => {
  const { graceMs, maxRecords } = options
  /** id → its tenant, to find the binding. */
  const tenantOfId = new Map<InstanceId, string>()
  /** tenant → its bindings in release order (a Map keeps insertion order; `remember` re-inserts). */
  const byTenant = new Map<string, Map<InstanceId, ReleasedBinding>>()
  let dropped = 0

  const remove = (id: InstanceId) => {
    const tenant = tenantOfId.get(id)
    if (tenant === undefined) return
    tenantOfId.delete(id)
    const mine = byTenant.get(tenant)!
    mine.delete(id)
    if (mine.size === 0) byTenant.delete(tenant)
  }

  /** Drops `tenant`'s expired bindings; they sit at the front (release order = expiry order). */
  const sweep = (tenant: string, nowMs: number) => {
    const mine = byTenant.get(tenant)
    if (mine === undefined) return
    for (const [id, b] of mine) {
      if (nowMs <= b.untilMs) break
      remove(id)
    }
  }

  /** Past the bound: expired bindings first, then the oldest of the tenant holding the most. */
  const enforceBound = (nowMs: number) => {
    if (tenantOfId.size <= maxRecords) return
    for (const tenant of [...byTenant.keys()]) sweep(tenant, nowMs)
    while (tenantOfId.size > maxRecords) {
      let largest: Map<InstanceId, ReleasedBinding> | undefined
      for (const mine of byTenant.values()) if (largest === undefined || mine.size > largest.size) largest = mine
      const oldest = largest!.keys().next().value!
      remove(oldest)
      dropped++
    }
  }

  return {
    remember: (id, tenant, reason, nowMs) => {
      remove(id)
      sweep(tenant, nowMs)
      const mine = byTenant.get(tenant) ?? new Map<InstanceId, ReleasedBinding>()
      byTenant.set(tenant, mine)
      mine.set(id, { tenant, reason, releasedAtMs: nowMs, untilMs: nowMs + graceMs })
      tenantOfId.set(id, tenant)
      enforceBound(nowMs)
    },
    bindingOf: (id, nowMs) => {
      const tenant = tenantOfId.get(id)
      if (tenant === undefined) return undefined
      const b = byTenant.get(tenant)!.get(id)!
      if (nowMs <= b.untilMs) return b
      remove(id)
      return undefined
    },
    forget: remove,
    size: () => tenantOfId.size,
    dropped: () => dropped
  }
}
