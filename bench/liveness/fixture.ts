/**
 * Shared by the bench:liveness child programs (bench/liveness/scan-child.ts,
 * bench/liveness/heap-child.ts, bench/liveness/server-child.ts): random instance ids,
 * an InstanceRegistry filled with N tracked contexts, a LivenessTarget
 * around it built the way LmcacheDrivenTransfer builds its own, the
 * management module over that target, and two Effect helpers (`timed`,
 * `nextTurn`); the statistics are in bench/lib/stats.ts.
 *
 * Only for benchmarks.
 */
import { layerModulesTestBare } from "../../src/layers/Server.ts"
import { randomBytes } from "node:crypto"
import { Clock, Effect, Exit, Scope } from "effect"
import { formatInstanceId, makeInstanceId, type InstanceId } from "../../src/schema/InstanceId.ts"
import { makeInstanceRegistry, type InstanceRegistry, type StaleRule, type Tracked } from "../../src/services/liveness/InstanceRegistry.ts"
import type { LivenessTarget } from "../../src/services/liveness/LivenessTarget.ts"
import { RequestBarrier } from "../../src/services/liveness/RequestBarrier.ts"
import type { ServerConfigInput } from "../../src/services/server/ServerConfig.ts"

/**
 * Windows of every in-process scan of this bench (seconds). Long on purpose:
 * the management module's own reaper then scans every 900 s, i.e. never
 * during a run, so every scan measured is one the bench started. The
 * windows only decide which entries are stale; the work of judging an entry
 * is the same for any value above 0.
 */
export const WINDOWS = {
  workerReapTimeoutSeconds: 3600,
  workerRegistrationGraceSeconds: 3600,
  workerDisconnectGraceSeconds: 3600
} as const satisfies Partial<ServerConfigInput>

/** Last-seen offset that makes an entry stale under {@link WINDOWS} (twice the longest window). */
export const STALE_AGE_MS = 2 * 3600 * 1000

/** The rule the reaper builds from {@link WINDOWS}, judging at `nowMs`, no suspects. */
export const ruleAt = (nowMs: number, suspects: ReadonlyMap<bigint, number> = new Map()): StaleRule => ({
  nowMs,
  reapTimeoutMs: WINDOWS.workerReapTimeoutSeconds * 1000,
  registrationGraceMs: WINDOWS.workerRegistrationGraceSeconds * 1000,
  suspects,
  disconnectGraceMs: WINDOWS.workerDisconnectGraceSeconds * 1000
})

const MASK_63 = (1n << 63n) - 1n

/** `n` distinct random 63-bit instance ids, as workers make them (DESIGN §6). */
export const randomIds = (n: number): Array<InstanceId> => {
  const seen = new Set<bigint>()
  const ids: Array<InstanceId> = []
  while (ids.length < n) {
    const buf = randomBytes(8 * (n - ids.length))
    for (let off = 0; off < buf.length; off += 8) {
      const v = buf.readBigUInt64LE(off) & MASK_63
      if (seen.has(v)) continue
      seen.add(v)
      ids.push(makeInstanceId(v))
    }
  }
  return ids
}

/** A small stand-in for a context: its own Scope (closed on release, like a ContextEntry's) and a number. */
export interface DummyContext {
  readonly n: number
  readonly scope: Scope.Closeable
}

/** A filled registry, the module scope its contexts fork from, and their ids. */
export interface Filled {
  readonly registry: InstanceRegistry<DummyContext>
  readonly moduleScope: Scope.Closeable
  readonly ids: ReadonlyArray<InstanceId>
  /** Inserts `id` again (after a pop), silent for `ageMs` at `nowMs`. */
  readonly reinsert: (id: InstanceId, nowMs: number, ageMs: number) => Effect.Effect<void>
}

const dummyContext = (moduleScope: Scope.Closeable, n: number) =>
  Effect.map(Scope.fork(moduleScope), (scope): DummyContext => ({ n, scope }))

/** An InstanceRegistry with `n` fresh entries (last seen at the current Clock time, both flags clear). */
export const fillRegistry = (n: number): Effect.Effect<Filled> =>
  Effect.gen(function*() {
    const registry = yield* makeInstanceRegistry<DummyContext>()
    const moduleScope = yield* Scope.make()
    const ids = randomIds(n)
    const now = yield* Clock.currentTimeMillis
    for (let i = 0; i < n; i++) {
      const inserted = yield* registry.insert(ids[i]!, yield* dummyContext(moduleScope, i), now)
      if (!inserted) return yield* Effect.die(new Error(`duplicate id ${formatInstanceId(ids[i]!)}`))
    }
    const reinsert = (id: InstanceId, nowMs: number, ageMs: number) =>
      Effect.gen(function*() {
        yield* registry.insert(id, yield* dummyContext(moduleScope, -1), nowMs - ageMs)
      })
    return { registry, moduleScope, ids, reinsert }
  })

/**
 * A LivenessTarget over `registry`, built like LmcacheDrivenTransfer's:
 * PING touches, a reap pops stale entries in one transaction and then
 * closes each popped context's Scope outside it.
 */
export const registryTarget = (registry: InstanceRegistry<DummyContext>): LivenessTarget => ({
  name: "bench_registry",
  kind: "kv_cache",
  touchInstance: (id) => Effect.flatMap(Clock.currentTimeMillis, (now) => Effect.asVoid(registry.touch(id, now))),
  touchInstanceNow: registry.touchNow,
  holdsInstance: (id) => Effect.map(registry.get(id), (t) => t !== undefined),
  ownerOf: () => Effect.succeed(undefined),
  owners: () => Effect.succeed([]),
  reapStaleInstances: (rule) =>
    Effect.gen(function*() {
      const stale = yield* registry.popStale(rule)
      yield* Effect.forEach(stale, (r) => Scope.close(r.tracked.resource.scope, Exit.void), { discard: true })
      return stale.map((r) => ({ id: r.tracked.id, reason: r.reason, silentMs: r.silentMs, windowMs: r.windowMs }))
    }),
  trackedInstanceCount: () => registry.size(),
  dropInstanceState: () => Effect.void,
  instances: () =>
    Effect.map(registry.snapshot(), (all) =>
      all.map((t: Tracked<DummyContext>) => ({
        instance_id: formatInstanceId(t.id),
        kind: "kv_cache" as const,
        last_seen_age_seconds: 0,
        has_liveness_signal: t.hasLivenessSignal,
        has_transfer_activity: t.hasTransferActivity,
        details: {}
      })))
})

/**
 * The management module (and the connection tracker, request barrier,
 * configuration) driving `targets`, as the server assembles it, without
 * sockets. `config` is applied over {@link WINDOWS}.
 */
export const managementLayer = (targets: ReadonlyArray<LivenessTarget>, config: Partial<ServerConfigInput> = {}) =>
  layerModulesTestBare({
    config: { ...WINDOWS, ...config },
    plugins: targets.map((target) => ({ name: target.name, rows: [], target })),
    barrier: RequestBarrier.layer
  })

/** Runs `self` and returns its result and its wall time in ms. */
export const timed = <A, E, R>(self: Effect.Effect<A, E, R>): Effect.Effect<readonly [A, number], E, R> =>
  Effect.gen(function*() {
    const t0 = performance.now()
    const a = yield* self
    return [a, performance.now() - t0] as const
  })

/** Resolves on the next turn of the event loop (after I/O callbacks). */
export const nextTurn = Effect.promise(() => new Promise<void>((resolve) => setImmediate(resolve)))
