/**
 * What L1 tells the KV event log (issue 28 item 2; docs/kv-events.md): a
 * chunk is `stored` (medium CPU) when the first of its kv ranks' objects
 * commits — never at a reservation, an abort or a faulted copy, which
 * publish nothing — and `removed` when the last of them leaves L1 (eviction,
 * CLEAR, CLEAR force). A chunk is one (model, cache salt, chunk hash): the
 * ranks of one prompt's chunk are one announcement, as upstream's log
 * deduplicates ranks, so the router's view is exactly the set of chunks of
 * which L1 holds at least one rank's object.
 */
import { keyOf } from "../internal/OutboxPeer.ts"
import type { ObjectKey } from "../ObjectKey.ts"
import type { KvEvent, KvEventLog, KvMedium, TokenWindow } from "./KvEventLog.ts"

/**
 * What a write reservation carries so that its commit can be announced: the chunk's tokens, as a window of the
 * request's own token ids (nothing copied until the log appends the record), and its parent.
 */
export interface ChunkOrigin extends TokenWindow {
  /** The previous chunk's hash; null for a prompt's first chunk. */
  readonly parentHash: Uint8Array | null
}

/**
 * The origin of chunk `index` of a prompt `tokenIds` in chunks of `chunk` tokens, whose prefix hashes from
 * chunk 0 on are `hashes` (TokenHasher.chunkHashes): its `chunk` tokens from `index * chunk`, its parent
 * `hashes[index - 1]`.
 */
export const originOf = (tokenIds: ArrayLike<number>, chunk: number, index: number, hashes: ReadonlyArray<Uint8Array>): ChunkOrigin => ({
  ids: tokenIds,
  start: index * chunk,
  count: chunk,
  parentHash: index === 0 ? null : hashes[index - 1]!
})

/** L1's side of the log. `saltGroup` is the object's owner under tenancy ("" without). */
export interface L1EventSink {
  /** An object committed (`origin`: what its reservation carried; none from a path that knows no tokens). */
  readonly committed: (key: ObjectKey, saltGroup: string, origin: ChunkOrigin | undefined) => void
  /** Committed objects left L1 together (one eviction's victims, one CLEAR's drops). */
  readonly removed: (objects: ReadonlyArray<{ readonly key: ObjectKey; readonly saltGroup: string }>) => void
  /** Chunks announced and still held (the index a router should have; status and the audit). */
  readonly heldChunks: () => number
}

const NO_TOKENS: TokenWindow = { ids: [], start: 0, count: 0 }

/** The `stored` record of `key`'s chunk in `medium`, with what `origin` says of its tokens and parent (none: empty, null). */
export const storedRecord = (key: ObjectKey, medium: KvMedium, saltGroup: string, origin: ChunkOrigin | undefined): KvEvent => ({
  kind: "stored",
  model: key.modelName,
  medium,
  saltGroup,
  chunkHash: key.hash,
  parentHash: origin?.parentHash ?? null,
  tokens: origin ?? NO_TOKENS
})

/**
 * The chunk an object belongs to: every rank's object of one (model, salt, hash) maps here. The hash one character
 * a byte (keyOf, as the outboxes key routing ids): half the length of hex.
 */
const chunkOf = (k: ObjectKey): string => `${keyOf(k.hash)}:${k.cacheSalt.length}:${k.cacheSalt}:${k.modelName}`

/** A sink appending to `log`, counting the ranks held per chunk. */
export const makeL1EventSink = (log: KvEventLog): L1EventSink => {
  const ranksHeld = new Map<string, number>()
  return {
    committed: (key, saltGroup, origin) => {
      const chunk = chunkOf(key)
      const n = ranksHeld.get(chunk) ?? 0
      ranksHeld.set(chunk, n + 1)
      if (n > 0) return
      log.append(storedRecord(key, "CPU", saltGroup, origin))
    },
    removed: (objects) => {
      // One record per (model, salt group) of the chunks whose last rank left, in the order they left.
      const groups = new Map<string, { model: string; saltGroup: string; hashes: Array<Uint8Array> }>()
      for (const { key, saltGroup } of objects) {
        const chunk = chunkOf(key)
        const n = ranksHeld.get(chunk) ?? 0
        if (n > 1) {
          ranksHeld.set(chunk, n - 1)
          continue
        }
        ranksHeld.delete(chunk)
        if (n === 0) continue
        const g = `${saltGroup.length}:${saltGroup}:${key.modelName}`
        let group = groups.get(g)
        if (group === undefined) groups.set(g, group = { model: key.modelName, saltGroup, hashes: [] })
        group.hashes.push(key.hash)
      }
      for (const g of groups.values()) {
        log.append({ kind: "removed", model: g.model, medium: "CPU", saltGroup: g.saltGroup, chunkHashes: g.hashes })
      }
    },
    heldChunks: () => ranksHeld.size
  }
}
