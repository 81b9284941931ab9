/**
 * The liveness interface (DESIGN §5; upstream `InstanceLivenessTarget`):
 * every module that owns per-instance state implements these four methods,
 * each a no-op by default, and only the management module drives them.
 */
import { Context, Effect, Layer } from "effect"
import type { InstanceId } from "../schema/InstanceId.ts"

/** Reap windows in seconds. */
export interface ReapWindows {
  /** Applies to entries with both liveness flags latched. */
  readonly reapTimeoutSeconds: number
  /** Applies to every other entry (startup, idle after start, legacy clients). */
  readonly registrationGraceSeconds: number
}

/** A module holding per-instance state. */
export interface LivenessTarget {
  /** Module name, for logs and status. */
  readonly name: string
  /** PING named `id`: refresh `last_seen` and latch the liveness signal. An unknown id never inserts. */
  readonly touchInstance: (id: InstanceId) => Effect.Effect<void>
  /** Pops and releases the stale entries; returns their ids. */
  readonly reapStaleInstances: (windows: ReapWindows) => Effect.Effect<ReadonlyArray<InstanceId>>
  /** Entries this module tracks. */
  readonly trackedInstanceCount: () => Effect.Effect<number>
  /** Another module reaped `id`: drop whatever this module mirrors for it. */
  readonly dropInstanceState: (id: InstanceId) => Effect.Effect<void>
}

/** A target that does nothing: the default for every method (upstream's protocol defaults). */
export const noopTarget = (name: string): LivenessTarget => ({
  name,
  touchInstance: () => Effect.void,
  reapStaleInstances: () => Effect.succeed([]),
  trackedInstanceCount: () => Effect.succeed(0),
  dropInstanceState: () => Effect.void
})

/** Every liveness target of the server, collected by the server assembly. */
export class LivenessTargets extends Context.Service<LivenessTargets, ReadonlyArray<LivenessTarget>>()(
  "mpcache/services/LivenessTargets"
) {
  static readonly layer = (targets: ReadonlyArray<LivenessTarget>) => Layer.succeed(this, targets)
  /** No module tracks instances yet. */
  static readonly layerEmpty = Layer.succeed(this, [])
}
