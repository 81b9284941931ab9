/**
 * The KV event log (src/services/server/kvevents/KvEventLog.ts; DESIGN §10, issue 28 item 1): consecutive
 * sequence numbers from 1, bounded, an incarnation, and `lost` — never a silent gap — for a cursor older than the
 * oldest record, one never issued, or a range over a record the log could not keep; reads filtered by model and
 * salt group with the cursor moving past what they skip.
 */
import { assert, describe, it } from "@effect/vitest"
import { type KvEvent, type KvEventRecord, makeKvEventLog, wholeWindow } from "../../../../src/services/server/kvevents/KvEventLog.ts"

const hash = (n: number) => new Uint8Array(32).fill(n)
const stored = (n: number, model = "m", saltGroup = ""): Extract<KvEvent, { kind: "stored" }> => ({
  kind: "stored",
  model,
  medium: "CPU",
  saltGroup,
  chunkHash: hash(n),
  parentHash: n === 1 ? null : hash(n - 1),
  tokens: wholeWindow([n, n + 1])
})
const seqs = (r: { readonly records: ReadonlyArray<{ readonly seq: number }> }) => r.records.map((x) => x.seq)
const log = (capacity: number) => makeKvEventLog({ capacity, incarnation: 41, nowMs: () => 1_000 })

describe("KvEventLog", () => {
  it("sequence numbers are consecutive from 1; a read from a cursor gets what follows it, up to max_events, and the next cursor", () => {
    const l = log(8)
    assert.deepStrictEqual([1, 2, 3].map((n) => l.append(stored(n))), [1, 2, 3])
    const first = l.read({ cursor: 0, maxEvents: 2, model: "m" })
    assert.deepStrictEqual([seqs(first), first.nextCursor, first.lost, first.incarnation, first.enabled], [[1, 2], 2, false, 41, true])
    const { tokens: _, ...fields } = stored(1)
    assert.deepStrictEqual(first.records[0], { ...fields, tokenIds: Uint32Array.of(1, 2), seq: 1, atMs: 1_000 })
    const rest = l.read({ cursor: 2, maxEvents: 10, model: "m" })
    assert.deepStrictEqual([seqs(rest), rest.nextCursor, rest.lost], [[3], 3, false])
    const none = l.read({ cursor: 3, maxEvents: 10, model: "m" })
    assert.deepStrictEqual([seqs(none), none.nextCursor, none.lost], [[], 3, false])
  })

  it("bounded: the oldest go first; a cursor whose next record is gone is lost, and the answer starts over from the oldest kept", () => {
    const l = log(3)
    for (let n = 1; n <= 5; n++) l.append(stored(n))
    assert.deepStrictEqual([l.stats().oldestSeq, l.stats().newestSeq, l.stats().depth], [3, 5, 3])
    // Cursor 2: record 3 is next and kept — nothing lost.
    assert.deepStrictEqual([seqs(l.read({ cursor: 2, maxEvents: 9, model: "m" })), l.read({ cursor: 2, maxEvents: 9, model: "m" }).lost], [[3, 4, 5], false])
    // Cursor 1: record 2 is gone.
    const lost = l.read({ cursor: 1, maxEvents: 9, model: "m" })
    assert.deepStrictEqual([seqs(lost), lost.nextCursor, lost.lost], [[3, 4, 5], 5, true])
    // Cursor 0 on a log whose first records are gone: a first contact too late, lost.
    assert.isTrue(l.read({ cursor: 0, maxEvents: 9, model: "m" }).lost)
  })

  it("a cursor this log never issued (another incarnation's, ahead of the newest) is lost", () => {
    const l = log(8)
    l.append(stored(1))
    const r = l.read({ cursor: 40, maxEvents: 9, model: "m" })
    assert.deepStrictEqual([seqs(r), r.nextCursor, r.lost], [[1], 1, true])
  })

  it("a record the log could not keep is a gap: any read over it is lost and starts after it", () => {
    const l = log(8)
    l.append(stored(1))
    l.dropped()
    l.append(stored(3))
    const over = l.read({ cursor: 0, maxEvents: 9, model: "m" })
    assert.deepStrictEqual([seqs(over), over.nextCursor, over.lost], [[3], 3, true])
    const after = l.read({ cursor: 2, maxEvents: 9, model: "m" })
    assert.deepStrictEqual([seqs(after), after.lost], [[3], false])
    assert.strictEqual(l.stats().dropped, 1)
  })

  it("reads filter by model and salt group; the cursor moves past what they skip", () => {
    const l = log(16)
    l.append(stored(1, "m", "teamA"))
    l.append(stored(2, "other", "teamA"))
    l.append(stored(3, "m", "teamB"))
    l.append({ kind: "removed", model: "m", medium: "CPU", saltGroup: "teamB", chunkHashes: [hash(3)] })
    l.append({ kind: "removed", model: "m", medium: "CPU", saltGroup: "teamA", chunkHashes: [hash(1)] })
    const a = l.read({ cursor: 0, maxEvents: 9, model: "m", saltGroup: "teamA" })
    assert.deepStrictEqual([a.records.map((r) => r.kind), seqs(a), a.nextCursor], [["stored", "removed"], [1, 5], 5])
    const admin = l.read({ cursor: 0, maxEvents: 9, model: "m" })
    assert.deepStrictEqual(seqs(admin), [1, 3, 4, 5])
    // max_events counts what is returned; the cursor stops at the last record looked at.
    const one = l.read({ cursor: 0, maxEvents: 1, model: "m", saltGroup: "teamB" })
    assert.deepStrictEqual([seqs(one), one.nextCursor], [[3], 3])
    assert.deepStrictEqual(l.stats().appended, { stored: 3, removed: 2 })
    assert.deepStrictEqual(seqs(l.read({ cursor: 3, maxEvents: 9, model: "m", saltGroup: "teamB" })), [4])
  })

  it("a stored record's tokens are its window's, copied into the log's ring: exact after the ring wraps and across its segments", () => {
    const tokensOf = (r: { readonly records: ReadonlyArray<KvEventRecord> }) =>
      r.records.map((x) => (x.kind === "stored" ? Array.from(x.tokenIds) : []))
    // A window of a larger array (a STORE's whole prompt): only its own ids, from its start.
    const w = makeKvEventLog({ capacity: 4, incarnation: 1, tokensPerRecord: 2 })
    const prompt = [10, 11, 12, 13, 14, 15]
    w.append({ ...stored(1), tokens: { ids: prompt, start: 2, count: 2 } })
    // A window longer than a slot gets an array of its own, whole.
    w.append({ ...stored(2), tokens: { ids: prompt, start: 1, count: 5 } })
    assert.deepStrictEqual(tokensOf(w.read({ cursor: 0, maxEvents: 9 })), [[12, 13], [11, 12, 13, 14, 15]])
    // A typed array's window; then, in slot 0 again (it held [12, 13]), a window claiming more ids than its array
    // has: it reads what was copied, never the slot's old ids.
    w.append({ ...stored(3), tokens: { ids: Uint32Array.of(20, 21, 22), start: 1, count: 2 } })
    w.append({ ...stored(4), tokens: wholeWindow([30, 31]) })
    w.append({ ...stored(5), tokens: { ids: [7], start: 0, count: 2 } })
    assert.deepStrictEqual(tokensOf(w.read({ cursor: 1, maxEvents: 9 })), [[11, 12, 13, 14, 15], [21, 22], [30, 31], [7]])
    // 1,600 records through a ring of 1,500 (two segments of 1,024 records): every kept record still reads its own.
    const l = makeKvEventLog({ capacity: 1_500, incarnation: 1, tokensPerRecord: 1 })
    for (let n = 1; n <= 1_600; n++) l.append({ ...stored(n), tokens: wholeWindow([n]) })
    const kept = l.read({ cursor: 100, maxEvents: 2_000 })
    assert.deepStrictEqual([kept.lost, seqs(kept).length], [false, 1_500])
    assert.deepStrictEqual(tokensOf(kept), Array.from({ length: 1_500 }, (_, i) => [101 + i]))
  })

  it("capacity 0 turns events off: nothing is kept, every read says so", () => {
    const l = log(0)
    assert.strictEqual(l.append(stored(1)), 0)
    l.dropped()
    assert.deepStrictEqual(l.read({ cursor: 0, maxEvents: 9, model: "m" }), { records: [], nextCursor: 0, lost: false, incarnation: 41, enabled: false })
    assert.deepStrictEqual([l.stats().enabled, l.stats().depth, l.stats().newestSeq], [false, 0, 0])
  })
})
