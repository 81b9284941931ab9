/**
 * The tenant guard of Tenancy.ts (docs/security.md; issue 14 item 4, issue
 * 24 items 3 and 13, issue 25 item 1): every handler row wrapped so that an
 * op speaks only for the tenant its connection bound in HELLO.
 *
 * - Before decoding (`admit`): a peer without a tenant gets `forbidden`
 *   (`field: "hello"`), nothing decoded for it.
 * - Ownership: an instance's owner lives in its registry entries (the
 *   targets'), inserted with the entry and released with it by the entry's
 *   one finalizer (InstanceOwner.ts); an op naming another tenant's instance
 *   is `forbidden` and changes nothing; a PING of it answers `true` and
 *   touches nothing. CLEAR needs `admin`.
 * - Namespaces: every CacheKey's `cache_salt` and `request_id`, and every
 *   request id, is prefixed with the tenant's salt group.
 * - Released ids: an id nothing holds any more stays bound to its last
 *   tenant for the registration grace (ReleasedIds.ts).
 * - Limits per tenant on REGISTER: instances, REGISTERs per second (a bucket
 *   refilled on the Clock), mapped bytes (the sum of its entries' owners);
 *   over one, `overloaded` naming its flag.
 *
 * @internal
 */
import { Clock, Effect } from "effect"
import { formatInstanceId, type InstanceId } from "../../../schema/InstanceId.ts"
import { Clear, Hello, HelloChallenge, type Op, Ping } from "../../../schema/Op.ts"
import { instanceIdOf, opFields } from "../../../schema/OpMeta.ts"
import { memfdSegmentKey, type TensorDescriptor } from "../../../schema/TensorDescriptor.ts"
import { Forbidden, Overloaded, type WireError } from "../../../schema/WireError.ts"
import { type InstanceOwner, notYours, type ReleaseReason as EntryReleaseReason, RequestSaltGroup, RequestTenant } from "../../liveness/InstanceOwner.ts"
import type { LivenessTarget } from "../../liveness/LivenessTarget.ts"
import type { HandlerRow, HandlerTable, RequestContext } from "../../server/Handler.ts"
import type { TenantLimits } from "../../server/ServerConfig.ts"
import type { TenantGrant } from "../AuthorizedKeys.ts"
import { makeReleasedIds, RELEASED_IDS_MAX, type ReleasedBinding } from "../ReleasedIds.ts"

/** Bytes of worker memory `descriptors` map: each distinct segment (shm name, passed memfd or IPC handle) once. */
export const mappedBytesOf = (descriptors: ReadonlyArray<TensorDescriptor>): number => {
  const segments = new Map<string, number>()
  for (const d of descriptors) {
    const name = d.kind === "cpu_shm"
      ? `shm:${d.shm_name}`
      : d.kind === "cpu_memfd"
      ? memfdSegmentKey(d.fd_token ?? new Uint8Array(), d.fd_index ?? 0)
      : `ipc:${Buffer.from(d.ipc_handle ?? new Uint8Array()).toString("hex")}`
    segments.set(name, Math.max(segments.get(name) ?? 0, d.nbytes))
  }
  let total = 0
  for (const n of segments.values()) total += n
  return total
}

/** What the server's storage keys see of a tenant's `cache_salt` / `request_id`: its salt group first. */
export const namespaced = (saltGroup: string, value: string): string => `${saltGroup}|${value}`

/** The `tenants` block of `/api/status`, one row per tenant holding instances or connections. */
export interface TenantStatus {
  readonly tenant: string
  readonly admin: boolean
  readonly salt_group: string
  readonly instances: number
  readonly mapped_bytes: number
  readonly connections: number
}

/** The guard half of Tenancy with CURVE on. */
export interface TenantGuard {
  /** The table with every row but HELLO's behind the tenant checks; `targets` hold the owners. */
  readonly guard: (table: HandlerTable, targets: ReadonlyArray<LivenessTarget>) => HandlerTable
  /** The tenant owning `id` (the owner of any of its entries), or undefined. */
  readonly tenantOf: (id: InstanceId) => Effect.Effect<string | undefined>
  /** The `tenants` rows: owned entries, with `grants` (admin, salt group) and `connections` (one grant per bound peer). */
  readonly tenants: (grants: Iterable<TenantGrant>, connections: ReadonlyArray<TenantGrant>) => Effect.Effect<ReadonlyArray<TenantStatus>>
  /** The `released_ids` block: held, dropped, max, grace. */
  readonly releasedIds: () => { readonly held: number; readonly dropped: number; readonly max: number; readonly grace_seconds: number }
}

/**
 * A guard for `limits`, with released ids bound for `graceSeconds`; `grantOf`
 * says which tenant a peer's connection speaks for (Handshake.ts).
 */
export const makeTenantGuard = (options: {
  readonly limits: TenantLimits
  readonly graceSeconds: number
  readonly grantOf: (peer: string) => TenantGrant | undefined
}): TenantGuard => {
  const { grantOf, graceSeconds, limits } = options
  /** Ids nothing holds any more, bound to their last tenant for the registration grace (issue 24 item 13). */
  const released = makeReleasedIds({ graceMs: graceSeconds * 1000, maxRecords: RELEASED_IDS_MAX })
  /** tenant → register bucket: tokens left and when last refilled. */
  const buckets = new Map<string, { tokens: number; atMs: number }>()
  let targets: ReadonlyArray<LivenessTarget> = []

  const anyHolds = (id: InstanceId) =>
    Effect.map(Effect.forEach(targets, (t) => t.holdsInstance(id)), (held) => held.some(Boolean))

  /** The owner of `id`: its entries' (every entry of an id has the same tenant: the guard lets no other register one). */
  const ownerOf = (id: InstanceId) =>
    Effect.gen(function*() {
      for (const t of targets) {
        const o = yield* t.ownerOf(id)
        if (o !== undefined) return o
      }
      return undefined
    })

  /** The owner of `id`'s entry of `kind`, if it holds one. */
  const ownerOfKind = (id: InstanceId, kind: string) =>
    Effect.gen(function*() {
      for (const t of targets) if (t.kind === kind) return yield* t.ownerOf(id)
      return undefined
    })

  /** Every owned entry of every target. */
  const allOwned = Effect.suspend(() => Effect.map(Effect.forEach(targets, (t) => t.owners()), (all) => all.flat()))

  /** `tenant`'s instances (distinct ids) and mapped bytes (every entry's), as the entries' owners say. */
  const holdingsOf = (tenant: string) =>
    Effect.map(allOwned, (owned) => {
      const ids = new Set<InstanceId>()
      let mappedBytes = 0
      for (const { id, owner } of owned) {
        if (owner.tenant !== tenant) continue
        ids.add(id)
        mappedBytes += owner.mappedBytes
      }
      return { ids, mappedBytes }
    })

  /**
   * The owner a REGISTER's new entry is inserted with. Its `release`, run by
   * the entry's one finalizer: when nothing holds `id` any more, the id
   * stays bound to `tenant` for the registration grace (issue 24 item 13);
   * at shutdown nothing is remembered.
   */
  const ownerFor = (tenant: string, mappedBytes: number): InstanceOwner => ({
    tenant,
    mappedBytes,
    release: (id: InstanceId, reason: EntryReleaseReason) =>
      reason === "shutdown"
        ? Effect.void
        : Effect.gen(function*() {
          if (yield* anyHolds(id)) return
          released.remember(id, tenant, reason, yield* Clock.currentTimeMillis)
        })
  })

  /** Takes one REGISTER token of `tenant`'s bucket; false when empty. */
  const takeRegisterToken = (tenant: string, nowMs: number): boolean => {
    const rate = limits.maxRegistersPerSecond
    const b = buckets.get(tenant) ?? { tokens: rate, atMs: nowMs }
    b.tokens = Math.min(rate, b.tokens + ((nowMs - b.atMs) / 1000) * rate)
    b.atMs = nowMs
    buckets.set(tenant, b)
    if (b.tokens < 1) return false
    b.tokens -= 1
    return true
  }

  const overloaded = (op: string, flag: string, limit: string, actual: string) =>
    new Overloaded({
      op,
      field: flag,
      expected: limit,
      actual,
      message: `${op}: over the tenant limit --${flag} (${limit}; ${actual}); retry later or raise the limit`
    })

  /** Another tenant released `id` within the grace: its REGISTER is refused, saying when the id frees. */
  const boundElsewhere = (op: string, id: InstanceId, b: ReleasedBinding, nowMs: number) => {
    const what = b.reason === "reap" ? "was reaped" : b.reason === "fault" ? "was released after a fault in its memory" : "was unregistered"
    const ago = `${(nowMs - b.releasedAtMs) / 1000} s ago`
    return new Forbidden({
      op,
      instance_id: formatInstanceId(id),
      field: "instance_id",
      expected: `an id no other tenant released within the registration grace (${graceSeconds} s)`,
      actual: `another tenant's instance, ${what} ${ago}`,
      message:
        `${op}: instance ${formatInstanceId(id)} belongs to another tenant: it ${what} ${ago}, and an id stays bound to its last tenant for the registration grace (--worker-registration-grace-seconds ${graceSeconds}) after its UNREGISTER or reap; it frees in ${(b.untilMs - nowMs) / 1000} s. Nothing was changed; register under another id`
    })
  }

  /** `payload` with every CacheKey's cache_salt and every request id in the tenant's salt group. */
  const rewrite = (op: Op, payload: ReadonlyArray<unknown>, group: string): ReadonlyArray<unknown> => {
    const { keys: keyAt, requestIds: ridAt } = opFields(op)
    if (keyAt.length === 0 && ridAt.length === 0) return payload
    const out = [...payload]
    for (const i of keyAt) {
      const k = out[i] as { readonly cache_salt: string; readonly request_id: string }
      out[i] = { ...k, cache_salt: namespaced(group, k.cache_salt), request_id: namespaced(group, k.request_id) }
    }
    for (const i of ridAt) out[i] = namespaced(group, out[i] as string)
    return out
  }

  const guardRow = (r: HandlerRow): HandlerRow => {
    if (r.op.id === HelloChallenge.id || r.op.id === Hello.id) return r
    const op = r.op
    const registers = op.registers
    const mappedAt = opFields(op).mapped
    const unbound = () =>
      new Forbidden({
        op: op.name,
        field: "hello",
        message: `${op.name}: this connection has not said HELLO with an authorized key (hello_challenge, then hello)`
      })
    // Before the payload is decoded (issue 24 item 3): a peer without a tenant gets nothing decoded for it.
    const admit = (ctx: RequestContext): WireError | undefined => grantOf(ctx.peer) === undefined ? unbound() : undefined
    const handle = (payload: ReadonlyArray<unknown>, ctx: RequestContext): Effect.Effect<unknown, WireError> => {
      const grant = grantOf(ctx.peer)
      if (grant === undefined) return Effect.fail(unbound())
      // The module's own look-up checks the owner again, in the same step as it acts (RequestTenant): what this
      // guard saw may change before the module looks (another tenant's REGISTER landing in between).
      return guarded(payload, ctx, grant).pipe(
        Effect.provideService(RequestTenant, grant.tenant),
        Effect.provideService(RequestSaltGroup, grant.admin ? undefined : grant.saltGroup)
      )
    }
    const guarded = (payload: ReadonlyArray<unknown>, ctx: RequestContext, grant: TenantGrant): Effect.Effect<unknown, WireError> =>
      Effect.gen(function*() {
        if (op.id === Clear.id && !grant.admin) {
          return yield* new Forbidden({ op: op.name, field: "tenant", expected: "admin", actual: grant.tenant, message: `clear: tenant ${grant.tenant} is not admin` })
        }
        const id = instanceIdOf(op, payload)
        const owner = id === undefined ? undefined : yield* ownerOf(id)
        if (id !== undefined && owner !== undefined && owner.tenant !== grant.tenant) {
          if (op.id === Ping.id) {
            // A stranger's PING answers like any PING but touches nothing and binds nothing (it cannot keep
            // another tenant's dead instance alive).
            ctx.skipBinding = true
            return true
          }
          return yield* notYours(op.name, id)
        }
        const rewritten = rewrite(op, payload, grant.saltGroup)
        // An UNREGISTER needs nothing more: the entry's finalizer tells its owner, which binds the released id.
        if (id === undefined || registers === undefined) return yield* r.handle(rewritten, ctx)
        const now = yield* Clock.currentTimeMillis
        if (owner === undefined) {
          const binding = released.bindingOf(id, now)
          if (binding !== undefined && binding.tenant !== grant.tenant) return yield* boundElsewhere(op.name, id, binding, now)
        }
        if (!takeRegisterToken(grant.tenant, now)) {
          return yield* overloaded(
            op.name,
            "tenant-max-registers-per-second",
            `${limits.maxRegistersPerSecond} per second`,
            `tenant ${grant.tenant} registered faster`
          )
        }
        const holdings = yield* holdingsOf(grant.tenant)
        if (owner === undefined) {
          const held = holdings.ids.size - (holdings.ids.has(id) ? 1 : 0)
          if (held >= limits.maxInstances) {
            return yield* overloaded(op.name, "tenant-max-instances", `${limits.maxInstances} instances`, `tenant ${grant.tenant} holds ${held}`)
          }
        }
        const bytes = mappedAt === undefined ? 0 : mappedBytesOf(payload[mappedAt] as ReadonlyArray<TensorDescriptor>)
        // This kind's entry of the id, if held, is what this REGISTER refreshes or replaces: not counted twice.
        const others = holdings.mappedBytes - ((yield* ownerOfKind(id, registers))?.mappedBytes ?? 0)
        if (others + bytes > limits.maxMappedBytes) {
          return yield* overloaded(
            op.name,
            "tenant-max-mapped-bytes",
            `${limits.maxMappedBytes} bytes`,
            `tenant ${grant.tenant} maps ${others} and asks for ${bytes} more`
          )
        }
        // The owner goes in with the entry the module inserts (one step; InstanceModule.ts): no claim beside it.
        const result = yield* r.handle(rewritten, { ...ctx, owner: ownerFor(grant.tenant, bytes) })
        // Held again by its tenant: the binding's work is done (a failed REGISTER keeps it).
        released.forget(id)
        return result
      })
    // No fast answer under tenancy (issue 16): every request passes the HELLO and owner checks above.
    return { op: r.op, pool: r.pool, handle, admit }
  }

  const guard = (table: HandlerTable, all: ReadonlyArray<LivenessTarget>): HandlerTable => {
    targets = all
    return { rows: table.rows, byId: new Map([...table.byId].map(([id, r]) => [id, guardRow(r)] as const)) }
  }

  const tenants = (grants: Iterable<TenantGrant>, connections: ReadonlyArray<TenantGrant>) =>
    Effect.map(allOwned, (owned) => {
      const all = [...grants]
      const rows = new Map<string, TenantStatus>()
      const rowOf = (tenant: string): TenantStatus => {
        const grant = all.find((g) => g.tenant === tenant)
        return rows.get(tenant) ??
          { tenant, admin: grant?.admin ?? false, salt_group: grant?.saltGroup ?? tenant, instances: 0, mapped_bytes: 0, connections: 0 }
      }
      const counted = new Set<string>()
      for (const { id, owner } of owned) {
        const r = rowOf(owner.tenant)
        // An instance once, however many kinds it registered; its bytes per kind.
        const first = !counted.has(`${owner.tenant}\u0000${id}`)
        counted.add(`${owner.tenant}\u0000${id}`)
        rows.set(owner.tenant, { ...r, instances: r.instances + (first ? 1 : 0), mapped_bytes: r.mapped_bytes + owner.mappedBytes })
      }
      for (const g of connections) {
        const r = rowOf(g.tenant)
        rows.set(g.tenant, { ...r, connections: r.connections + 1 })
      }
      return [...rows.values()].sort((a, b) => a.tenant.localeCompare(b.tenant))
    })

  return {
    guard,
    tenantOf: (id) => Effect.map(ownerOf(id), (o) => o?.tenant),
    tenants,
    releasedIds: () => ({ held: released.size(), dropped: released.dropped(), max: RELEASED_IDS_MAX, grace_seconds: graceSeconds })
  }
}
