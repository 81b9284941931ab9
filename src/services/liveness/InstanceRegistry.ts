/**
 * Per-instance liveness state of one module (DESIGN §5; upstream
 * `ContextEntry.last_seen` / `has_liveness_signal` and #4732's
 * `has_transfer_activity`), held in transactional state: scan-and-pop,
 * insert, pop and the transfer lookup are each one transaction, so a reap
 * and a re-register of the same id, or a reap and a transfer, never
 * interleave inside one of them. Side effects (closing an entry's Scope,
 * logging) happen outside, after the pop.
 *
 * The rule (windows, staleness, states) is Rule.ts's; {@link judge} applies
 * it to one entry.
 *
 * A scan does not walk every entry: a non-transactional index of lower
 * bounds on when each entry can become stale (StaleIndex.ts) hands it the
 * few that might be, and the suspects are judged directly. The results are
 * those of judging every entry with {@link judge}. The index is updated
 * after each transaction commits, so the operations here must not be
 * composed into a caller's own `Effect.tx`.
 */
import { Effect, HashMap, Option, Semaphore, TxHashMap } from "effect"
import type { InstanceId } from "../../schema/InstanceId.ts"
import { admits, type InstanceOwner } from "./InstanceOwner.ts"
import { makeStaleIndex, timeRuleOf, type Slot, type StaleIndexStats, type Verdict as SlotVerdict } from "./internal/StaleIndex.ts"
import { disconnectReapingOn, timeVerdict, verdictOf, type Liveness, type StaleRule, type Verdict } from "./Rule.ts"

export type { ReapReason, StaleRule } from "./Rule.ts"

/** Heap nodes popped between two yields to the event loop during a scan. */
const SCAN_SLICE = 1_024

/** One turn of the event loop (setImmediate): received messages get handled before the scan goes on. */
const yieldToEventLoop = Effect.promise(() => new Promise<void>((resolve) => setImmediate(resolve)))

/** One tracked instance and the resource it owns (a context entry, an entry + strategy pair …); its liveness fields are Rule.ts's. */
export interface Tracked<R> extends Liveness {
  readonly id: InstanceId
  readonly resource: R
  /** Who registered it (issue 25 item 1): inserted with the entry, popped with it; undefined without tenancy. */
  readonly owner?: InstanceOwner | undefined
}

/** One popped stale instance and its verdict (reason, ms silent, window ms), for the reaper's WARNING. */
export interface Reaped<R> extends Verdict {
  readonly tracked: Tracked<R>
}

/** Judges one entry by Rule.ts's `verdictOf` (its suspicion looked up in `rule.suspects`); undefined when it is not stale. */
export const judge = <R>(t: Tracked<R>, rule: StaleRule): Reaped<R> | undefined => {
  const verdict = verdictOf(t, rule.suspects.get(t.id), rule.nowMs, rule)
  return verdict === undefined ? undefined : { tracked: t, ...verdict }
}

export interface InstanceRegistry<R> {
  /** Inserts a new entry (both flags clear) and its owner in one transaction unless the id is held; false when it was. */
  readonly insert: (id: InstanceId, resource: R, nowMs: number, owner?: InstanceOwner) => Effect.Effect<boolean>
  /** REGISTER of a held id (no-op path): refreshes last_seen only. */
  readonly refresh: (id: InstanceId, nowMs: number) => Effect.Effect<Tracked<R> | undefined>
  /** PING naming the id: refreshes last_seen and latches the liveness signal. Never inserts. */
  readonly touch: (id: InstanceId, nowMs: number) => Effect.Effect<boolean>
  /**
   * `touch` done synchronously, for the MQ server's fast path (issue 25 item 4): true when it touched the entry,
   * false when the id is not held, undefined when it cannot be done synchronously (a transaction is suspended
   * waiting on the map, which only a transactional commit wakes): then `touch` must run. The write is a commit
   * of its own (the map's version moves on), so a transaction that read the map before it runs again.
   */
  readonly touchNow: (id: InstanceId, nowMs: number) => boolean | undefined
  /** A transfer through the entry: refreshes last_seen and latches transfer activity. */
  readonly resolveForTransfer: (id: InstanceId, nowMs: number) => Effect.Effect<Tracked<R> | undefined>
  /**
   * `resolveForTransfer` for a request served for `tenant` (InstanceOwner.ts `RequestTenant`): the owner is
   * checked in the same transaction as the touch, and an entry the tenant may not use is left untouched
   * ("not_yours"): a stranger's transfer neither reaches it nor keeps it alive.
   */
  readonly resolveOwnedForTransfer: (id: InstanceId, nowMs: number, tenant: string | undefined) => Effect.Effect<Tracked<R> | undefined | "not_yours">
  readonly get: (id: InstanceId) => Effect.Effect<Tracked<R> | undefined>
  /** Removes and returns the entry (UNREGISTER). */
  readonly pop: (id: InstanceId) => Effect.Effect<Tracked<R> | undefined>
  /** `pop` for a request served for `tenant`: another tenant's entry is left held ("not_yours"), checked in the same transaction. */
  readonly popOwned: (id: InstanceId, tenant: string | undefined) => Effect.Effect<Tracked<R> | undefined | "not_yours">
  /** Removes every stale entry in one transaction and returns them with their reasons. */
  readonly popStale: (rule: StaleRule) => Effect.Effect<ReadonlyArray<Reaped<R>>>
  /** Removes and returns every entry (shutdown). */
  readonly popAll: () => Effect.Effect<ReadonlyArray<Tracked<R>>>
  readonly size: () => Effect.Effect<number>
  readonly snapshot: () => Effect.Effect<ReadonlyArray<Tracked<R>>>
  /**
   * Counters of the stale index, for tests and benches: heap nodes (garbage
   * included), ids in the index, and how many nodes the last `popStale`
   * took off the heap (an upper bound on the entries it judged, suspects aside).
   */
  readonly indexStats: () => StaleIndexStats
}

/** An empty registry. */
export const makeInstanceRegistry = <R>(): Effect.Effect<InstanceRegistry<R>> =>
  Effect.gen(function*() {
    const map = yield* TxHashMap.empty<bigint, Tracked<R>>()
    const index = makeStaleIndex<Tracked<R>>()
    // One scan at a time: the index hands each due node to exactly one scan.
    const scanLock = yield* Semaphore.make(1)

    // The last committed state of the map, read synchronously: the index is updated in the same
    // synchronous step, so no other fiber can commit in between (a transaction commits synchronously).
    const committed = (): HashMap.HashMap<bigint, Tracked<R>> => map.ref.value
    const current = (id: bigint): Tracked<R> | undefined => Option.getOrUndefined(HashMap.get(committed(), id))
    // By the slot's cached hash: hashing a bigint key (its decimal string) is most of a lookup's cost.
    const currentOf = (slot: Slot): Tracked<R> | undefined => Option.getOrUndefined(HashMap.getHash(committed(), slot.id, slot.hash))
    const heldSlot = (slot: Slot): boolean => HashMap.hasHash(committed(), slot.id, slot.hash)

    /** What a PING does to an entry (both `touch` and `touchNow`). */
    const touched = (t: Tracked<R>, nowMs: number): Tracked<R> => ({
      ...t,
      lastSeenMs: Math.max(t.lastSeenMs, nowMs),
      hasLivenessSignal: true
    })

    /**
     * PING outside a transaction: reads the committed map and commits the touched entry in one synchronous step,
     * as a transaction's commit does (a new value, the version moved on), so any transaction that read the old
     * value fails its consistency check and runs again; then the index mirrors it, as after `update`.
     */
    const touchNow = (id: InstanceId, nowMs: number): boolean | undefined => {
      const ref = map.ref
      if (ref.pending.size > 0) return undefined
      const before = current(id)
      if (before === undefined) return false
      const after = touched(before, nowMs)
      ref.value = HashMap.set(ref.value, id, after)
      ref.version++
      index.updated(id, before, after, currentOf)
      return true
    }

    /**
     * Refresh, PING or transfer: one transaction, then (committed) the index mirrors the new value. `admit`
     * (default: every entry) is asked in the same transaction; an entry it refuses is left as it is.
     */
    const updateIf = (id: InstanceId, f: (t: Tracked<R>) => Tracked<R>, admit: (t: Tracked<R>) => boolean) =>
      Effect.map(
        Effect.tx(Effect.gen(function*() {
          const current = yield* TxHashMap.get(map, id)
          if (Option.isNone(current)) return undefined
          if (!admit(current.value)) return "refused" as const
          const next = f(current.value)
          yield* TxHashMap.set(map, id, next)
          return { before: current.value, after: next }
        })),
        (changed) => {
          if (changed === undefined || changed === "refused") return changed
          index.updated(id, changed.before, changed.after, currentOf)
          return changed.after
        }
      )
    const always = () => true
    // The entry's node stays (dropped when it surfaces); the index lets go of the entry's value.
    const popIf = (id: InstanceId, admit: (t: Tracked<R>) => boolean) =>
      Effect.map(
        Effect.tx(Effect.gen(function*() {
          const current = yield* TxHashMap.get(map, id)
          if (Option.isNone(current)) return undefined
          if (!admit(current.value)) return "refused" as const
          yield* TxHashMap.remove(map, id)
          return current.value
        })),
        (popped) => {
          if (popped !== undefined && popped !== "refused") index.removed(id, heldSlot)
          return popped
        }
      )
    const update = (id: InstanceId, f: (t: Tracked<R>) => Tracked<R>) =>
      Effect.map(updateIf(id, f, always), (t) => (t === "refused" ? undefined : t))
    const transferred = (nowMs: number) => (t: Tracked<R>): Tracked<R> => ({
      ...t,
      lastSeenMs: Math.max(t.lastSeenMs, nowMs),
      hasTransferActivity: true
    })

    const popStale = (rule: StaleRule) =>
      Effect.gen(function*() {
        index.beginScan()
        const time = timeRuleOf(rule)
        const candidates = new Set<bigint>()
        // Slots the index handed over (candidates): they have no node until settled, which always
        // happens, even on interruption.
        const taken: Array<Slot> = []
        const settle = Effect.sync(() => {
          index.endScan()
          for (const slot of taken) index.settle(slot, currentOf(slot))
        })
        // A due entry is a candidate when stale by its heartbeat window (the suspects are judged below).
        const visit = (slot: Slot, t: Tracked<R> | undefined): SlotVerdict => {
          if (t === undefined) return "gone"
          if (timeVerdict(t, rule.nowMs, rule) === undefined) return index.keyOf(t)
          candidates.add(slot.id)
          taken.push(slot)
          return "taken"
        }
        const collect = Effect.gen(function*() {
          if (time !== undefined) {
            index.adopt(time.gaps, () => HashMap.values(committed()))
            // Slices of heap pops, letting the event loop in between (a PING must not wait behind a
            // first scan that finds 100k entries due).
            const slice = Effect.sync(() => index.drain(rule.nowMs, time, SCAN_SLICE, visit))
            while (yield* slice) yield* yieldToEventLoop
          }
          // Disconnect staleness does not depend on last_seen alone: the suspects (a handful) are judged directly.
          if (disconnectReapingOn(rule)) {
            for (const id of rule.suspects.keys()) {
              const t = current(id)
              if (t !== undefined && judge(t, rule) !== undefined) candidates.add(id)
            }
          }
          if (candidates.size === 0) return []
          // Pop the candidates in one transaction that judges each again: an entry touched meanwhile stays.
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
        })
        return yield* collect.pipe(Effect.ensuring(settle))
      })

    return {
      insert: (id, resource, nowMs, owner) =>
        Effect.map(
          Effect.tx(Effect.gen(function*() {
            if (yield* TxHashMap.has(map, id)) return false
            yield* TxHashMap.set(map, id, {
              id,
              resource,
              ...(owner === undefined ? {} : { owner }),
              lastSeenMs: nowMs,
              hasLivenessSignal: false,
              hasTransferActivity: false
            })
            return true
          })),
          (inserted) => {
            // After the commit (a transaction body may run more than once), in the same synchronous step as
            // the read of the committed state.
            if (inserted) {
              const t = current(id)
              if (t !== undefined) index.track(id, t)
              index.compact(heldSlot, HashMap.size(committed()))
            }
            return inserted
          }
        ),
      refresh: (id, nowMs) => update(id, (t) => ({ ...t, lastSeenMs: Math.max(t.lastSeenMs, nowMs) })),
      touch: (id, nowMs) => Effect.map(update(id, (t) => touched(t, nowMs)), (t) => t !== undefined),
      touchNow,
      resolveForTransfer: (id, nowMs) => update(id, transferred(nowMs)),
      resolveOwnedForTransfer: (id, nowMs, tenant) =>
        Effect.map(updateIf(id, transferred(nowMs), (t) => admits(t.owner, tenant)), (t) => (t === "refused" ? "not_yours" : t)),
      get: (id) => Effect.map(TxHashMap.get(map, id), Option.getOrUndefined),
      pop: (id) => Effect.map(popIf(id, always), (t) => (t === "refused" ? undefined : t)),
      popOwned: (id, tenant) =>
        Effect.map(popIf(id, (t) => admits(t.owner, tenant)), (t) => (t === "refused" ? "not_yours" : t)),
      popStale: (rule) => scanLock.withPermits(1)(popStale(rule)),
      popAll: () =>
        Effect.map(
          Effect.tx(Effect.gen(function*() {
            const all = yield* TxHashMap.values(map)
            yield* TxHashMap.clear(map)
            return all
          })),
          (all) => {
            // Keeps only the nodes of entries inserted since (none, unless one raced the shutdown).
            index.compact(heldSlot, HashMap.size(committed()), true)
            return all
          }
        ),
      size: () => TxHashMap.size(map),
      snapshot: () => TxHashMap.values(map),
      indexStats: () => index.stats()
    }
  })
