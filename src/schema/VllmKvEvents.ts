/**
 * vLLM's KV event stream on the wire (issue 28 item 4; vLLM's `vllm/distributed/kv_events.py` and
 * `examples/online_serving/kv_events_subscriber.py`): what mpcache's PUB sends and what its subscriber reads.
 *
 * - A message is three frames: the topic, the batch's sequence number (8 bytes, big-endian, from 0 for each
 *   server start), the payload.
 * - The payload is msgpack of `KVEventBatch`, a msgspec struct with `array_like=True, omit_defaults=True`:
 *   `[ts, events]` (`ts` seconds since the epoch, a float; `data_parallel_rank`, default None, omitted).
 * - Each event is a tagged array-like struct, the tag (the class name) first:
 *   `["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium]`,
 *   `["BlockRemoved", block_hashes, medium]`, `["AllBlocksCleared"]`. A hash is vLLM's `ExternalBlockHash`,
 *   `bytes | int`: mpcache sends its 32-byte chunk hashes as bytes (docs/kv-events.md); later vLLM fields with
 *   defaults (`lora_name`) are omitted and ignored when present.
 * - The replay ROUTER answers a request `["", start_seq (8 bytes)]` (a REQ's delimiter, or a DEALER that sends
 *   it) with `["", seq, payload]` for every buffered batch from `start_seq` on, then `["", END_SEQ, ""]`.
 */
import { Data } from "effect"
import { Packr } from "msgpackr"

/** vLLM's end-of-replay sequence number: -1 as a signed 8-byte big-endian integer. */
export const END_SEQ: Buffer = Buffer.from([0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff])

/** A block hash as vLLM's `ExternalBlockHash`: bytes (mpcache's) or an int64 (vLLM's own). */
export type ExternalBlockHash = Uint8Array | bigint | number

export type VllmKvEvent =
  | {
    readonly _tag: "BlockStored"
    readonly blockHashes: ReadonlyArray<ExternalBlockHash>
    readonly parentBlockHash: ExternalBlockHash | null
    /** A plain array when decoded; the publisher hands its records' Uint32Array over as is. */
    readonly tokenIds: ArrayLike<number>
    readonly blockSize: number
    readonly loraId: number | null
    readonly medium: string | null
  }
  | { readonly _tag: "BlockRemoved"; readonly blockHashes: ReadonlyArray<ExternalBlockHash>; readonly medium: string | null }
  | { readonly _tag: "AllBlocksCleared" }

/** One decoded `KVEventBatch`. */
export interface VllmKvEventBatch {
  readonly ts: number
  readonly events: ReadonlyArray<VllmKvEvent>
  readonly dataParallelRank: number | null
}

/** A payload that is not a `KVEventBatch`: what was wrong, where. */
export class KvEventBatchInvalid extends Data.TaggedError("KvEventBatchInvalid")<{ readonly reason: string }> {
  override get message() {
    return `not a vLLM KVEventBatch: ${this.reason}`
  }
}

// Plain msgpack, as msgspec writes and reads it: no records, no extensions; ints past 2^53 as bigint.
const packr = new Packr({ useRecords: false, moreTypes: false, int64AsType: "bigint", mapsAsObjects: true })

/**
 * The payload of one batch of `events` at `tsSeconds`: msgpack written directly (the publisher's hot path; a
 * generic encoder spends most of its time on the 256 token ids of each BlockStored). `ts` is always a float64;
 * ints as their shortest msgpack form; hashes as bin (vLLM's `bytes`), or as ints when given as numbers/bigints.
 */
export const encodeKvEventBatch = (tsSeconds: number, events: ReadonlyArray<VllmKvEvent>): Buffer => {
  let size = 1 + 9 + 5
  for (const e of events) size += sizeOf(e)
  // Written into a scratch buffer kept between batches (no zero-filled megabyte per batch), then copied out at
  // its exact size: the replay buffer keeps what was sent, not an upper bound of it.
  if (scratch.length < size) (scratch = Buffer.allocUnsafeSlow(Math.max(size, 2 * scratch.length)), view = new DataView(scratch.buffer, scratch.byteOffset, scratch.length))
  const out = scratch
  let at = 0
  const u8 = (v: number) => {
    out[at++] = v
  }
  const arrayHeader = (n: number) => {
    if (n < 16) u8(0x90 | n)
    else if (n < 0x10000) (u8(0xdc), out.writeUInt16BE(n, at), at += 2)
    else (u8(0xdd), out.writeUInt32BE(n, at), at += 4)
  }
  const str = (s: string) => {
    const n = Buffer.byteLength(s)
    if (n < 32) u8(0xa0 | n)
    else if (n < 256) (u8(0xd9), u8(n))
    else (u8(0xda), out.writeUInt16BE(n, at), at += 2)
    at += out.write(s, at)
  }
  const int = (v: number) => {
    if (v >= 0) {
      if (v < 128) u8(v)
      else if (v < 256) (u8(0xcc), u8(v))
      else if (v < 0x10000) {
        out[at] = 0xcd
        out[at + 1] = v >>> 8
        out[at + 2] = v & 0xff
        at += 3
      } else if (v < 2 ** 32) {
        out[at] = 0xce
        out[at + 1] = v >>> 24
        out[at + 2] = (v >>> 16) & 0xff
        out[at + 3] = (v >>> 8) & 0xff
        out[at + 4] = v & 0xff
        at += 5
      } else (u8(0xcf), out.writeBigUInt64BE(BigInt(v), at), at += 8)
    } else if (v >= -32) u8(v & 0xff)
    else (u8(0xd3), out.writeBigInt64BE(BigInt(v), at), at += 8)
  }
  const hash = (h: ExternalBlockHash | null) => {
    if (h === null) return u8(0xc0)
    if (typeof h === "bigint") return h >= 0n ? (u8(0xcf), out.writeBigUInt64BE(h, at), at += 8) : (u8(0xd3), out.writeBigInt64BE(h, at), at += 8)
    if (typeof h === "number") return int(h)
    if (h.length < 256) (u8(0xc4), u8(h.length))
    else (u8(0xc5), out.writeUInt16BE(h.length, at), at += 2)
    out.set(h, at)
    at += h.length
  }
  const hashes = (hs: ReadonlyArray<ExternalBlockHash>) => {
    arrayHeader(hs.length)
    for (const h of hs) hash(h)
  }
  const optStr = (s: string | null) => (s === null ? u8(0xc0) : str(s))
  arrayHeader(2)
  u8(0xcb)
  out.writeDoubleBE(tsSeconds, at)
  at += 8
  arrayHeader(events.length)
  for (const e of events) {
    if (e._tag === "BlockStored") {
      arrayHeader(7)
      str("BlockStored")
      hashes(e.blockHashes)
      hash(e.parentBlockHash)
      const t = e.tokenIds
      arrayHeader(t.length)
      // The hot loop (256 ids an event): a local cursor, unsigned 32-bit ids inline, anything else through int().
      let p = at
      for (let i = 0; i < t.length; i++) {
        const v = t[i]!
        if (v < 128 && v >= 0) out[p++] = v
        else if (v < 0x10000 && v >= 0) {
          if (v < 256) (out[p] = 0xcc, out[p + 1] = v, p += 2)
          else (out[p] = 0xcd, out[p + 1] = v >>> 8, out[p + 2] = v & 0xff, p += 3)
        } else if (v < 2 ** 32 && v >= 0 && Number.isInteger(v)) {
          view.setUint32(p + 1, v)
          out[p] = 0xce
          p += 5
        } else {
          at = p
          int(v)
          p = at
        }
      }
      at = p
      int(e.blockSize)
      if (e.loraId === null) u8(0xc0)
      else int(e.loraId)
      optStr(e.medium)
    } else if (e._tag === "BlockRemoved") {
      arrayHeader(3)
      str("BlockRemoved")
      hashes(e.blockHashes)
      optStr(e.medium)
    } else {
      arrayHeader(1)
      str("AllBlocksCleared")
    }
  }
  return Buffer.copyBytesFrom(out, 0, at)
}

let scratch = Buffer.allocUnsafeSlow(1 << 16)
let view = new DataView(scratch.buffer, scratch.byteOffset, scratch.length)

/** An upper bound of one event's encoded size. */
const sizeOf = (e: VllmKvEvent): number => {
  const hashBytes = (hs: ReadonlyArray<ExternalBlockHash>) => 5 + hs.reduce<number>((n, h) => n + (h instanceof Uint8Array ? 3 + h.length : 9), 0)
  const strBytes = (s: string | null) => (s === null ? 1 : 3 + Buffer.byteLength(s))
  if (e._tag === "BlockStored") {
    return 1 + 12 + hashBytes(e.blockHashes) + (e.parentBlockHash instanceof Uint8Array ? 3 + e.parentBlockHash.length : 9) +
      5 + 9 * e.tokenIds.length + 9 + 9 + strBytes(e.medium)
  }
  if (e._tag === "BlockRemoved") return 1 + 13 + hashBytes(e.blockHashes) + strBytes(e.medium)
  return 1 + 17
}

/** A sequence number frame: 8 bytes, big-endian. */
export const seqFrame = (seq: number): Buffer => {
  const b = Buffer.allocUnsafe(8)
  b.writeBigUInt64BE(BigInt(seq))
  return b
}

/** The sequence number of an 8-byte frame; -1 for END_SEQ; undefined when the frame is not 8 bytes. */
export const seqOf = (frame: Uint8Array): number | undefined => {
  if (frame.length !== 8) return undefined
  const v = Buffer.from(frame.buffer, frame.byteOffset, 8).readBigInt64BE()
  return v < -1n || v > BigInt(Number.MAX_SAFE_INTEGER) ? undefined : Number(v)
}

const isHash = (h: unknown): h is ExternalBlockHash =>
  h instanceof Uint8Array || typeof h === "bigint" || (typeof h === "number" && Number.isInteger(h))

const hashes = (v: unknown, where: string): ReadonlyArray<ExternalBlockHash> => {
  if (!Array.isArray(v) || !v.every(isHash)) throw new KvEventBatchInvalid({ reason: `${where}: block_hashes must be a list of bytes or ints` })
  return v
}

const optString = (v: unknown, where: string): string | null => {
  if (v === undefined || v === null) return null
  if (typeof v !== "string") throw new KvEventBatchInvalid({ reason: `${where}: medium must be a string or nil` })
  return v
}

const eventOf = (v: unknown, i: number): VllmKvEvent => {
  const where = `event ${i}`
  if (!Array.isArray(v) || typeof v[0] !== "string") throw new KvEventBatchInvalid({ reason: `${where} is not a tagged array` })
  switch (v[0]) {
    case "BlockStored": {
      if (v.length < 6) throw new KvEventBatchInvalid({ reason: `${where}: BlockStored has ${v.length - 1} fields, expected at least 5` })
      const [, bh, parent, tokens, blockSize, loraId, medium] = v
      if (parent !== null && !isHash(parent)) throw new KvEventBatchInvalid({ reason: `${where}: parent_block_hash must be bytes, an int or nil` })
      if (!Array.isArray(tokens) || !tokens.every((t) => Number.isInteger(t))) {
        throw new KvEventBatchInvalid({ reason: `${where}: token_ids must be a list of ints` })
      }
      if (!Number.isInteger(blockSize)) throw new KvEventBatchInvalid({ reason: `${where}: block_size must be an int` })
      if (loraId !== null && loraId !== undefined && !Number.isInteger(loraId)) {
        throw new KvEventBatchInvalid({ reason: `${where}: lora_id must be an int or nil` })
      }
      return {
        _tag: "BlockStored",
        blockHashes: hashes(bh, where),
        parentBlockHash: parent as ExternalBlockHash | null,
        tokenIds: tokens as Array<number>,
        blockSize: blockSize as number,
        loraId: (loraId ?? null) as number | null,
        medium: optString(medium, where)
      }
    }
    case "BlockRemoved":
      return { _tag: "BlockRemoved", blockHashes: hashes(v[1], where), medium: optString(v[2], where) }
    case "AllBlocksCleared":
      return { _tag: "AllBlocksCleared" }
    default:
      throw new KvEventBatchInvalid({ reason: `${where}: unknown tag "${v[0]}" (expected BlockStored, BlockRemoved or AllBlocksCleared)` })
  }
}

/** Decodes one payload; a `KvEventBatchInvalid` saying what was wrong when it is not a `KVEventBatch`. */
export const decodeKvEventBatch = (payload: Uint8Array): VllmKvEventBatch | KvEventBatchInvalid => {
  try {
    const v: unknown = packr.unpack(payload)
    if (!Array.isArray(v) || v.length < 2) return new KvEventBatchInvalid({ reason: "the payload is not an array [ts, events, …]" })
    const [ts, events, rank] = v
    if (typeof ts !== "number") return new KvEventBatchInvalid({ reason: "ts must be a number" })
    if (!Array.isArray(events)) return new KvEventBatchInvalid({ reason: "events must be a list" })
    if (rank !== undefined && rank !== null && !Number.isInteger(rank)) return new KvEventBatchInvalid({ reason: "data_parallel_rank must be an int or nil" })
    return { ts, events: events.map(eventOf), dataParallelRank: (rank ?? null) as number | null }
  } catch (e) {
    return e instanceof KvEventBatchInvalid ? e : new KvEventBatchInvalid({ reason: `not msgpack (${e instanceof Error ? e.message : String(e)})` })
  }
}
