/**
 * L2 keys and values (issue 15 item 3, DESIGN §9): one key per chunk object,
 *
 *   `<prefix>:v1:<model>~<layout fingerprint>@<kv rank>@<chunk hash hex>[@<cache salt>]`
 *
 * where the chunk hash and kv rank are L1's own (ObjectKey) and the
 * fingerprint (16 hex digits) is xxHash3-64 of the layout of one object —
 * dtype, chunk size, shape `[2, num_layers, chunk_size, hidden_dim]` — so
 * engines with incompatible layouts never read each other's bytes. No hash
 * tags: chunks spread over every slot of a Cluster.
 *
 * A value is a 32-byte header followed by the raw object bytes:
 *
 *   offset  size  field
 *   0       4     magic "MPL2"
 *   4       2     format version (1), little-endian
 *   6       2     reserved (0)
 *   8       8     layout fingerprint (the key's, as 8 bytes)
 *   16      8     payload length in bytes, little-endian uint64
 *   24      8     xxHash3-64 of the payload
 *
 * Any mismatch on read (short value, magic, version, fingerprint, length,
 * checksum) makes the value corrupt: the caller treats it as a miss and
 * deletes the key.
 */
import { hashHex } from "../../kv/TokenHasher.ts"
import type { KvLayout } from "../LayoutRegistry.ts"
import type { ObjectKey } from "../ObjectKey.ts"

/** Bytes of the value header. */
export const HEADER_BYTES = 32
const MAGIC = 0x324c504d // "MPL2" read as little-endian uint32
const VERSION = 1

/**
 * xxHash3-64 (seed 0) of `bytes` as 8 bytes, big-endian. From @node-rs/xxhash (native, ~10 GB/s
 * here with its streaming state; its one-shot `xxh3.xxh64` runs at a sixth of that); where its
 * binding is not built for the platform, hash-wasm's (WebAssembly, ~2.7 GB/s), which gives the
 * same values. Every value is hashed on the JS thread, between the socket's writes, so its speed
 * is L2's (issue 15, bench:l2).
 */
const xxh3: (bytes: Uint8Array) => Buffer = await import("@node-rs/xxhash").then(
  ({ xxh3: native }) => {
    const state = native.Xxh3.withSeed(0n)
    return (bytes: Uint8Array) => {
      state.reset()
      const out = Buffer.allocUnsafe(8)
      out.writeBigUInt64BE(state.update(bytes).digest())
      return out
    }
  },
  async () => {
    const { createXXHash3 } = await import("hash-wasm")
    const state = await createXXHash3()
    return (bytes: Uint8Array) => {
      state.init()
      state.update(bytes)
      return Buffer.from(state.digest("binary"))
    }
  }
)

/** The layout fingerprint of a model's objects (16 hex digits). */
export const layoutFingerprint = (layout: KvLayout, chunkSizeTokens: number): string =>
  xxh3(Buffer.from(`${layout.dtype}|${chunkSizeTokens}|2x${layout.numLayers}x${chunkSizeTokens}x${layout.hiddenDim}|${layout.chunkBytes}`))
    .toString("hex")

/** The L2 key of an L1 object under `prefix` and `fingerprint`. */
export const l2KeyOf = (prefix: string, fingerprint: string, key: ObjectKey): string =>
  `${prefix}:v1:${key.modelName}~${fingerprint}@${key.kvRank}@${hashHex(key.hash)}${key.cacheSalt === "" ? "" : `@${key.cacheSalt}`}`

/** Writes the header of `payload` into `header` (HEADER_BYTES bytes). */
const writeHeader = (header: Buffer, fingerprint: string, payload: Uint8Array): void => {
  header.writeUInt32LE(MAGIC, 0)
  header.writeUInt16LE(VERSION, 4)
  header.writeUInt16LE(0, 6)
  header.write(fingerprint, 8, 8, "hex")
  header.writeBigUInt64LE(BigInt(payload.length), 16)
  xxh3(payload).copy(header, 24)
}

/** The value of `payload`: header then a copy of the bytes (one allocation). */
export const encodeValue = (fingerprint: string, payload: Uint8Array): Buffer => {
  const out = Buffer.allocUnsafe(HEADER_BYTES + payload.length)
  writeHeader(out, fingerprint, payload)
  out.set(payload, HEADER_BYTES)
  return out
}

/**
 * The value of the last `payloadBytes` bytes of `extent`, without a copy: the header is written into the
 * HEADER_BYTES bytes before them and the value is a view of `extent` (an L1 object with headroom,
 * L1Store). Undefined when `extent` has less room than that in front of the payload.
 */
export const frameValue = (fingerprint: string, extent: Buffer, payloadBytes: number): Buffer | undefined => {
  const start = extent.length - payloadBytes - HEADER_BYTES
  if (start < 0) return undefined
  const value = extent.subarray(start)
  writeHeader(value.subarray(0, HEADER_BYTES), fingerprint, value.subarray(HEADER_BYTES))
  return value
}

/** Why a value was refused. */
export type CorruptReason = "short" | "magic" | "version" | "fingerprint" | "length" | "checksum"

/**
 * The payload of `value` (a view, no copy) when it is a well-formed value of
 * `expectedBytes` bytes for `fingerprint`, else the reason it is corrupt.
 */
export const decodeValue = (
  value: Uint8Array,
  fingerprint: string,
  expectedBytes: number
): { readonly payload: Uint8Array } | { readonly corrupt: CorruptReason } => {
  if (value.length < HEADER_BYTES) return { corrupt: "short" }
  const b = Buffer.from(value.buffer, value.byteOffset, value.byteLength)
  if (b.readUInt32LE(0) !== MAGIC) return { corrupt: "magic" }
  if (b.readUInt16LE(4) !== VERSION) return { corrupt: "version" }
  if (b.toString("hex", 8, 16) !== fingerprint) return { corrupt: "fingerprint" }
  const length = b.readBigUInt64LE(16)
  if (length !== BigInt(expectedBytes) || b.length !== HEADER_BYTES + expectedBytes) return { corrupt: "length" }
  const payload = b.subarray(HEADER_BYTES)
  if (!xxh3(payload).equals(b.subarray(24, 32))) return { corrupt: "checksum" }
  return { payload }
}
