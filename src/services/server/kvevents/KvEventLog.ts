/**
 * The KV event log (DESIGN §10; issue 28 item 1): what changes what the server holds, one bounded, sequenced log
 * that routers read to learn which chunks each server has. The channels (POLL_KV_EVENTS, the ZeroMQ PUB) read it;
 * the tiers append to it. Plain data, synchronous, owned by one server.
 *
 * - Bounded: at most `capacity` records (`--kv-event-log-size`, default 32,768); the oldest go first. Capacity 0
 *   turns events off: nothing is kept, every read says `enabled: false`.
 * - Sequence numbers are consecutive from 1, one per record; the `incarnation` is fixed when the log is made
 *   (at server start), so a consumer sees a restart as a new incarnation, never as sequence numbers going back.
 * - Never a silent gap. A read's `cursor` is the last sequence number the consumer has applied (0 on first
 *   contact). The answer is `lost` when the cursor predates the oldest record kept (records after it were
 *   dropped), was never issued by this log (ahead of the newest: another incarnation's), or the range holds a
 *   record the log could not keep (`dropped`, a gap marker that takes a sequence number of its own). A `lost`
 *   answer starts over: it carries the records from the oldest kept after the last gap, and the consumer drops
 *   everything it had from this server (resyncs) before applying them.
 * - Reads filter by model and, under tenancy, by salt group (a tenant reads only its own; admins read all): the
 *   cursor still moves past the records it skips, so the consumer's next read starts where this one ended.
 * - A `stored` record's token ids live in the log's own token ring, one slot of `tokensPerRecord` ids per record,
 *   copied in at append: the log's memory is fixed by its size (a full default log holds 32 MiB of them in 32
 *   arrays), and a STORE allocates no array per chunk for them. A
 *   record's `tokenIds` is a view of its slot, valid until `capacity` more records are appended: readers use it at
 *   once (the poll's answer, the PUB's batch) or copy it.
 */

/** Where a chunk is (vLLM's `medium`): L1 (`CPU`), the L2 tier (`STORAGE`). */
export type KvMedium = "CPU" | "STORAGE"

/**
 * A chunk's token ids as a window of a larger array (a STORE's whole prompt, as decoded): `count` ids from `start`.
 * Nothing is copied until the log appends the record.
 */
export interface TokenWindow {
  readonly ids: ArrayLike<number>
  readonly start: number
  readonly count: number
}

/** The window of all of `ids`. */
export const wholeWindow = (ids: ArrayLike<number>): TokenWindow => ({ ids, start: 0, count: ids.length })

/** What a `stored` and a `removed` record say, whoever made them. */
interface StoredFields {
  /** A chunk became readable in `medium`: its L1 object committed (CPU), its L2 write-through completed (STORAGE). */
  readonly kind: "stored"
  readonly model: string
  readonly medium: KvMedium
  /** The salt group under tenancy ("" without). */
  readonly saltGroup: string
  /** The chunk's 32-byte prefix hash (the L1 key's; docs/kv-events.md). */
  readonly chunkHash: Uint8Array
  /** The previous chunk's hash, null for a prompt's first chunk. */
  readonly parentHash: Uint8Array | null
}
interface RemovedFields {
  /** Chunks left `medium`: evicted, dropped by CLEAR (each chunk named), an L2 value deleted as corrupt. */
  readonly kind: "removed"
  readonly model: string
  readonly medium: KvMedium
  readonly saltGroup: string
  readonly chunkHashes: ReadonlyArray<Uint8Array>
}

/** What a record says, before the log gives it its sequence number: a stored chunk's tokens as a window. */
export type KvEvent = (StoredFields & { readonly tokens: TokenWindow }) | RemovedFields

/**
 * A kept record: its sequence number and when it was appended (ms since the epoch); a stored chunk's token ids are
 * a view of its slot in the log's token ring (valid until `capacity` more appends: see the module comment).
 */
export type KvEventRecord = ((StoredFields & { readonly tokenIds: Uint32Array }) | RemovedFields) & {
  readonly seq: number
  readonly atMs: number
}

/** One read's answer (POLL_KV_EVENTS's result). */
export interface KvEventPoll {
  readonly records: ReadonlyArray<KvEventRecord>
  /** The cursor for the next read: the last sequence number this read looked at. */
  readonly nextCursor: number
  /** The consumer must resync: drop what it knows of this server, then apply `records`. */
  readonly lost: boolean
  readonly incarnation: number
  readonly enabled: boolean
}

/** What a read asks for. */
export interface KvEventQuery {
  readonly cursor: number
  readonly maxEvents: number
  /** Only this model's chunks; undefined: every model's (the server's own publisher). */
  readonly model?: string | undefined
  /** Only this salt group's records; undefined: every group's (an admin, or no tenancy). */
  readonly saltGroup?: string | undefined
}

export interface KvEventLogStats {
  readonly enabled: boolean
  readonly capacity: number
  readonly incarnation: number
  /** Records kept now. */
  readonly depth: number
  /** The oldest and newest sequence numbers kept (0 when none). */
  readonly oldestSeq: number
  readonly newestSeq: number
  /** Records appended since start, by kind; gap markers (reads answered `lost` are the channels' to count). */
  readonly appended: Readonly<Record<KvEvent["kind"], number>>
  readonly dropped: number
}

export interface KvEventLog {
  readonly enabled: boolean
  readonly incarnation: number
  /** Appends `event`; its sequence number (0 when events are off). */
  readonly append: (event: KvEvent) => number
  /** A record that could not be kept: a gap marker takes the next sequence number, so every read over it is `lost`. */
  readonly dropped: () => void
  readonly read: (query: KvEventQuery) => KvEventPoll
  /** The newest sequence number issued (0 before the first record): what a reader is caught up to. */
  readonly newestSeq: () => number
  readonly stats: () => KvEventLogStats
}

type Slot = KvEventRecord | { readonly kind: "gap"; readonly seq: number }

const matches = (r: KvEventRecord, q: KvEventQuery): boolean =>
  (q.saltGroup === undefined || r.saltGroup === q.saltGroup) && (q.model === undefined || r.model === q.model)

/** Records a segment of the token ring holds: the ring is allocated a segment at a time, as the log fills. */
const SEGMENT_RECORDS = 1024

/**
 * The token ring of a log of `capacity` records, `perRecord` ids a slot: the function returned copies a window into
 * slot `slot` and returns the view of what it copied (a window longer than a slot gets an array of its own).
 */
const makeTokenRing = (capacity: number, perRecord: number) => {
  const segments: Array<Uint32Array | undefined> = []
  return (slot: number, w: TokenWindow): Uint32Array => {
    // What the array holds of the window, not what it claimed: a window past its array's end never shows a slot's old ids.
    const n = Math.max(0, Math.min(w.count, w.ids.length - w.start))
    const index = Math.floor(slot / SEGMENT_RECORDS)
    const own = n > perRecord
    const into = own
      ? new Uint32Array(n)
      : segments[index] ??= new Uint32Array(Math.min(SEGMENT_RECORDS, capacity - index * SEGMENT_RECORDS) * perRecord)
    const at = own ? 0 : (slot % SEGMENT_RECORDS) * perRecord
    const { ids, start } = w
    for (let i = 0; i < n; i++) into[at + i] = ids[start + i]!
    return into.subarray(at, at + n)
  }
}

/** Token ids a slot of the ring holds unless the log is told otherwise: LMCache's default chunk size. */
const DEFAULT_TOKENS_PER_RECORD = 256

/**
 * A log of `capacity` records (0: off) for the incarnation `incarnation` (the server's: a random safe integer
 * drawn at start, as upstream's `KVEventPollResult.incarnation` is an int), its times from `nowMs`; a stored
 * record's token ids in a ring slot of `tokensPerRecord` (the server's chunk size; default 256).
 */
export const makeKvEventLog = (options: {
  readonly capacity: number
  readonly incarnation: number
  readonly tokensPerRecord?: number
  readonly nowMs?: () => number
  /** Told after each append or gap marker (synchronously: it must only signal, e.g. open a latch). */
  readonly onAppend?: () => void
}): KvEventLog => {
  const capacity = Math.max(0, Math.floor(options.capacity))
  const nowMs = options.nowMs ?? Date.now
  const onAppend = options.onAppend ?? (() => {})
  const enabled = capacity > 0
  const ring: Array<Slot | undefined> = new Array(capacity)
  const tokensInto = makeTokenRing(capacity, Math.max(1, Math.floor(options.tokensPerRecord ?? DEFAULT_TOKENS_PER_RECORD)))
  let newest = 0
  const appended: Record<KvEvent["kind"], number> = { stored: 0, removed: 0 }
  let drops = 0
  const oldestSeq = () => (newest === 0 ? 0 : Math.max(1, newest - capacity + 1))
  const slot = (seq: number): Slot => ring[(seq - 1) % capacity]!
  const put = (s: Slot) => {
    ring[(s.seq - 1) % capacity] = s
  }

  /** From `from` on (inclusive), up to `maxEvents` matching records: the records and the last sequence number looked at. */
  const scan = (from: number, q: KvEventQuery): { records: Array<KvEventRecord>; last: number; gap: boolean } => {
    const records: Array<KvEventRecord> = []
    let last = from - 1
    for (let seq = from; seq <= newest && records.length < q.maxEvents; seq++) {
      const s = slot(seq)
      last = seq
      if (s.kind === "gap") return { records, last, gap: true }
      if (matches(s, q)) records.push(s)
    }
    return { records, last, gap: false }
  }

  /** A fresh start: from the oldest record kept after the last gap marker. */
  const restart = (q: KvEventQuery): KvEventPoll => {
    let from = oldestSeq()
    for (let seq = newest; seq >= oldestSeq() && seq > 0; seq--) {
      if (slot(seq).kind === "gap") {
        from = seq + 1
        break
      }
    }
    const { records, last } = scan(from, q)
    return { records, nextCursor: Math.max(last, from - 1), lost: true, incarnation: options.incarnation, enabled }
  }

  return {
    enabled,
    incarnation: options.incarnation,
    append: (event) => {
      if (!enabled) return 0
      const seq = ++newest
      const atMs = nowMs()
      put(
        event.kind === "stored"
          ? {
            kind: "stored",
            model: event.model,
            medium: event.medium,
            saltGroup: event.saltGroup,
            chunkHash: event.chunkHash,
            parentHash: event.parentHash,
            tokenIds: tokensInto((seq - 1) % capacity, event.tokens),
            seq,
            atMs
          }
          : { ...event, seq, atMs }
      )
      appended[event.kind]++
      onAppend()
      return seq
    },
    dropped: () => {
      if (!enabled) return
      drops++
      put({ kind: "gap", seq: ++newest })
      onAppend()
    },
    read: (q) => {
      if (!enabled) return { records: [], nextCursor: 0, lost: false, incarnation: options.incarnation, enabled }
      const oldest = oldestSeq()
      // Never issued here, or records after it already gone: start over.
      if (q.cursor > newest || (newest > 0 && q.cursor + 1 < oldest)) return restart(q)
      const { records, last, gap } = scan(q.cursor + 1, q)
      if (gap) return restart(q)
      return { records, nextCursor: Math.max(last, q.cursor), lost: false, incarnation: options.incarnation, enabled }
    },
    newestSeq: () => newest,
    stats: () => ({
      enabled,
      capacity,
      incarnation: options.incarnation,
      depth: newest === 0 ? 0 : newest - oldestSeq() + 1,
      oldestSeq: oldestSeq(),
      newestSeq: newest,
      appended: { ...appended },
      dropped: drops
    })
  }
}
