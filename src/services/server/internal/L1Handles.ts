/**
 * L1 reservations and read locks as scoped handles (issue 25 item 2, DESIGN
 * §8): the one way a request holds something of L1 and gives it back.
 *
 * Threat: a request ended by anything but its happy path — a wire error, a
 * defect (a copy that dies, a bug), an interruption (server shutdown, a
 * prefetch replaced) — that leaves a reservation or a read lock behind pins
 * L1 memory for the life of the process; enough of them and every STORE is
 * refused (`L1 is full of locked or reserved objects`). Each path used to
 * guard its own exits (an `Effect.exit` here, an `onInterrupt` there,
 * explicit releases per branch), and a defect or an interruption at a step
 * nobody guarded leaked. Here the release is written once, beside the
 * acquire (`Effect.acquireRelease`), and the holding Scope runs it, whatever
 * ends the request.
 *
 * - {@link reserve}: a write reservation held by the current Scope, aborted
 *   when it closes unless published first with {@link commit}.
 * - {@link readLock} / {@link holdRead}: a read lock held by the current
 *   Scope, unlocked when it closes unless handed on first with
 *   {@link moveRead} (to the pending lookup table, which then owns it).
 * - {@link holdFor}: holds that outlive their request (an engine-driven
 *   PREPARE's, kept until its COMMIT): acquired into a Scope of their own,
 *   which passes to a pending record in one uninterruptible step, or is
 *   closed when the PREPARE fails, dies, is interrupted or is refused.
 * - {@link takeHeld}: a pending record taken out of its table into the
 *   current Scope (a COMMIT), so its holds are released when the COMMIT
 *   ends, by any exit.
 *
 * @internal Used by the transfer modules, Lookup and the L2 tier; L1Store
 * itself stays a plain synchronous store.
 */
import { Effect, Exit, Scope } from "effect"
import type { L1Store, ReadHandle, Reservation } from "../L1Store.ts"
import type { ChunkOrigin } from "../kvevents/L1EventSink.ts"
import type { ObjectKey } from "../ObjectKey.ts"

type L1 = L1Store["Service"]

/** A write reservation held by a Scope. `bytes` is the reservation's (pool bytes at `offset`). */
export interface WriteHold {
  readonly reservation: Reservation
  /** True once published through {@link commit} (or aborted): the Scope's close then does nothing. */
  readonly settled: () => boolean
}

/** What {@link reserve} holds: a reservation, or nothing (already cached / no room), like L1Store's ReserveResult. */
export type HeldReserve =
  | { readonly _tag: "Reserved"; readonly hold: WriteHold }
  | { readonly _tag: "Exists" }
  | { readonly _tag: "Full" }

interface WriteHoldState extends WriteHold {
  done: boolean
}

/**
 * Reserves a `sizeBytes` object for `key` (L1Store.reserveWrite) held by the
 * current Scope: when the Scope closes the reservation is aborted unless
 * {@link commit} published it first. "Exists" and "Full" hold nothing.
 * `origin` is what the commit announces in the KV event log (the chunk's tokens and parent).
 */
export const reserve = (l1: L1, key: ObjectKey, sizeBytes: number, origin?: ChunkOrigin): Effect.Effect<HeldReserve, never, Scope.Scope> =>
  Effect.acquireRelease(
    Effect.map(l1.reserveWrite(key, sizeBytes, origin), (r): HeldReserve => {
      if (r._tag !== "Reserved") return r
      const hold: WriteHoldState = { reservation: r.reservation, done: false, settled: () => hold.done }
      return { _tag: "Reserved", hold }
    }),
    (r) => r._tag === "Reserved" ? abort(l1, r.hold) : Effect.void
  )

/** Aborts a held reservation now (once; a later close does nothing). */
export const abort = (l1: L1, hold: WriteHold): Effect.Effect<void> =>
  Effect.suspend(() => {
    const h = hold as WriteHoldState
    if (h.done) return Effect.void
    h.done = true
    return l1.abort(h.reservation)
  })

/**
 * Publishes a held reservation (L1Store.commit), once: false when it was
 * dropped meanwhile (CLEAR force) or already settled. Settled only once the
 * commit has run (a commit that dies leaves the reservation to the Scope's
 * abort; an abort of a committed object does nothing), and uninterruptible,
 * so it is never published but still aborted at the close.
 */
export const commit = (l1: L1, hold: WriteHold): Effect.Effect<boolean> =>
  Effect.uninterruptible(Effect.suspend(() => {
    const h = hold as WriteHoldState
    if (h.done) return Effect.succeed(false)
    return Effect.tap(l1.commit(h.reservation), () =>
      Effect.sync(() => {
        h.done = true
      }))
  }))

/** A read lock held by a Scope (its object's bytes stay valid while held). */
export interface ReadLock {
  readonly handle: ReadHandle
}

interface ReadLockState extends ReadLock {
  held: boolean
}

/**
 * Holds the read lock `acquire` takes (undefined: nothing to lock) in the
 * current Scope; unlocked with `l1.unlockRead` when the Scope closes, unless
 * {@link moveRead} handed it on first. `acquire` is synchronous in effect
 * (one step), run uninterruptibly with the finalizer's registration.
 */
export const holdRead = (l1: L1, acquire: Effect.Effect<ReadHandle | undefined>): Effect.Effect<ReadLock | undefined, never, Scope.Scope> =>
  Effect.acquireRelease(
    Effect.map(acquire, (handle): ReadLock | undefined => handle === undefined ? undefined : ({ handle, held: true }) as ReadLockState),
    (lock) => lock === undefined ? Effect.void : Effect.sync(() => releaseRead(l1, lock))
  )

/** Read-locks the committed object `key` in the current Scope; undefined (nothing held) when absent. */
export const readLock = (l1: L1, key: ObjectKey): Effect.Effect<ReadLock | undefined, never, Scope.Scope> =>
  holdRead(l1, Effect.sync(() => l1.lockRead(key)))

/** Unlocks a held read lock now (once; the Scope's close then does nothing). */
export const releaseRead = (l1: L1, lock: ReadLock): void => {
  const l = lock as ReadLockState
  if (!l.held) return
  l.held = false
  l1.unlockRead(l.handle)
}

/**
 * Hands a held read lock on: returns its handle, now the caller's to unlock
 * (the pending lookup table), and the Scope's close no longer unlocks it.
 * Undefined when it was moved or released already. Synchronous: hand it on
 * in the same step.
 */
export const moveRead = (lock: ReadLock): ReadHandle | undefined => {
  const l = lock as ReadLockState
  if (!l.held) return undefined
  l.held = false
  return l.handle
}

/**
 * Runs `use` with holds that may outlive it (an engine-driven PREPARE's
 * reservations or read locks, kept until the COMMIT): `use` acquires them
 * into a Scope of their own, forked from `parent` (the owner's scope: its
 * close releases every pending hold). Then, uninterruptibly, when `use`
 * succeeded, `adopt(value, holds)` (synchronous) records them and returns
 * the scopes to close now — `holds` itself when it refuses them (the owner
 * closed, nothing to keep), and any pending record it displaced. When `use`
 * fails, dies or is interrupted, `holds` is closed: nothing it acquired is
 * left behind.
 */
export const holdFor = <A, E, R>(
  parent: Scope.Scope,
  use: Effect.Effect<A, E, R | Scope.Scope>,
  adopt: (value: A, holds: Scope.Closeable) => ReadonlyArray<Scope.Closeable>
): Effect.Effect<A, E, Exclude<R, Scope.Scope>> =>
  Effect.uninterruptibleMask((restore) =>
    Effect.gen(function*() {
      const holds = yield* Scope.fork(parent)
      const exit = yield* Effect.exit(restore(Scope.provide(use, holds)))
      const toClose = Exit.isSuccess(exit) ? adopt(exit.value, holds) : [holds]
      yield* Effect.forEach(toClose, (s) => Scope.close(s, exit), { discard: true })
      return yield* exit
    })
  ) as Effect.Effect<A, E, Exclude<R, Scope.Scope>>

/** A pending record that owns holds (see {@link holdFor}). */
export interface Held {
  readonly holds: Scope.Closeable
}

/**
 * Takes a pending record out of its table (`take`, synchronous: e.g. a map
 * delete) into the current Scope: its holds are closed when the Scope
 * closes, by any exit. Published reservations ({@link commit}) are not
 * aborted by that close.
 */
export const takeHeld = <P extends Held>(take: () => P | undefined): Effect.Effect<P | undefined, never, Scope.Scope> =>
  Effect.acquireRelease(Effect.sync(take), (p) => p === undefined ? Effect.void : Scope.close(p.holds, Exit.void))
