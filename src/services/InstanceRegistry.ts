/**
 * Per-instance liveness state of one module (DESIGN §5; upstream
 * `ContextEntry.last_seen` / `has_liveness_signal` and #4732's
 * `has_transfer_activity`), held in transactional state: scan-and-pop,
 * insert, pop and the transfer lookup are each one transaction, so a reap
 * and a re-register of the same id, or a reap and a transfer, never
 * interleave inside one of them. Side effects (closing an entry's Scope,
 * logging) happen outside, after the pop.
 *
 * The rule (DESIGN §5): an entry's window is the reap timeout when both
 * flags are latched, the registration grace otherwise; it is stale when it
 * has been silent strictly longer than its window. An instance that lost
 * every connection (`suspects`) is also stale once it has been silent
 * longer than the disconnect grace since it became suspect.
 */
import { Effect, HashMap, Option, TxHashMap } from "effect"
import type { InstanceId } from "../schema/InstanceId.ts"

/** Entries judged between two yields to the event loop during a scan. */
const SCAN_SLICE = 1_024

/** One turn of the event loop (setImmediate): received messages get handled before the scan goes on. */
const yieldToEventLoop = Effect.promise(() => new Promise<void>((resolve) => setImmediate(resolve)))

/** One tracked instance and the resource it owns (a context entry, an entry + strategy pair …). */
export interface Tracked<R> {
  readonly id: InstanceId
  readonly resource: R
  /** Clock millis of the last REGISTER, PING or transfer naming the id. */
  readonly lastSeenMs: number
  /** Latched by PING / PING_REGISTERED naming the id. */
  readonly hasLivenessSignal: boolean
  /** Latched by a real transfer through the entry. */
  readonly hasTransferActivity: boolean
}

/** Why an instance was reaped. */
export type ReapReason = "timeout" | "grace" | "disconnect"

/** What one scan judges by. Times in Clock millis. */
export interface StaleRule {
  /** The time the scan judges at (already net of the server's own stalls). */
  readonly nowMs: number
  /** Reap timeout; 0 disables the two heartbeat windows. */
  readonly reapTimeoutMs: number
  readonly registrationGraceMs: number
  /** Instances with no connected routing id left, and since when. */
  readonly suspects: ReadonlyMap<bigint, number>
  /** 0 disables disconnect reaping. */
  readonly disconnectGraceMs: number
}

/** One popped stale instance, for the reaper's WARNING. */
export interface Reaped<R> {
  readonly tracked: Tracked<R>
  readonly reason: ReapReason
  /** How long it had been silent (for disconnect: since it became suspect), ms. */
  readonly silentMs: number
  /** The window it outlived, ms. */
  readonly windowMs: number
}

/** Judges one entry; undefined when it is not stale. */
export const judge = <R>(t: Tracked<R>, rule: StaleRule): Reaped<R> | undefined => {
  const silentMs = rule.nowMs - t.lastSeenMs
  const suspectSince = rule.suspects.get(t.id)
  if (rule.disconnectGraceMs > 0 && suspectSince !== undefined) {
    const since = Math.max(suspectSince, t.lastSeenMs)
    if (rule.nowMs - since > rule.disconnectGraceMs) {
      return { tracked: t, reason: "disconnect", silentMs: rule.nowMs - since, windowMs: rule.disconnectGraceMs }
    }
  }
  if (rule.reapTimeoutMs <= 0) return undefined
  const proven = t.hasLivenessSignal && t.hasTransferActivity
  const windowMs = proven ? rule.reapTimeoutMs : rule.registrationGraceMs
  return silentMs > windowMs ? { tracked: t, reason: proven ? "timeout" : "grace", silentMs, windowMs } : undefined
}

export interface InstanceRegistry<R> {
  /** Inserts a new entry (both flags clear) unless the id is held; false when it was. */
  readonly insert: (id: InstanceId, resource: R, nowMs: number) => Effect.Effect<boolean>
  /** REGISTER of a held id (no-op path): refreshes last_seen only. */
  readonly refresh: (id: InstanceId, nowMs: number) => Effect.Effect<Tracked<R> | undefined>
  /** PING naming the id: refreshes last_seen and latches the liveness signal. Never inserts. */
  readonly touch: (id: InstanceId, nowMs: number) => Effect.Effect<boolean>
  /** A transfer through the entry: refreshes last_seen and latches transfer activity. */
  readonly resolveForTransfer: (id: InstanceId, nowMs: number) => Effect.Effect<Tracked<R> | undefined>
  readonly get: (id: InstanceId) => Effect.Effect<Tracked<R> | undefined>
  /** Removes and returns the entry (UNREGISTER). */
  readonly pop: (id: InstanceId) => Effect.Effect<Tracked<R> | undefined>
  /** Removes every stale entry in one transaction and returns them with their reasons. */
  readonly popStale: (rule: StaleRule) => Effect.Effect<ReadonlyArray<Reaped<R>>>
  /** Removes and returns every entry (shutdown). */
  readonly popAll: () => Effect.Effect<ReadonlyArray<Tracked<R>>>
  readonly size: () => Effect.Effect<number>
  readonly snapshot: () => Effect.Effect<ReadonlyArray<Tracked<R>>>
}

/** An empty registry. */
export const makeInstanceRegistry = <R>(): Effect.Effect<InstanceRegistry<R>> =>
  Effect.gen(function*() {
    const map = yield* TxHashMap.empty<bigint, Tracked<R>>()

    const update = (id: InstanceId, f: (t: Tracked<R>) => Tracked<R>) =>
      Effect.tx(Effect.gen(function*() {
        const current = yield* TxHashMap.get(map, id)
        if (Option.isNone(current)) return undefined
        const next = f(current.value)
        yield* TxHashMap.set(map, id, next)
        return next
      }))

    return {
      insert: (id, resource, nowMs) =>
        Effect.tx(Effect.gen(function*() {
          if (yield* TxHashMap.has(map, id)) return false
          yield* TxHashMap.set(map, id, { id, resource, lastSeenMs: nowMs, hasLivenessSignal: false, hasTransferActivity: false })
          return true
        })),
      refresh: (id, nowMs) => update(id, (t) => ({ ...t, lastSeenMs: Math.max(t.lastSeenMs, nowMs) })),
      touch: (id, nowMs) =>
        Effect.map(
          update(id, (t) => ({ ...t, lastSeenMs: Math.max(t.lastSeenMs, nowMs), hasLivenessSignal: true })),
          (t) => t !== undefined
        ),
      resolveForTransfer: (id, nowMs) =>
        update(id, (t) => ({ ...t, lastSeenMs: Math.max(t.lastSeenMs, nowMs), hasTransferActivity: true })),
      get: (id) => Effect.map(TxHashMap.get(map, id), Option.getOrUndefined),
      pop: (id) =>
        Effect.tx(Effect.gen(function*() {
          const current = yield* TxHashMap.get(map, id)
          if (Option.isNone(current)) return undefined
          yield* TxHashMap.remove(map, id)
          return current.value
        })),
      popStale: (rule) =>
        Effect.gen(function*() {
          // Judge an immutable snapshot in slices, letting the event loop in between (a PING must not wait
          // behind a scan of 100k entries), then pop the candidates in one transaction that judges each
          // again: an entry touched meanwhile stays.
          const snapshot = yield* TxHashMap.snapshot(map)
          const candidates: Array<bigint> = []
          let seen = 0
          for (const t of HashMap.values(snapshot)) {
            if (judge(t, rule) !== undefined) candidates.push(t.id)
            if (++seen % SCAN_SLICE === 0) yield* yieldToEventLoop
          }
          if (candidates.length === 0) return []
          return yield* Effect.tx(Effect.gen(function*() {
            const stale: Array<Reaped<R>> = []
            for (const id of candidates) {
              const current = yield* TxHashMap.get(map, id)
              if (Option.isNone(current)) continue
              const verdict = judge(current.value, rule)
              if (verdict !== undefined) stale.push(verdict)
            }
            if (stale.length > 0) yield* TxHashMap.removeMany(map, stale.map((r) => r.tracked.id))
            return stale
          }))
        }),
      popAll: () =>
        Effect.tx(Effect.gen(function*() {
          const all = yield* TxHashMap.values(map)
          yield* TxHashMap.clear(map)
          return all
        })),
      size: () => TxHashMap.size(map),
      snapshot: () => TxHashMap.values(map)
    }
  })
