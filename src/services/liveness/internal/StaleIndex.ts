/**
 * The InstanceRegistry's index of lower bounds (DESIGN §5 reaper): which
 * entries might be stale by the time rule, so that a scan looks at those
 * only instead of at every tracked context.
 *
 * A node `(keyMs, slot)` in a {@link DeadlineHeap} promises: the entry held
 * under `slot.id` cannot be stale by its heartbeat window (Rule.ts) before
 * `keyMs + minWindow`, `minWindow` the smaller of the two heartbeat windows.
 * Keys are `lastSeenMs + gap`, where `gap = window − minWindow` of the
 * entry's heartbeat state (`startup` or `active`) under the gaps adopted
 * last. Why a key stays valid:
 *
 * - `lastSeenMs` only grows (every refresh is a `Math.max`), so heartbeats
 *   need no new node: a node that comes due is looked at once and re-keyed
 *   from the entry's current last_seen (a live worker's node thus comes
 *   due about once per window);
 * - the state changes once (startup → active, when the flags latch), and
 *   the window may shrink then: the index offers a new key when it mirrors
 *   the latch;
 * - gaps that grow leave old keys lower than needed (still valid); gaps that
 *   shrink could make them too late, so {@link StaleIndex.adopt} re-keys
 *   every entry then. The server's windows are fixed at start (a late scan
 *   moves its judge time, not its windows), so it never has to.
 *
 * One {@link Slot} per id (a map from id to slot) carries the key of the id's
 * one *live* node; a node whose key differs from its slot's (a lower key was
 * offered since, the node was taken by a scan, the id left the index) is
 * garbage and dropped when it surfaces. Offering a key higher than the live
 * one is a no-op: the lower one is still a valid bound. Garbage drains when
 * it comes due; {@link StaleIndex.compact} drops it sooner when it
 * outnumbers the entries (e.g. with time-based reaping off).
 *
 * Each slot also mirrors the entry's last committed value (the registry
 * reports every commit), so a scan judges a due node without a map lookup
 * (hashing a bigint key is most of a lookup's cost).
 *
 * Not transactional: every method is synchronous, and the registry calls
 * them after its transactions commit, with the last committed state of its
 * map (see there).
 */
import { Hash } from "effect"
import { heartbeatStateOf, timeReapingOn, windowMsOf, type HeartbeatState, type Liveness, type Windows } from "../Rule.ts"
import { makeDeadlineHeap } from "./DeadlineHeap.ts"

/** A scan's time rule reduced to what keys depend on. Millis. */
export interface TimeRule {
  /** The smaller of the two heartbeat windows (Rule.ts). */
  readonly minWindowMs: number
  readonly gaps: Gaps
}

/** `window − minWindow` per heartbeat state (Rule.ts `windowMsOf`), ms (≥ 0). */
export type Gaps = { readonly [S in HeartbeatState]: number }

/** The time rule of a scan; undefined when time-based reaping is off (Rule.ts `timeReapingOn`). */
export const timeRuleOf = (w: Windows): TimeRule | undefined => {
  if (!timeReapingOn(w)) return undefined
  const minWindowMs = Math.min(windowMsOf("startup", w), windowMsOf("active", w))
  return { minWindowMs, gaps: { startup: windowMsOf("startup", w) - minWindowMs, active: windowMsOf("active", w) - minWindowMs } }
}

/** An id in the index. `hash` is `Hash.hash(id)`, computed once, for `HashMap.getHash`. */
export interface Slot {
  readonly id: bigint
  readonly hash: number
}

interface MutableSlot<T> extends Slot {
  /** The live node's key; undefined while the id has none (taken by a scan, or left the index). */
  key: number | undefined
  /** False once the slot left the id → slot map; its nodes are all garbage then. */
  indexed: boolean
  /**
   * The entry as last committed, mirrored after each commit so that a scan judges a due node without a
   * map lookup; undefined once unregistered. In the moment between a commit and its mirroring it may be
   * the previous value: an older last_seen only makes a key earlier, and a flag that latched offers a
   * new key when mirrored; a candidate is judged again on the map in the popping transaction.
   */
  tracked: T | undefined
}

/**
 * What a scan makes of a due entry: its new key (not stale), `"taken"` (a
 * candidate: the scan hands it back through {@link StaleIndex.settle}), or
 * `"gone"` (no longer held).
 */
export type Verdict = number | "taken" | "gone"

/**
 * Heap keys are compared with `nowMs − minWindow + KEY_SLACK_MS`: popping a
 * node up to 1 ms early costs one extra look, and keeps float rounding of
 * `lastSeen + gap` from ever hiding a stale entry.
 */
const KEY_SLACK_MS = 1

/** Garbage nodes tolerated beyond one per entry before {@link StaleIndex.compact} runs. */
const COMPACT_SLACK = 1_024

/** Counters for tests and benches. */
export interface StaleIndexStats {
  /** Nodes in the heap, garbage included. */
  readonly heapNodes: number
  /** Ids in the index (held, or unregistered and not yet dropped). */
  readonly slots: number
  /** Nodes the last scan took off the top of the heap (live or garbage): the entries it looked at, at most. */
  readonly lastScanPopped: number
}

const isActive = (t: Liveness): boolean => heartbeatStateOf(t) === "active"

/** The index over entries of type `T`. Every `t` passed in is an entry as committed. */
export interface StaleIndex<T extends Liveness> {
  /** The key of an entry under the gaps adopted last, ms. */
  readonly keyOf: (t: Liveness) => number
  /** `id` is held as `t` (inserted, or found held by a scan): mirrors it and makes sure it has a node. */
  readonly track: (id: bigint, t: T) => void
  /**
   * An update of a held entry committed, `before` → `after`. `current` reads
   * the committed value, for when the mirror is out of step (another commit
   * came in between). A latched flag gets the entry a key for its new window.
   */
  readonly updated: (id: bigint, before: T, after: T, current: (slot: Slot) => T | undefined) => void
  /** `id` was unregistered (committed); `held` says whether it is held again already. */
  readonly removed: (id: bigint, held: (slot: Slot) => boolean) => void
  /**
   * Switches keys to `gaps`; when a gap is smaller than one used before,
   * re-keys every entry of `entries` (O(n)).
   */
  readonly adopt: (gaps: Gaps, entries: () => Iterable<T & { readonly id: bigint }>) => void
  /**
   * Looks at up to `max` nodes that may be stale at `nowMs` under `time`,
   * asking `visit` about each live one, with its mirrored entry (`visit` must
   * not call the index). True when more may be due.
   */
  readonly drain: (nowMs: number, time: TimeRule, max: number, visit: (slot: Slot, t: T | undefined) => Verdict) => boolean
  /** Hands back a slot `visit` took: tracked again as `t` when still held, dropped otherwise. */
  readonly settle: (slot: Slot, t: T | undefined) => void
  /** Starts the counters of a scan. */
  readonly beginScan: () => void
  /** Gives the entries that were due but not stale their nodes back (kept apart so a scan cannot meet them twice). */
  readonly endScan: () => void
  /** Drops garbage and the ids `held` rejects, when there are too many nodes for `entries`; `force`: always. */
  readonly compact: (held: (slot: Slot) => boolean, entries: number, force?: boolean) => void
  readonly stats: () => StaleIndexStats
}

/** An empty index. */
export const makeStaleIndex = <T extends Liveness>(): StaleIndex<T> => {
  const heap = makeDeadlineHeap<MutableSlot<T>>()
  const slots = new Map<bigint, MutableSlot<T>>()
  /** Gaps the current keys were computed with (the largest since the last re-key). */
  let used: Gaps = { startup: 0, active: 0 }
  let popped = 0
  let deferred: Array<MutableSlot<T>> = []
  let deferredKeys: Array<number> = []

  const keyOf = (t: Liveness): number => t.lastSeenMs + used[heartbeatStateOf(t)]

  const offer = (slot: MutableSlot<T>, keyMs: number): void => {
    // A slot that left the index: its id was not held then; a later insert made a new slot.
    if (!slot.indexed) return
    if (slot.key !== undefined && slot.key <= keyMs) return
    slot.key = keyMs
    heap.push(keyMs, slot)
  }

  const slotOf = (id: bigint): MutableSlot<T> => {
    let slot = slots.get(id)
    if (slot === undefined) {
      slot = { id, hash: Hash.hash(id), key: undefined, indexed: true, tracked: undefined }
      slots.set(id, slot)
    }
    return slot
  }

  const track = (slot: MutableSlot<T>, t: T): void => {
    slot.tracked = t
    offer(slot, keyOf(t))
  }

  /** Drops a slot whose id is not held and that has no live node. */
  const release = (slot: MutableSlot<T>): void => {
    if (slot.key !== undefined || !slot.indexed) return
    slots.delete(slot.id)
    slot.indexed = false
    slot.tracked = undefined
  }

  return {
    keyOf,
    track: (id, t) => track(slotOf(id), t),
    updated: (id, before, after, current) => {
      const slot = slots.get(id)
      if (slot === undefined) return
      const previous = slot.tracked
      const next = previous === before ? after : current(slot)
      if (next === undefined) return
      slot.tracked = next
      // The window may have shrunk (flags latched): a key for the new one.
      if (isActive(next) && (previous === undefined || !isActive(previous) || !isActive(before))) offer(slot, keyOf(next))
    },
    removed: (id, held) => {
      const slot = slots.get(id)
      if (slot !== undefined && !held(slot)) slot.tracked = undefined
    },
    adopt: (gaps, entries) => {
      const shrinks = gaps.startup < used.startup || gaps.active < used.active
      used = gaps
      if (!shrinks) return
      heap.clear()
      for (const slot of slots.values()) {
        slot.key = undefined
        slot.tracked = undefined
      }
      for (const t of entries()) track(slotOf(t.id), t)
      for (const slot of slots.values()) release(slot)
    },
    drain: (nowMs, time, max, visit) => {
      const limit = nowMs - time.minWindowMs + KEY_SLACK_MS
      for (let n = 0; n < max; n++) {
        const key = heap.peekKey()
        if (!(key < limit)) return false
        const slot = heap.peek()
        popped++
        if (slot.key !== key) {
          heap.pop()
          continue
        }
        const verdict = visit(slot, slot.tracked)
        if (typeof verdict === "number" && verdict >= limit) {
          // Not stale, and not due again in this scan: re-keyed in place.
          slot.key = verdict
          heap.rekeyTop(verdict)
          continue
        }
        heap.pop()
        slot.key = undefined
        if (typeof verdict === "number") {
          deferred.push(slot)
          deferredKeys.push(verdict)
        } else if (verdict === "gone") release(slot)
      }
      return heap.peekKey() < limit
    },
    settle: (slot, t) => {
      const s = slot as MutableSlot<T>
      if (t !== undefined) track(s, t)
      else release(s)
    },
    beginScan: () => {
      popped = 0
    },
    endScan: () => {
      for (let i = 0; i < deferred.length; i++) offer(deferred[i]!, deferredKeys[i]!)
      deferred = []
      deferredKeys = []
    },
    compact: (held, entries, force = false) => {
      if (!force && heap.size() <= 2 * entries + COMPACT_SLACK) return
      heap.retain((key, slot) => slot.key === key && held(slot))
      for (const slot of slots.values()) {
        if (held(slot)) continue
        slot.key = undefined
        release(slot)
      }
    },
    stats: () => ({ heapNodes: heap.size(), slots: slots.size, lastScanPopped: popped })
  }
}
