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
    readonly tokenIds: ReadonlyArray<number>
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

/** The payload of one batch of `events` at `tsSeconds`. */
export const encodeKvEventBatch = (tsSeconds: number, events: ReadonlyArray<VllmKvEvent>): Buffer =>
  packr.pack([
    tsSeconds,
    events.map((e) =>
      e._tag === "BlockStored"
        ? ["BlockStored", e.blockHashes, e.parentBlockHash, e.tokenIds, e.blockSize, e.loraId, e.medium]
        : e._tag === "BlockRemoved"
        ? ["BlockRemoved", e.blockHashes, e.medium]
        : ["AllBlocksCleared"]
    )
  ])

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
