/**
 * The per-instance core of the server modules that hold state for each
 * worker instance (DESIGN §4–§5): the LMCache-driven contexts, the
 * engine-driven (context, strategy) pairs and Blend's RoPE state. Each of
 * them builds one of these and keeps only its own logic (what an entry is,
 * how to acquire it, what "the same memory" means, its ops).
 *
 * **Entries.** An entry is whatever the module acquired for one instance,
 * owned by a child Scope of the module's scope (`InstanceEntry.scope`). The
 * core holds the entries by id and owns their one finalizer,
 * {@link releaseEntry} (closing that Scope: it waits for copies in flight on
 * the entry's mappings, then unmaps), followed by its owner's `release`.
 * UNREGISTER, a reap, a fault release, a replace and server shutdown each
 * pop the entry first and then release it, so it runs exactly once
 * whichever gets there first.
 *
 * **Owners** (issue 25 item 1, InstanceOwner.ts): a REGISTER's
 * `RegisterRequest.owner` (the tenant and the bytes it maps, from the
 * tenant guard) is inserted with the entry in the same step (the
 * registry's transaction; the mirror's synchronous set) and popped with
 * it, so an entry never exists without its owner and no owner outlives its
 * entry.
 *
 * **REGISTER of an id** (one path for every module):
 * - held, and the module says the request describes the same memory: a
 *   no-op that refreshes last_seen (`Unchanged`). If the entry is gone by
 *   the time of the refresh (a reap popped it after the look-up), the id is
 *   registered anew instead of answering success with nothing held;
 * - held with different memory: a tracked module refuses it with
 *   `invalid_argument` (DESIGN §5: a process never inherits another's
 *   context); a mirror replaces the entry (upstream assigns
 *   `_cb_rope_state[id]`), releasing the old one after the new one is in;
 * - otherwise the module's `acquire` runs in a fresh child Scope (closed
 *   again when it fails: nothing stays mapped) and the entry is inserted.
 *
 * **Two kinds of module.**
 * - {@link makeTrackedInstances}: the entries are an InstanceRegistry, so
 *   they carry liveness (last_seen and both flags); the module is a liveness
 *   target of its registration kind (`registryTarget`: PING touches, a reap
 *   pops and releases), and a transfer through an entry latches its
 *   transfer activity.
 * - {@link makeMirroredInstances}: state that mirrors another module's
 *   instance (Blend's RoPE state mirrors the kv_cache context); a plain map
 *   with no liveness of its own (upstream BlendModule): its target only
 *   answers `holdsInstance` for PING_REGISTERED and drops a reaped
 *   instance's entry in `dropInstanceState`.
 *
 * Both release every entry at server shutdown through the same finalizer.
 */
import { Clock, Effect, Exit, Scope } from "effect"
import { formatInstanceId, type InstanceId } from "../../schema/InstanceId.ts"
import type { RegistrationKind } from "../../schema/Registration.ts"
import { type Forbidden, InvalidArgument, NotRegistered } from "../../schema/WireError.ts"
import { admits, type InstanceOwner, notYours, type ReleaseReason, RequestTenant } from "../liveness/InstanceOwner.ts"
import { makeInstanceRegistry, type Tracked } from "../liveness/InstanceRegistry.ts"
import { type InstanceSummary, type LivenessTarget, noopTarget, type ReapedInstance, registryTarget } from "../liveness/LivenessTarget.ts"

// ---------------------------------------------------------------------------
// models
// ---------------------------------------------------------------------------

/** One instance's entry: resources owned by a child Scope of the module's scope. */
export interface InstanceEntry {
  /** Owns the entry's resources; closed exactly once, by {@link releaseEntry}. */
  readonly scope: Scope.Closeable
}

/**
 * The one finalizer of an entry: closes its Scope (waiting for copies in
 * flight on its mappings, then unmapping). Idempotent; callers pop the entry
 * first so that only one of them gets here.
 */
export const releaseEntry = (entry: InstanceEntry): Effect.Effect<void> => Scope.close(entry.scope, Exit.void)

/** One popped entry and its owner. */
interface Held<R> {
  readonly entry: R
  readonly owner: InstanceOwner | undefined
}

/** The one finalizer with its owner: the entry's resources, then the owner told why (`reason`). */
const releaseHeld = <R extends InstanceEntry>(id: InstanceId, held: Held<R>, reason: ReleaseReason): Effect.Effect<void> =>
  Effect.andThen(releaseEntry(held.entry), held.owner === undefined ? Effect.void : held.owner.release(id, reason))

/** A REGISTER's module-specific half. */
export interface RegisterRequest<R extends InstanceEntry, E> {
  /** Whether the held entry describes what this request does (DESIGN §5 "same memory"); then REGISTER only refreshes. */
  readonly same: (held: R) => boolean
  /**
   * Validates the request and acquires the new entry's resources into
   * `scope` (the core closes it when this fails), returning the entry with
   * `scope` as its Scope.
   */
  readonly acquire: (scope: Scope.Closeable) => Effect.Effect<R, E>
  /**
   * Who registers it (the request context's `owner`, set by the tenant
   * guard; undefined without tenancy): inserted with a new entry. A REGISTER
   * answered `Unchanged` keeps the held entry's owner (the guard lets only
   * that tenant get there, with the same memory).
   */
  readonly owner?: InstanceOwner | undefined
}

/**
 * What a REGISTER did: `Unchanged` (the same memory was held: liveness
 * refreshed, nothing acquired) or `Registered` (a new entry; `replaced` is
 * the mirror entry it replaced, already released).
 */
export type Registration<R> =
  | { readonly _tag: "Unchanged"; readonly entry: R }
  | { readonly _tag: "Registered"; readonly entry: R; readonly replaced: R | undefined }

/** The per-instance core of one module. */
export interface InstanceModule<R extends InstanceEntry> {
  /**
   * REGISTER of `id` (the path of the module header). Fails with the
   * request's own errors, or InvalidArgument when a tracked module holds the
   * id with different memory or another REGISTER inserted it meanwhile.
   */
  readonly register: <E>(id: InstanceId, request: RegisterRequest<R, E>) => Effect.Effect<Registration<R>, E | InvalidArgument | Forbidden>
  /**
   * UNREGISTER (or, with `reason` "fault", a fault release): pops and
   * releases the entry, then tells its owner; returns it, undefined when the
   * id held none.
   */
  readonly unregister: (id: InstanceId) => Effect.Effect<R | undefined, Forbidden>
  /**
   * A fault release (the server's own, through a transfer already resolved
   * for its tenant): pops and releases the entry, then tells its owner
   * "fault"; returns it, undefined when the id held none.
   */
  readonly releaseFaulted: (id: InstanceId) => Effect.Effect<R | undefined>
  /**
   * The entry for a transfer through it (STORE, PREPARE_*, a CB retrieve …):
   * in a tracked module refreshes last_seen and latches transfer activity
   * (DESIGN §5). Fails with NotRegistered naming `op` when none, and under
   * tenancy with Forbidden when the entry is another tenant's (the owner is
   * read in the same step as the entry: InstanceOwner.ts `RequestTenant`).
   */
  readonly resolveForTransfer: (op: string, id: InstanceId) => Effect.Effect<R, NotRegistered | Forbidden>
  /** The entry of `id` without touching its liveness; undefined when none. */
  readonly get: (id: InstanceId) => Effect.Effect<R | undefined>
  readonly isRegistered: (id: InstanceId) => Effect.Effect<boolean>
  /** Every entry held now. */
  readonly entries: () => Effect.Effect<ReadonlyArray<R>>
  /** The module's NotRegistered for `op` on `id` (what `resolveForTransfer` fails with). */
  readonly notRegistered: (op: string, id: InstanceId) => NotRegistered
  /** The module as a liveness target (DESIGN §5). */
  readonly target: LivenessTarget
}

/** What both kinds of module are told. */
export interface InstanceModuleOptions {
  /** Module name: the target's, for logs. */
  readonly name: string
  /** The registration kind it answers for in PING_REGISTERED. */
  readonly kind: RegistrationKind
  /**
   * NotRegistered reads `<op>: instance <id> <missing> (never registered,
   * unregistered or reaped); <remedy>`, e.g. "has no engine-driven context"
   * and "register it again".
   */
  readonly missing: string
  readonly remedy: string
  /** The REGISTER op's wire name, prefixing its errors. */
  readonly registerOp: string
  /** The UNREGISTER op's wire name, prefixing its errors. */
  readonly unregisterOp: string
}

// ---------------------------------------------------------------------------
// constructors
// ---------------------------------------------------------------------------

/**
 * The core of a module whose entries carry liveness (LMCache-driven and
 * engine-driven transfer): an InstanceRegistry and its `registryTarget`; a
 * held id with different memory is refused.
 */
export const makeTrackedInstances = <R extends InstanceEntry>(options: InstanceModuleOptions & {
  /** What a refused REGISTER is "already registered with", e.g. "different memory or model". */
  readonly differs: string
  /** Module-specific details of an entry in `/api/status` (model, world size, layout …). */
  readonly details: (entry: R) => Record<string, unknown>
  /**
   * Runs after a reap released its entries (each through the one
   * finalizer), with each reaped id, its verdict and the entry it held:
   * what the module does beyond releasing (LMCache-driven transfer:
   * `--unlink-reaped-segments`, issue 13 item 3). Default: nothing.
   */
  readonly onReaped?: (reaped: ReadonlyArray<ReapedInstance & { readonly entry: R }>) => Effect.Effect<void>
}): Effect.Effect<InstanceModule<R>, never, Scope.Scope> =>
  Effect.gen(function*() {
    const registry = yield* makeInstanceRegistry<R>()
    const resourceOf = (t: Tracked<R> | undefined) => t?.resource
    const summary = (t: Tracked<R>, nowMs: number): InstanceSummary => ({
      instance_id: formatInstanceId(t.id),
      kind: options.kind,
      last_seen_age_seconds: Math.max(0, (nowMs - t.lastSeenMs) / 1000),
      has_liveness_signal: t.hasLivenessSignal,
      has_transfer_activity: t.hasTransferActivity,
      details: options.details(t.resource)
    })
    const heldOf = (t: Tracked<R> | undefined): Held<R> | undefined => t === undefined ? undefined : { entry: t.resource, owner: t.owner }
    return yield* makeCore(options, {
      get: (id) => Effect.map(registry.get(id), resourceOf),
      refresh: (id, nowMs) => Effect.map(registry.refresh(id, nowMs), (t) => t !== undefined),
      put: (id, entry, nowMs, owner) =>
        Effect.flatMap(registry.insert(id, entry, nowMs, owner), (inserted) =>
          inserted
            ? Effect.succeed({ replaced: undefined })
            : Effect.fail(
              new InvalidArgument({ message: `${options.registerOp}: instance ${formatInstanceId(id)} was registered concurrently` })
            )),
      resolve: (id, nowMs, tenant) =>
        Effect.map(registry.resolveOwnedForTransfer(id, nowMs, tenant), (t) => (t === "not_yours" ? t : resourceOf(t))),
      pop: (id, tenant) => Effect.map(registry.popOwned(id, tenant), (t) => (t === "not_yours" ? t : heldOf(t))),
      popAll: () => Effect.map(registry.popAll(), (all) => all.map((t) => ({ id: t.id, entry: t.resource, owner: t.owner }))),
      entries: () => Effect.map(registry.snapshot(), (all) => all.map((t) => t.resource)),
      refuse: (id) =>
        new InvalidArgument({
          message: `${options.registerOp}: instance ${formatInstanceId(id)} is already registered with ${options.differs}; unregister it first (a process never inherits another's context)`
        }),
      target: registryTarget({
        name: options.name,
        kind: options.kind,
        registry,
        release: (t, reason) => releaseHeld(t.id, { entry: t.resource, owner: t.owner }, reason),
        summary,
        ...(options.onReaped === undefined ? {} : { onReaped: options.onReaped })
      })
    })
  })

/** The core of a state mirror, with what only a mirror can do. */
export interface MirroredInstances<R extends InstanceEntry> extends InstanceModule<R> {
  /** Ids holding an entry, in no particular order; read synchronously. */
  readonly ids: () => ReadonlyArray<InstanceId>
  /**
   * Takes back an entry (what it mirrors went away meanwhile, `reason`
   * "unregister"; or a fault through it, "fault"): pops it if it is still
   * the one held, and releases it (telling its owner why); an entry no
   * longer held is only released.
   */
  readonly withdraw: (id: InstanceId, entry: R, reason: "unregister" | "fault") => Effect.Effect<void>
}

/**
 * The core of a state mirror (Blend's RoPE state): a map with no liveness
 * of its own; a held id with different arguments is replaced. Its target's
 * `dropInstanceState(id)` pops and releases a reaped instance's entry and
 * logs `dropped(<decimal id>)` at INFO.
 */
export const makeMirroredInstances = <R extends InstanceEntry>(options: InstanceModuleOptions & {
  readonly dropped: (idText: string) => string
}): Effect.Effect<MirroredInstances<R>, never, Scope.Scope> =>
  Effect.gen(function*() {
    // Every read and write is synchronous, hence atomic: an entry and its owner are set and deleted together.
    const held = new Map<InstanceId, Held<R>>()
    const popNow = (id: InstanceId) => {
      const h = held.get(id)
      held.delete(id)
      return h
    }
    const core = yield* makeCore(options, {
      get: (id) => Effect.sync(() => held.get(id)?.entry),
      refresh: (id) => Effect.sync(() => held.has(id)),
      put: (id, entry, _nowMs, owner) =>
        Effect.suspend(() => {
          const replaced = held.get(id)
          // Checked in the same synchronous step as the replacement: another tenant's entry is never replaced.
          if (replaced !== undefined && owner !== undefined && !admits(replaced.owner, owner.tenant)) {
            return Effect.fail(notYours(options.registerOp, id))
          }
          held.set(id, { entry, owner })
          return Effect.succeed({ replaced })
        }),
      resolve: (id, _nowMs, tenant) =>
        Effect.sync(() => {
          const h = held.get(id)
          return h === undefined ? undefined : admits(h.owner, tenant) ? h.entry : "not_yours"
        }),
      pop: (id, tenant) =>
        Effect.sync(() => {
          const h = held.get(id)
          return h !== undefined && !admits(h.owner, tenant) ? "not_yours" as const : popNow(id)
        }),
      popAll: () =>
        Effect.sync(() => {
          const all = [...held].map(([id, h]) => ({ id, ...h }))
          held.clear()
          return all
        }),
      entries: () => Effect.sync(() => [...held.values()].map((h) => h.entry)),
      refuse: undefined,
      target: {
        ...noopTarget(options.name),
        kind: options.kind,
        holdsInstance: (id) => Effect.sync(() => held.has(id)),
        ownerOf: (id) => Effect.sync(() => held.get(id)?.owner),
        owners: () => Effect.sync(() => [...held].flatMap(([id, h]) => (h.owner === undefined ? [] : [{ id, owner: h.owner }]))),
        dropInstanceState: (id) =>
          Effect.suspend(() => {
            const h = popNow(id)
            return h === undefined
              ? Effect.void
              : Effect.andThen(releaseHeld(id, h, "reap"), Effect.logInfo(options.dropped(formatInstanceId(id))))
          })
      }
    })
    return {
      ...core,
      ids: () => [...held.keys()],
      withdraw: (id, entry, reason) =>
        Effect.suspend(() => {
          const h = held.get(id)
          if (h?.entry !== entry) return releaseEntry(entry)
          held.delete(id)
          return releaseHeld(id, h, reason)
        })
    }
  })

/** Where a kind of module keeps its entries, and how it answers a held id. */
interface EntryStore<R> {
  readonly get: (id: InstanceId) => Effect.Effect<R | undefined>
  /** REGISTER of a held id with the same memory: refreshes; false when the id is no longer held. */
  readonly refresh: (id: InstanceId, nowMs: number) => Effect.Effect<boolean>
  /**
   * Inserts a new entry with its owner, in one step → the entry it replaced (and that one's owner). Fails
   * when it refuses a held id (inserted by another REGISTER meanwhile).
   */
  readonly put: (
    id: InstanceId,
    entry: R,
    nowMs: number,
    owner: InstanceOwner | undefined
  ) => Effect.Effect<{ readonly replaced: Held<R> | undefined }, InvalidArgument | Forbidden>
  /** The entry for a transfer served for `tenant`; "not_yours" (untouched) when it is another tenant's. */
  readonly resolve: (id: InstanceId, nowMs: number, tenant: string | undefined) => Effect.Effect<R | undefined | "not_yours">
  /** Pops the entry for a request served for `tenant`; "not_yours" (left held) when it is another tenant's. */
  readonly pop: (id: InstanceId, tenant: string | undefined) => Effect.Effect<Held<R> | undefined | "not_yours">
  readonly popAll: () => Effect.Effect<ReadonlyArray<Held<R> & { readonly id: InstanceId }>>
  readonly entries: () => Effect.Effect<ReadonlyArray<R>>
  /** The refusal of a held id with different memory; undefined: replace it. */
  readonly refuse: ((id: InstanceId) => InvalidArgument) | undefined
  readonly target: LivenessTarget
}

/** The machinery both kinds share, over their store; releases every entry when the module's scope closes. */
const makeCore = <R extends InstanceEntry>(
  options: InstanceModuleOptions,
  store: EntryStore<R>
): Effect.Effect<InstanceModule<R>, never, Scope.Scope> =>
  Effect.gen(function*() {
    const moduleScope = yield* Effect.scope
    // Server shutdown: every entry through the same finalizer.
    yield* Effect.addFinalizer(() =>
      Effect.flatMap(store.popAll(), (all) => Effect.forEach(all, (h) => releaseHeld(h.id, h, "shutdown"), { discard: true }))
    )

    const notRegistered = (op: string, id: InstanceId) =>
      new NotRegistered({
        op,
        instance_id: formatInstanceId(id),
        message: `${op}: instance ${formatInstanceId(id)} ${options.missing} (never registered, unregistered or reaped); ${options.remedy}`
      })

    const register = <E>(id: InstanceId, request: RegisterRequest<R, E>) =>
      Effect.gen(function*() {
        const now = yield* Clock.currentTimeMillis
        const held = yield* store.get(id)
        if (held !== undefined) {
          // Under tenancy a held entry is refreshed only for its own tenant (the guard looked earlier; this is
          // the look-up the refresh acts on).
          const tenant = yield* RequestTenant
          if (tenant !== undefined && !admits(yield* store.target.ownerOf(id), tenant)) return yield* notYours(options.registerOp, id)
          if (request.same(held)) {
            // The refresh says whether the entry is still held: a reap may have popped it since the look-up,
            // and then it is registered anew (never a success with nothing held).
            if (yield* store.refresh(id, now)) return { _tag: "Unchanged", entry: held } satisfies Registration<R>
          } else if (store.refuse !== undefined) {
            return yield* store.refuse(id)
          }
        }
        const scope = yield* Scope.fork(moduleScope)
        const entry = yield* request.acquire(scope).pipe(Effect.onError(() => Scope.close(scope, Exit.void)))
        const put = yield* store.put(id, entry, now, request.owner).pipe(Effect.onError(() => releaseEntry(entry)))
        // The replaced entry's owner is told too; the id is held again, so nothing is released on its behalf.
        if (put.replaced !== undefined) yield* releaseHeld(id, put.replaced, "unregister")
        return { _tag: "Registered", entry, replaced: put.replaced?.entry } satisfies Registration<R>
      })

    return {
      register,
      unregister: (id) =>
        Effect.gen(function*() {
          // The owner is checked in the pop itself: another tenant's entry is never popped.
          const held = yield* store.pop(id, yield* RequestTenant)
          if (held === "not_yours") return yield* notYours(options.unregisterOp, id)
          if (held === undefined) return undefined
          yield* releaseHeld(id, held, "unregister")
          return held.entry
        }),
      releaseFaulted: (id) =>
        Effect.flatMap(store.pop(id, undefined), (held) =>
          held === undefined || held === "not_yours" ? Effect.succeed(undefined) : Effect.as(releaseHeld(id, held, "fault"), held.entry)),
      resolveForTransfer: (op, id) =>
        Effect.gen(function*() {
          const entry = yield* store.resolve(id, yield* Clock.currentTimeMillis, yield* RequestTenant)
          if (entry === undefined) return yield* notRegistered(op, id)
          if (entry === "not_yours") return yield* notYours(op, id)
          return entry
        }),
      get: store.get,
      isRegistered: (id) => Effect.map(store.get(id), (entry) => entry !== undefined),
      entries: store.entries,
      notRegistered,
      target: store.target
    }
  })
