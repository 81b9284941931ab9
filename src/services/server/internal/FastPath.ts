/**
 * The MQ server's fast path (issue 16; issue 25 item 4 for a named PING): a
 * request whose handler row has a `fast` answer (PING, NOOP, GET_CHUNK_SIZE)
 * is served without a fiber, an Effect or a per-request metric update, and
 * with at most one queue hand-off:
 *
 * - its pool would start it at once (SYNC idle, NORMAL with a free worker):
 *   answered right where it was received (the receive loop), no hand-off;
 * - its pool is busy: queued on that pool as any request is (DESIGN §3.1's
 *   back-pressure: a PING waits behind a saturated NORMAL pool, a NOOP behind
 *   a running SYNC job), as a job that answers the fast way when its turn
 *   comes: one hand-off.
 *
 * Where the row's `fast` declines (a named PING whose peer is not bound to
 * the instance yet, an id in a rarer encoding; see `FastHandler`), the
 * request takes the pooled path (`pooled`), which does the rest.
 *
 * The caller keeps each peer's arrival order: it offers a request here from
 * the receive loop only when nothing its peer sent before it is still on its
 * way to the server's `onMessage` (which serves it here too, after its
 * checks), and not for a peer whose replies back up (issue 27 item 1).
 *
 * The PING path (issue 25 item 4), counted: every call of ours from the
 * receive loop to the write of `last_seen`, for a named PING of a bound
 * peer (calls beside the chain, which return before it goes on, in
 * parentheses; Effect's runtime steps are not ours and not counted).
 *
 * Before (e2777e6), 14 calls and two hand-offs: receive loop (`answerFast`
 * declines: `fastPing` reads no nil) → `hand` → [inbox Queue] → receive fiber:
 * 1 `onMessage` → 2 `admission.admit` → 3 `onAdmitted` → 4 `dispatcher.submit`
 * → [NORMAL Queue] → worker: 5 `job` → 6 `jobNow` (decodePayload) → 7
 * `row.handle` → 8 `ping` → 9 `touchAll` → 10 `Effect.forEach` → 11
 * `touchInstance` → 12 `registry.touch` → 13 `update` → 14 the transaction
 * body (`TxHashMap.set`), committed when it ends.
 *
 * Now, its pool free, nothing ahead in the inbox — 6 calls, no hand-off:
 * receive loop (`rowOf`: isServed, decodeHeaderInt × 2, the table) →
 * 1 `serve` (hasFreeSlot) → 2 `answerNow` → 3 `row.fast` = Management's
 * `fastPing` (decodeInstanceIdFrame, `isBound` → Connections' isBound, the
 * clock) → 4 `touchInstanceNow` = `registry.touchNow` (HashMap.get) →
 * 5 `touched` (the new entry: last_seen = max(last_seen, now)) → 6
 * `HashMap.set`, committed in the same step (then the index, the reply,
 * the batched counters).
 *
 * Its pool busy — one hand-off, then 6 calls: receive loop → `rowOf` →
 * 1 `serve` → 2 `dispatcher.submit` → [the pool's Queue] → worker: 1 the
 * fast job → 2 `answerNow` → 3 `fastPing` → 4 `registry.touchNow` → 5
 * `touched` → 6 `HashMap.set`.
 *
 * Where messages its peer sent before it are still in the peer's inbound
 * FIFO (a burst the receive fiber has not handed on yet), the PING waits
 * there behind them to keep its peer's order: then `onMessage` → `admit` → `onAdmitted` →
 * `serve` and the chain above, answered there when its pool is free (one
 * hand-off), else queued (two). The first PING of a connection naming an
 * instance (its peer not bound yet) takes the pooled path, which binds it.
 */
import { Effect } from "effect"
import { decodeHeaderInt } from "../../../schema/Frame.ts"
import type { InstanceId } from "../../../schema/InstanceId.ts"
import type { Dispatcher, Job } from "../Dispatch.ts"
import type { HandlerRow, HandlerTable } from "../Handler.ts"
import type { RequestBarrier } from "../../liveness/RequestBarrier.ts"
import type { BatchedCounter, BatchedHistogram } from "./MetricBatch.ts"

/** What the fast path needs of the MQ server. */
export interface FastPathOptions {
  readonly table: HandlerTable
  readonly dispatcher: Dispatcher
  readonly barrier: RequestBarrier["Service"]
  /** Whether the peer with this routing id is admitted (PeerAdmission's `isServed`): only those are served here. */
  readonly isServed: (routingId: Uint8Array) => boolean
  /** The peer (routing id, hex) needs no binding to instance `id` (PeerEvents' `isBound`). */
  readonly isBound: (peer: string, id: InstanceId) => boolean
  /** Sends one reply `[routing id, uid, op, response]`. */
  readonly reply: (message: Array<Uint8Array>) => void
  /** The batched request counter and latency histogram (seconds) of each fast row's op, by op id. */
  readonly metrics: ReadonlyMap<number, { readonly requests: BatchedCounter; readonly latency: BatchedHistogram }>
  /**
   * The pooled job of a request the row's `fast` declined once it waited in its pool: decodes, runs the
   * handler, replies, and marks `seq` finished in the barrier. `receivedAtMs`: Date.now() at receipt.
   */
  readonly pooled: (row: HandlerRow, received: Array<Buffer>, receivedAtMs: number, seq: number) => Job
}

/** Counts since start, for tests and benches. */
export interface FastPathStats {
  /** Requests answered where they were received (no hand-off). */
  readonly answered: number
  /** Requests queued on their busy pool as fast jobs (one hand-off). */
  readonly queued: number
}

/** The fast path of one MQ server. */
export interface FastPath {
  /**
   * The row of a message straight from the receive loop when the fast path may serve it: a request of a
   * `fast` row from an admitted peer, uid and op headers and payload count right; undefined otherwise (it goes
   * to `onMessage`). Never throws.
   */
  readonly rowOf: (received: Array<Buffer>) => HandlerRow | undefined
  /**
   * Serves a request of a `fast` row whose checks passed (`rowOf`, or `onMessage`'s own): true when answered or
   * queued here; false when the caller must queue it the pooled way (the fast answer declined while its pool
   * was free, or its pool's queue is full: the pooled path answers `overloaded`). Never throws.
   */
  readonly serve: (row: HandlerRow, received: Array<Buffer>) => boolean
  readonly stats: () => FastPathStats
}

/** A routing id as hex, the peers' key everywhere (received frames are Buffers). */
const hexOf = (routingId: Uint8Array): string =>
  (Buffer.isBuffer(routingId) ? routingId : Buffer.from(routingId.buffer, routingId.byteOffset, routingId.byteLength)).toString("hex")

export const makeFastPath = (options: FastPathOptions): FastPath => {
  const { table, dispatcher, barrier } = options
  let answered = 0
  let queued = 0
  const isBound = (routingId: Uint8Array, id: InstanceId): boolean => options.isBound(hexOf(routingId), id)

  /** Answers `received` with its row's fast answer; false (nothing sent, `received` untouched) when it declines or throws. */
  const answerNow = (row: HandlerRow, received: Array<Buffer>, receivedAtPerfMs: number): boolean => {
    let response: Uint8Array | undefined
    try {
      response = row.fast!(received, 3, isBound)
    } catch {
      // A fast answer that throws is a bug; the pooled path answers (and logs) instead.
      return false
    }
    if (response === undefined) return false
    // [routing id, uid, op, response]: the request's own frames, echoed, in the request's array.
    const message: Array<Uint8Array> = received
    if (message.length === 4) message[3] = response
    else {
      message.length = 3
      message.push(response)
    }
    options.reply(message)
    const m = options.metrics.get(row.op.id)!
    m.requests.add(1)
    m.latency.observe((performance.now() - receivedAtPerfMs) / 1000)
    return true
  }

  /** The job of a fast request that waited in its pool: the fast answer, else the pooled job. Never fails. */
  const fastJob = (row: HandlerRow, received: Array<Buffer>, receivedAtMs: number, receivedAtPerfMs: number, seq: number): Job =>
    Effect.suspend(() => {
      if (!answerNow(row, received, receivedAtPerfMs)) return options.pooled(row, received, receivedAtMs, seq)
      barrier.exit(seq)
      return Effect.void
    })

  const serve = (row: HandlerRow, received: Array<Buffer>): boolean => {
    const receivedAtPerfMs = performance.now()
    if (dispatcher.hasFreeSlot(row.pool)) {
      if (!answerNow(row, received, receivedAtPerfMs)) return false
      answered++
      return true
    }
    if (row.pool === "AFFINITY") return false
    const seq = barrier.enter()
    // The peer's own share of the pool (Dispatch.ts: fair between peers).
    if (!dispatcher.submit(row.pool, hexOf(received[0]!), fastJob(row, received, Date.now(), receivedAtPerfMs, seq))) {
      barrier.exit(seq)
      return false
    }
    queued++
    return true
  }

  const rowOf = (received: Array<Buffer>): HandlerRow | undefined => {
    if (received.length < 3 || !options.isServed(received[0]!)) return undefined
    const opId = decodeHeaderInt(received[2]!)
    const row = opId === undefined ? undefined : table.byId.get(opId)
    if (row?.fast === undefined || received.length - 3 !== row.op.payload.length) return undefined
    return decodeHeaderInt(received[1]!) === undefined ? undefined : row
  }

  return { rowOf, serve, stats: () => ({ answered, queued }) }
}
