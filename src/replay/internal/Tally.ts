/**
 * The replay's counters: requests done, failed and retried, chunks and bytes
 * moved, latencies per stage, data mismatches and churn. Mutated by the
 * request fibers and the chaos fibers of one run (one JS thread: no races).
 *
 * @internal
 */
import type { Done } from "../Messages.ts"
import { Samples } from "../Stats.ts"
import type { TraceRequest } from "../Trace.ts"

export class Tally {
  done = 0
  failed = 0
  retried = 0
  lookedUp = 0
  hit = 0
  stored = 0
  retrieved = 0
  /** Hit chunks whose RETRIEVE the worker did not send (degraded mode), and those sent that failed. */
  retrieveNotSent = 0
  retrieveFailed = 0
  bytesStored = 0
  bytesRetrieved = 0
  killed = 0
  paused = 0
  replaced = 0
  readonly mismatches: Array<{ request: number; line: number; chunks: ReadonlyArray<number> }> = []
  /** Why requests failed (first 20). */
  readonly failures: Array<{ request: number; message: string }> = []
  readonly lat = { lookup: new Samples(), retrieve: new Samples(), compute: new Samples(), store: new Samples(), request: new Samples() }

  /** A request `r` the worker finished (`m`): its chunks, bytes, stage latencies and mismatches. */
  record(r: TraceRequest, m: Done): void {
    this.stored += m.storedChunks
    this.retrieved += m.retrievedChunks
    this.retrieveNotSent += m.unservedRetrieveChunks.notSent
    this.retrieveFailed += m.unservedRetrieveChunks.failed
    this.bytesStored += m.storedBytes
    this.bytesRetrieved += m.retrievedBytes
    if (m.retrievedChunks > 0) this.lat.retrieve.add(m.retrieveMs)
    if (m.storedChunks > 0) this.lat.store.add(m.storeMs)
    this.lat.compute.add(m.computeMs)
    if (m.mismatchedChunks.length > 0) this.mismatches.push({ request: r.index, line: r.line, chunks: m.mismatchedChunks })
  }
}
