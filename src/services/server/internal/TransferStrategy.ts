/**
 * @internal
 *
 * The engine-driven transfer strategy of one context (DESIGN §4; upstream
 * `ShmTransferStrategy` / `PickleTransferStrategy`): how bytes move (`shm`
 * slots in the L1 pool or `inline` bytes) and the pending writes and reads
 * between a PREPARE and its COMMIT, each held by a scope of L1 handles
 * (issue 25 item 2) and released by its COMMIT, by a PREPARE again, by the
 * prepare TTL (`PendingPrepares.ts`, issue 18) or by the strategy's release
 * (its entry's finalizer). The rules are the header of
 * `EngineDrivenTransfer.ts`, which builds one strategy per context.
 */
import { Clock, Effect, Exit, Metric, Scope } from "effect"
import type { EngineDrivenTransport } from "../ServerConfig.ts"
import type { PrepareRetrieveResponse, PrepareStoreResponse, Slot } from "../../../schema/EngineDriven.ts"
import { InvalidArgument } from "../../../schema/WireError.ts"
import type { EngineDrivenLayout } from "../../kv/EngineDrivenLayout.ts"
import type { L1Store, ReadHandle, Reservation } from "../L1Store.ts"
import * as L1Handles from "./L1Handles.ts"
import type { WriteHold } from "./L1Handles.ts"
import type { Lookup } from "../Lookup.ts"
import type { ChunkOrigin } from "../kvevents/L1EventSink.ts"
import type { ObjectKey } from "../ObjectKey.ts"
import { byLabel } from "../../metrics/Series.ts"
import {
  describePending,
  expiryTimer,
  isExpired as isPendingExpired,
  type Pending,
  pendingCount,
  type PrepareExpiry
} from "./PendingPrepares.ts"

/**
 * A PREPARE_STORE waiting for its COMMIT_STORE: reservations in chunk order, held by `holds`
 * (L1Handles.holdFor, issue 25 item 2): closing it aborts every one not committed.
 */
interface PendingWrite extends Pending, L1Handles.Held {
  readonly reservations: ReadonlyArray<WriteHold>
}

/** A PREPARE_RETRIEVE (shm) waiting for its COMMIT_RETRIEVE: read locks in chunk order, held by `holds`. */
interface PendingRead extends Pending, L1Handles.Held {
  readonly handles: ReadonlyArray<ReadHandle>
}

/**
 * One context's transfer strategy (upstream `TransferStrategy`): how bytes
 * move (`transport`) and the pending writes and reads of PREPARE/COMMIT.
 * Every method that adds pending state refuses once the strategy is closed
 * (its entry released), so nothing is left behind by a transfer racing a
 * reap; the caller then answers `not_registered`.
 */
export interface TransferStrategy {
  readonly transport: EngineDrivenTransport
  /** PREPARE_STORE of the object keys of a key's chunks (in range order); undefined when closed. */
  readonly prepareStore: (
    pendingKey: string,
    objectKeys: ReadonlyArray<ObjectKey>,
    origins?: ReadonlyArray<ChunkOrigin>
  ) => Effect.Effect<PrepareStoreResponse | undefined>
  /** COMMIT_STORE; undefined when closed. */
  readonly commitStore: (pendingKey: string, cpuData: Uint8Array) => Effect.Effect<boolean | undefined>
  /** PREPARE_RETRIEVE of a key's chunks for `requestId`; undefined when closed. Fails on an object of another size. */
  readonly prepareRetrieve: (
    pendingKey: string,
    requestId: string,
    objectKeys: ReadonlyArray<ObjectKey>
  ) => Effect.Effect<PrepareRetrieveResponse | undefined, InvalidArgument>
  /** COMMIT_RETRIEVE; undefined when closed. */
  readonly commitRetrieve: (pendingKey: string) => Effect.Effect<boolean | undefined>
  /** Closes the strategy: aborts its pending writes, releases its pending reads. Idempotent. */
  readonly release: Effect.Effect<void>
  readonly isOpen: () => boolean
  /** Pending PREPARE_STOREs and the reservations they hold. */
  readonly pendingStores: () => { readonly requests: number; readonly chunks: number }
  /** Pending PREPARE_RETRIEVEs and the read locks they hold. */
  readonly pendingRetrieves: () => { readonly requests: number; readonly chunks: number }
  /** PREPAREs released by the prepare TTL so far: stores (reservations dropped) and retrieves (locks released). */
  readonly expired: () => { readonly stores: number; readonly retrieves: number }
}

const chunksTotal = Metric.counter("mpcache_engine_driven_chunks_total", {
  description: "Chunks published by COMMIT_STORE / handed out by PREPARE_RETRIEVE (engine-driven), by direction",
  incremental: true
})
const bytesTotal = Metric.counter("mpcache_engine_driven_bytes_total", {
  description: "Bytes published by COMMIT_STORE / handed out by PREPARE_RETRIEVE (engine-driven), by direction",
  incremental: true
})
/** The `direction` label's values. */
const DIRECTIONS = ["store", "retrieve"] as const
const chunksBy = byLabel(chunksTotal, "direction", DIRECTIONS)
const bytesBy = byLabel(bytesTotal, "direction", DIRECTIONS)
const stored = { chunks: chunksBy.store, bytes: bytesBy.store }
const retrieved = { chunks: chunksBy.retrieve, bytes: bytesBy.retrieve }

const expiredTotal = Metric.counter("mpcache_engine_driven_prepare_expired_total", {
  description: "Engine-driven PREPAREs released because no COMMIT came within --prepare-ttl-seconds, by direction",
  incremental: true
})
const expiredBy = byLabel(expiredTotal, "direction", DIRECTIONS)
const expiredStores = expiredBy.store
const expiredRetrieves = expiredBy.retrieve

const EMPTY = new Uint8Array(0)

/**
 * A context's strategy over `l1` and `lookup` for objects of `layout`.
 * `label` names the instance in logs. A pending PREPARE older than
 * `expiry.ttlMs` (strictly: `now − prepared > ttl`) is released by a timer
 * fiber forked in `expiry.scope`, and a COMMIT arriving after that answers
 * false (issue 18). `onCommit` runs for each object a COMMIT_STORE publishes
 * (the L2 write-through, issue 15; it returns at once).
 */
export const makeTransferStrategy = (
  transport: EngineDrivenTransport,
  layout: EngineDrivenLayout,
  l1: L1Store["Service"],
  lookup: Lookup["Service"],
  label: string,
  expiry: PrepareExpiry,
  onCommit: (reservation: Reservation) => Effect.Effect<void> = () => Effect.void
): TransferStrategy => {
  const writes = new Map<string, PendingWrite>()
  const reads = new Map<string, PendingRead>()
  let open = true
  const expired = { stores: 0, retrieves: 0 }
  const { chunkBytes } = layout
  const ttlSeconds = expiry.ttlMs / 1000

  const slotOf = (offset: number): Slot => ({ offset, length: chunkBytes, shape: layout.objectShape, dtype: layout.dtype })
  // Every pending record's holds are a child of this scope: the strategy's release closes it, and with it
  // whatever a PREPARE in flight has acquired so far (what it acquires after is released at once).
  const held = Scope.forkUnsafe(expiry.scope)
  // A pending record leaves its map before it is released; closing its holds twice does nothing more.
  const releaseHolds = (p: L1Handles.Held) => Scope.close(p.holds, Exit.void)
  /** Takes the pending record of `pendingKey` out of `map` into the current Scope (released when it closes). */
  const takePending = <P extends L1Handles.Held>(map: Map<string, P>, pendingKey: string) =>
    L1Handles.takeHeld(() => {
      const p = map.get(pendingKey)
      map.delete(pendingKey)
      return p
    })
  const describe = describePending
  const isExpired = (p: Pending, nowMs: number) => isPendingExpired(p, nowMs, expiry.ttlMs)

  const expireWrite = (pendingKey: string, w: PendingWrite) =>
    Effect.gen(function*() {
      expired.stores++
      yield* releaseHolds(w)
      yield* Metric.update(expiredStores, 1)
      yield* Effect.logWarning(
        `prepare_store: ${label}: ${describe(pendingKey)} was not committed within ${ttlSeconds} s (--prepare-ttl-seconds); its ${w.reservations.length} reservation(s) are dropped, nothing published`
      )
    })

  const expireRead = (pendingKey: string, r: PendingRead) =>
    Effect.gen(function*() {
      expired.retrieves++
      yield* releaseHolds(r)
      yield* Metric.update(expiredRetrieves, 1)
      yield* Effect.logWarning(
        `prepare_retrieve: ${label}: ${describe(pendingKey)} was not committed within ${ttlSeconds} s (--prepare-ttl-seconds); its ${r.handles.length} read lock(s) are released`
      )
    })
  const writeExpiry = expiryTimer(expiry, writes, expireWrite)
  const readExpiry = expiryTimer(expiry, reads, expireRead)

  const prepareStore = (pendingKey: string, objectKeys: ReadonlyArray<ObjectKey>, origins?: ReadonlyArray<ChunkOrigin>) =>
    Effect.gen(function*() {
      // An earlier PREPARE of the key is released first, so that its chunks are not "already cached" now.
      const replaced = yield* Effect.scoped(takePending(writes, pendingKey))
      if (replaced !== undefined) {
        yield* Effect.logWarning(`prepare_store: ${label}: ${describe(pendingKey)} was prepared again before its commit; the first reservation is dropped`)
      }
      const clock = yield* Clock.clockWith(Effect.succeed)
      const indices: Array<number> = []
      let accepted = false
      const reservations = yield* L1Handles.holdFor(
        held,
        Effect.gen(function*() {
          const holds: Array<WriteHold> = []
          for (let i = 0; i < objectKeys.length; i++) {
            const r = yield* L1Handles.reserve(l1, objectKeys[i]!, chunkBytes, origins?.[i])
            if (r._tag === "Full") {
              yield* Effect.logWarning(
                `prepare_store: ${label}: L1 is full of locked or reserved objects; ${describe(pendingKey)} gets ${holds.length} slot(s) for chunks before chunk ${i} of ${objectKeys.length}`
              )
              break
            }
            if (r._tag === "Reserved") {
              holds.push(r.hold)
              indices.push(i)
            }
          }
          return holds
        }),
        // Recorded in one uninterruptible synchronous step with the open check: a release either ran before
        // (the holds are closed here) or sees the record. The time is read in that step too, so the map's order
        // is the order of preparedAtMs (see expiryTimer).
        (reservations, holds) => {
          if (!open) return [holds]
          accepted = true
          const displaced = writes.get(pendingKey)
          // Deleted first so that the record goes to the end of the map's order (see expiryTimer).
          writes.delete(pendingKey)
          const toClose = displaced === undefined ? [] : [displaced.holds]
          if (reservations.length === 0) return [...toClose, holds]
          writes.set(pendingKey, { holds, reservations, preparedAtMs: clock.currentTimeMillisUnsafe() })
          return toClose
        }
      )
      if (!accepted) return undefined
      yield* writeExpiry
      return { context: { slots: reservations.map((r) => slotOf(r.reservation.offset)), chunk_indices: indices } }
    })

  // A COMMIT takes its record into the request's scope: whatever ends the COMMIT, the reservations it did not
  // publish are aborted when it closes (L1Handles.takeHeld).
  const commitStore = (pendingKey: string, cpuData: Uint8Array) =>
    Effect.scoped(Effect.gen(function*() {
      if (!open) return undefined
      const now = yield* Clock.currentTimeMillis
      const w = yield* takePending(writes, pendingKey)
      if (w === undefined) {
        yield* Effect.logWarning(`commit_store: ${label}: no pending store for ${describe(pendingKey)} (never prepared, already committed, aborted or expired); nothing published`)
        return false
      }
      if (isExpired(w, now)) {
        // The expiry timer is due but has not run yet: the COMMIT is late all the same.
        yield* expireWrite(pendingKey, w)
        return false
      }
      if (cpuData.length === 0 && transport === "inline") {
        yield* Effect.logWarning(
          `commit_store: ${label}: ${describe(pendingKey)} carries no bytes, but this server's engine-driven transport is inline; nothing published`
        )
        return false
      }
      if (cpuData.length > 0) {
        const expected = w.reservations.length * chunkBytes
        if (cpuData.length !== expected) {
            // Shorter than one chunk object: bytes of no chunk at all, the worker's abort (Op.ts CommitStore).
          if (cpuData.length < chunkBytes) {
            yield* Effect.logInfo(
              `commit_store: ${label}: the worker aborted ${describe(pendingKey)}; its ${w.reservations.length} reservation(s) are dropped, nothing published`
            )
            return false
          }
          yield* Effect.logWarning(
            `commit_store: ${label}: cpu_data of ${describe(pendingKey)} has ${cpuData.length} bytes; its ${w.reservations.length} reserved chunk(s) of ${chunkBytes} bytes need ${expected}; nothing published`
          )
          return false
        }
        // Write only into reservations still pending, in the same synchronous step as the check (CLEAR force may
        // have dropped one and handed its extent to another object meanwhile).
        w.reservations.forEach((r, j) => {
          if (l1.isPending(r.reservation)) r.reservation.bytes.set(cpuData.subarray(j * chunkBytes, (j + 1) * chunkBytes))
        })
      }
      let committed = 0
      for (const r of w.reservations) {
        if (!(yield* L1Handles.commit(l1, r))) continue
        committed++
        yield* onCommit(r.reservation)
      }
      yield* Metric.update(stored.chunks, committed)
      yield* Metric.update(stored.bytes, committed * chunkBytes)
      if (committed < w.reservations.length) {
        yield* Effect.logWarning(
          `commit_store: ${label}: ${w.reservations.length - committed} of ${w.reservations.length} reservation(s) of ${describe(pendingKey)} were dropped meanwhile (CLEAR force); published ${committed}`
        )
      }
      return committed === w.reservations.length
    }))

  const prepareRetrieve = (pendingKey: string, requestId: string, objectKeys: ReadonlyArray<ObjectKey>) =>
    Effect.gen(function*() {
      const clock = yield* Clock.clockWith(Effect.succeed)
      let closed = false
      let replaced: PendingRead | undefined
      const prepared = yield* L1Handles.holdFor(
        held,
        Effect.gen(function*() {
          const handles: Array<ReadHandle> = []
          for (let i = 0; i < objectKeys.length; i++) {
            const h = yield* lookup.acquireForRetrieve(requestId, objectKeys[i]!)
            if (h === undefined) {
              yield* Effect.logWarning(`prepare_retrieve: ${label}: chunk ${i} of ${describe(pendingKey)} is not in L1; nothing locked`)
              return { response: { success: false, data: EMPTY, context: {} } satisfies PrepareRetrieveResponse, keep: undefined }
            }
            handles.push(h)
            if (h.bytes.length !== chunkBytes) {
              return yield* new InvalidArgument({
                message: `prepare_retrieve: chunk ${i} of ${describe(pendingKey)} is cached as an object of ${h.bytes.length} bytes, but this context's layout [${layout.objectShape.join(", ")}] ${layout.dtype} needs ${chunkBytes}`
              })
            }
          }
          yield* Metric.update(retrieved.chunks, handles.length)
          yield* Metric.update(retrieved.bytes, handles.length * chunkBytes)
          const chunkIndices = handles.map((_, i) => i)
          if (transport === "inline") {
            // Copied while locked, then released with the holds: nothing stays pending.
            const data = Buffer.allocUnsafeSlow(handles.length * chunkBytes)
            handles.forEach((h, i) => data.set(h.bytes, i * chunkBytes))
            return {
              response: { success: true, data, context: { slots: [], chunk_indices: chunkIndices } } satisfies PrepareRetrieveResponse,
              keep: undefined
            }
          }
          return {
            response: {
              success: true,
              data: EMPTY,
              context: { slots: handles.map((h) => slotOf(h.offset)), chunk_indices: chunkIndices }
            } satisfies PrepareRetrieveResponse,
            keep: handles
          }
        }),
        // Recorded in the same synchronous step as the open check, at that step's time (see prepareStore).
        ({ keep }, holds) => {
          if (keep === undefined) return [holds]
          if (!open) {
            closed = true
            return [holds]
          }
          replaced = reads.get(pendingKey)
          reads.delete(pendingKey)
          reads.set(pendingKey, { holds, handles: keep, preparedAtMs: clock.currentTimeMillisUnsafe() })
          return replaced === undefined ? [] : [replaced.holds]
        }
      )
      if (closed) return undefined
      if (prepared.keep !== undefined) yield* readExpiry
      if (replaced !== undefined) {
        yield* Effect.logWarning(`prepare_retrieve: ${label}: ${describe(pendingKey)} was prepared again before its commit; the first locks are released`)
      }
      return prepared.response
    })

  const commitRetrieve = (pendingKey: string) =>
    Effect.scoped(Effect.gen(function*() {
      if (!open) return undefined
      if (transport === "inline") return true
      const now = yield* Clock.currentTimeMillis
      const r = yield* takePending(reads, pendingKey)
      if (r === undefined) {
        yield* Effect.logWarning(`commit_retrieve: ${label}: no pending retrieve for ${describe(pendingKey)} (never prepared, already committed or expired)`)
        return false
      }
      if (isExpired(r, now)) {
        // Late: the locks were due for release, so the bytes copied out may have changed meanwhile.
        yield* expireRead(pendingKey, r)
        return false
      }
      // The locks are released when this scope closes.
      return true
    }))

  const release = Effect.suspend(() => {
    open = false
    const stores = writes.size
    const retrieves = reads.size
    writes.clear()
    reads.clear()
    // Every pending record's holds, and those of a PREPARE in flight, are children of `held`.
    return Scope.close(held, Exit.void).pipe(
      Effect.andThen(
        stores + retrieves === 0
          ? Effect.void
          : Effect.logInfo(`${label}: released ${stores} pending store(s) (nothing published) and ${retrieves} pending retrieve(s)`)
      )
    )
  })

  return {
    transport,
    prepareStore,
    commitStore,
    prepareRetrieve,
    commitRetrieve,
    release,
    isOpen: () => open,
    pendingStores: () => pendingCount(writes, (w) => w.reservations.length),
    pendingRetrieves: () => pendingCount(reads, (r) => r.handles.length),
    expired: () => ({ ...expired })
  }
}
