/**
 * The liveness interface (DESIGN §5; upstream `InstanceLivenessTarget`):
 * every module that owns per-instance state implements it, each method a
 * no-op by default (`noopTarget`). Two services drive the targets: the
 * management module (PING touches them, PING_REGISTERED asks which kinds
 * they hold) and the reaper (Reaper.ts: pops their stale entries, then tells
 * every target to drop what it mirrors for each reaped id).
 *
 * Where mpcache differs from upstream's signature: `reapStaleInstances`
 * takes the whole rule of one scan (its judging time, both windows, and the
 * instances that lost their connections) and returns why each id was
 * reaped, so the reaper can log one WARNING with the seconds silent, the
 * window and the reason.
 */
import { Clock, Context, Effect, Layer } from "effect"
import type { InstanceId } from "../../schema/InstanceId.ts"
import type { RegistrationKind } from "../../schema/Registration.ts"
import type { InstanceOwner, ReleaseReason } from "./InstanceOwner.ts"
import type { InstanceRegistry, StaleRule, Tracked } from "./InstanceRegistry.ts"
import type { Verdict } from "./Rule.ts"

/** One instance a target reaped and its verdict (reason, ms silent, window ms). */
export interface ReapedInstance extends Verdict {
  readonly id: InstanceId
}

/** One tracked instance as `/api/status` lists it (DESIGN §5). */
export interface InstanceSummary {
  readonly instance_id: string
  readonly kind: RegistrationKind
  readonly last_seen_age_seconds: number
  readonly has_liveness_signal: boolean
  readonly has_transfer_activity: boolean
  /** Module-specific details (model, world size, layout …). */
  readonly details: Record<string, unknown>
}

/** A module holding per-instance state. */
export interface LivenessTarget {
  /** Module name, for logs. */
  readonly name: string
  /** The registration kind it answers for in PING_REGISTERED; undefined for state mirrors. */
  readonly kind: RegistrationKind | undefined
  /** PING naming `id`: refresh last_seen and latch the liveness signal. An unknown id never inserts. */
  readonly touchInstance: (id: InstanceId) => Effect.Effect<void>
  /**
   * `touchInstance` done synchronously at `nowMs` (Clock millis), for the MQ server's fast path (issue 25
   * item 4): true when it touched, false when it holds nothing for `id` (done either way), undefined when it
   * cannot be done now; then `touchInstance` must run. A target that overrides `touchInstance` overrides this too.
   */
  readonly touchInstanceNow: (id: InstanceId, nowMs: number) => boolean | undefined
  /** Whether it holds state for `id`. */
  readonly holdsInstance: (id: InstanceId) => Effect.Effect<boolean>
  /** The owner of its entry for `id` (issue 25 item 1); undefined when it holds none or the entry has no owner. */
  readonly ownerOf: (id: InstanceId) => Effect.Effect<InstanceOwner | undefined>
  /** Every entry it holds that has an owner, with its id (a tenant's instances and mapped bytes). */
  readonly owners: () => Effect.Effect<ReadonlyArray<OwnedInstance>>
  /** Pops the entries stale under `rule`, releases each through the UNREGISTER finalizer, returns them. */
  readonly reapStaleInstances: (rule: StaleRule) => Effect.Effect<ReadonlyArray<ReapedInstance>>
  /** Entries this module tracks. */
  readonly trackedInstanceCount: () => Effect.Effect<number>
  /** Another module reaped `id`: drop whatever this module mirrors for it. */
  readonly dropInstanceState: (id: InstanceId) => Effect.Effect<void>
  /** Its tracked instances, for status. */
  readonly instances: () => Effect.Effect<ReadonlyArray<InstanceSummary>>
}

/** One owned entry of a target. */
export interface OwnedInstance {
  readonly id: InstanceId
  readonly owner: InstanceOwner
}

/** A target that does nothing: the default of every method (upstream's protocol defaults). */
export const noopTarget = (name: string): LivenessTarget => ({
  name,
  kind: undefined,
  touchInstance: () => Effect.void,
  touchInstanceNow: () => false,
  holdsInstance: () => Effect.succeed(false),
  ownerOf: () => Effect.succeed(undefined),
  owners: () => Effect.succeed([]),
  reapStaleInstances: () => Effect.succeed([]),
  trackedInstanceCount: () => Effect.succeed(0),
  dropInstanceState: () => Effect.void,
  instances: () => Effect.succeed([])
})

/** Every liveness target of the server, collected by the server assembly. */
export class LivenessTargets extends Context.Service<LivenessTargets, ReadonlyArray<LivenessTarget>>()(
  "mpcache/services/LivenessTargets"
) {
  static readonly layer = (targets: ReadonlyArray<LivenessTarget>) => Layer.succeed(this, targets)
  /** No module tracks instances. */
  static readonly layerEmpty = Layer.succeed(this, [])
  /**
   * For tests: one in-memory target ({@link heldTarget}) holding the ids in
   * `held`, a Set the test edits to register and release instances.
   */
  static readonly layerTest = (held: Set<bigint>, options: HeldTargetOptions = {}) =>
    Layer.succeed(this, [heldTarget("test", held, options)])
}

/** What an in-memory test target answers for and records. */
export interface HeldTargetOptions {
  /** The registration kind it answers for in PING_REGISTERED (default none: it answers for no kind). */
  readonly kind?: RegistrationKind
  /** Each `touchInstance` call's id, in order (held or not: the target decides, as a real one does). */
  readonly touched?: Array<bigint>
  /** Each `reapStaleInstances` call's judging time (`rule.nowMs`), in order. */
  readonly scans?: Array<number>
}

/**
 * An in-memory target for tests: holds exactly the ids in `held` (the test
 * adds and deletes them), counts them, drops an id from `held` on
 * `dropInstanceState`, and records touches and scans in `options`. It reaps
 * nothing by itself and owns nothing.
 */
export const heldTarget = (name: string, held: Set<bigint>, options: HeldTargetOptions = {}): LivenessTarget => ({
  ...noopTarget(name),
  kind: options.kind,
  touchInstance: (id) => Effect.sync(() => void options.touched?.push(id)),
  holdsInstance: (id) => Effect.sync(() => held.has(id)),
  reapStaleInstances: (rule) => Effect.sync(() => (options.scans?.push(rule.nowMs), [])),
  trackedInstanceCount: () => Effect.sync(() => held.size),
  dropInstanceState: (id) => Effect.sync(() => void held.delete(id))
})

/**
 * The liveness target of a module whose per-instance state is an
 * InstanceRegistry: PING touches the registry; a reap pops the stale entries
 * in one transaction and releases each through `release` (the module's one
 * finalizer, shared with UNREGISTER, fault release and shutdown, told the
 * reason "reap"), then runs `onReaped` with each reaped id, its verdict and
 * the entry it held (what the module does beyond releasing). This is the
 * one reap path of every tracked module (issue 25 item 3).
 */
export const registryTarget = <R>(options: {
  readonly name: string
  readonly kind: RegistrationKind
  readonly registry: InstanceRegistry<R>
  readonly release: (tracked: Tracked<R>, reason: ReleaseReason) => Effect.Effect<void>
  readonly summary: (tracked: Tracked<R>, nowMs: number) => InstanceSummary
  readonly onReaped?: (reaped: ReadonlyArray<ReapedInstance & { readonly entry: R }>) => Effect.Effect<void>
}): LivenessTarget => {
  const { registry, release, onReaped } = options
  return {
    name: options.name,
    kind: options.kind,
    touchInstance: (id) => Effect.flatMap(Clock.currentTimeMillis, (now) => Effect.asVoid(registry.touch(id, now))),
    // The registry's own: no call in between (the fast path's chain is counted, MqServer internal/FastPath.ts).
    touchInstanceNow: registry.touchNow,
    holdsInstance: (id) => Effect.map(registry.get(id), (t) => t !== undefined),
    ownerOf: (id) => Effect.map(registry.get(id), (t) => t?.owner),
    owners: () =>
      Effect.map(registry.snapshot(), (all) => all.flatMap((t) => (t.owner === undefined ? [] : [{ id: t.id, owner: t.owner }]))),
    reapStaleInstances: (rule) =>
      Effect.gen(function*() {
        const stale = yield* registry.popStale(rule)
        yield* Effect.forEach(stale, (r) => release(r.tracked, "reap"), { discard: true })
        const reaped = stale.map((r) => ({ id: r.tracked.id, reason: r.reason, silentMs: r.silentMs, windowMs: r.windowMs }))
        if (onReaped !== undefined && stale.length > 0) {
          yield* onReaped(stale.map((r, i) => ({ ...reaped[i]!, entry: r.tracked.resource })))
        }
        return reaped
      }),
    trackedInstanceCount: () => registry.size(),
    dropInstanceState: () => Effect.void,
    instances: () =>
      Effect.gen(function*() {
        const now = yield* Clock.currentTimeMillis
        return (yield* registry.snapshot()).map((t) => options.summary(t, now))
      })
  }
}
