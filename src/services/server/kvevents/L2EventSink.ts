/**
 * What the L2 tier tells the KV event log (issue 28 item 2; docs/kv-events.md): a chunk is `stored` with medium
 * `STORAGE` when the write-through of its kv rank 0 object has completed (the SET wrote it, or found the key there
 * already: either way L2 holds it now), and `removed` from `STORAGE` when a value of any of its ranks was found
 * corrupt or unauthenticated and deleted (a LOOKUP needs every rank, so one missing rank loses the chunk).
 *
 * Rank 0 stands for the chunk because every deployment has it and L2 keeps no per-chunk count (it can hold far
 * more chunks than L1, and TTL expiry and Redis's own eviction are invisible to the server, so a count would drift):
 * a `STORAGE` record is a hint that L2 is worth asking, never a promise. A chunk written again (re-stored after an
 * L1 eviction) is announced again; for an index, a set, that changes nothing.
 */
import type { ObjectKey } from "../ObjectKey.ts"
import type { KvEventLog } from "./KvEventLog.ts"
import { type ChunkOrigin, storedRecord } from "./L1EventSink.ts"

/** The L2 tier's side of the log. `saltGroup` is the object's under tenancy ("" without). */
export interface L2EventSink {
  /** The write-through of `key` completed: announced when `key` is its chunk's rank 0 object. */
  readonly written: (key: ObjectKey, saltGroup: string, origin: ChunkOrigin | undefined) => void
  /** The L2 value of `key` was deleted (corrupt or unauthenticated): its chunk left STORAGE. */
  readonly deleted: (key: ObjectKey, saltGroup: string) => void
}

/** A sink appending to `log`. */
export const makeL2EventSink = (log: KvEventLog): L2EventSink => ({
  written: (key, saltGroup, origin) => {
    if (key.kvRank !== 0) return
    log.append(storedRecord(key, "STORAGE", saltGroup, origin))
  },
  deleted: (key, saltGroup) => {
    log.append({ kind: "removed", model: key.modelName, medium: "STORAGE", saltGroup, chunkHashes: [key.hash] })
  }
})
