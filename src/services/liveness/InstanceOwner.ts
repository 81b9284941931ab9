/**
 * Who registered an instance's entry (issue 25 item 1; docs/security.md
 * "Tenant rules"): part of what a REGISTER creates, inserted with the entry
 * in the same transaction, and gone with it — popped by UNREGISTER, a reap,
 * a fault release or shutdown, each through the entry's one finalizer
 * (InstanceModule.ts), which then runs the owner's `release`.
 *
 * Threat it answers: when the owner lived in a map beside the registries, a
 * reap's fan-out could delete it while the same worker's re-REGISTER was
 * still mapping memory, and the instance then registered with no owner (any
 * tenant could STORE into, RETRIEVE from or UNREGISTER it); a fault release
 * never told that map, so the tenant's mapped bytes leaked against
 * `--tenant-max-mapped-bytes`. Here there is one copy of the fact: the entry.
 */
import { Context, type Effect } from "effect"
import { formatInstanceId, type InstanceId } from "../../schema/InstanceId.ts"
import { Forbidden } from "../../schema/WireError.ts"

/** What released an entry, as its finalizer tells the owner. */
export type ReleaseReason = "unregister" | "reap" | "fault" | "shutdown"

/** The owner of one entry (one registration kind of one instance). */
export interface InstanceOwner {
  /** The tenant whose connection registered it (Tenancy's HELLO binding). */
  readonly tenant: string
  /** Bytes of worker memory this entry maps (each distinct segment once), counted against `--tenant-max-mapped-bytes`. */
  readonly mappedBytes: number
  /**
   * Run by the entry's one finalizer once its resources are released
   * (`reason`: which path popped it): Tenancy binds the id to `tenant` for
   * the registration grace when nothing holds it any more (ReleasedIds.ts).
   * Never fails.
   */
  readonly release: (id: InstanceId, reason: ReleaseReason) => Effect.Effect<void>
}

/**
 * The tenant a request is served for (issue 25 item 1): provided by the
 * tenant guard around every handler it passes a request to, undefined
 * without tenancy. The per-instance core reads it where it resolves an entry
 * for a transfer or replaces one, in the same step as the look-up, so no
 * request of one tenant reaches an entry of another even when that entry is
 * inserted after the guard looked (there is no check-then-use window).
 */
export const RequestTenant = Context.Reference<string | undefined>("mpcache/services/liveness/RequestTenant", {
  defaultValue: () => undefined
})

/**
 * The salt group whose records a request may read from the KV event log (issue 28 item 3): provided by the
 * tenant guard beside {@link RequestTenant} — the tenant's group, or undefined for an admin (every group's);
 * undefined without tenancy.
 */
export const RequestSaltGroup = Context.Reference<string | undefined>("mpcache/services/liveness/RequestSaltGroup", {
  defaultValue: () => undefined
})

/**
 * Whether a request served for `tenant` may use an entry owned by `owner`:
 * always without tenancy (`tenant` undefined); under tenancy only its own
 * tenant's entry, and never an entry without an owner (fail closed).
 */
export const admits = (owner: InstanceOwner | undefined, tenant: string | undefined): boolean =>
  tenant === undefined || owner?.tenant === tenant

/**
 * The refusal of a request that names another tenant's instance
 * (`forbidden`, field `instance_id`; docs/security.md "Tenant rules").
 */
export const notYours = (op: string, id: InstanceId): Forbidden =>
  new Forbidden({
    op,
    instance_id: formatInstanceId(id),
    field: "instance_id",
    message: `${op}: instance ${formatInstanceId(id)} belongs to another tenant; nothing was changed`
  })
