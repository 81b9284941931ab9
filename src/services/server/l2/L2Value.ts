/**
 * L2 keys and values (issue 15 item 3, issue 24 item 14, DESIGN §9): one key
 * per chunk object,
 *
 *   `<prefix>:v1:<model>~<layout fingerprint>@<kv rank>@<chunk hash hex>[@<cache salt>]`
 *
 * where the chunk hash and kv rank are L1's own (ObjectKey) and the
 * fingerprint (16 hex digits) is xxHash3-64 of the layout of one object —
 * dtype, chunk size, shape `[2, num_layers, chunk_size, hidden_dim]` — so
 * engines with incompatible layouts never read each other's bytes. No hash
 * tags: chunks spread over every slot of a Cluster.
 *
 * A value is a header followed by the raw object bytes, in one of two
 * formats. Without `--l2-secret-file`, version 1, checksummed (32 bytes):
 *
 *   offset  size  field
 *   0       4     magic "MPL2"
 *   4       2     format version (1), little-endian
 *   6       2     reserved (0)
 *   8       8     layout fingerprint (the key's, as 8 bytes)
 *   16      8     payload length in bytes, little-endian uint64
 *   24      8     xxHash3-64 of the payload
 *
 * With `--l2-secret-file`, version 2, authenticated (64 bytes; L1 keeps 64
 * bytes of headroom before each object, so it is still written in place):
 *
 *   0       4     magic "MPL2"
 *   4       2     format version (2)
 *   6       2     reserved (0)
 *   8       8     layout fingerprint
 *   16      8     payload length, little-endian uint64
 *   24      8     reserved (0)
 *   32      32    HMAC-SHA256 (L2Mac.ts) over the full key, bytes 0–31 and the payload
 *
 * The MAC replaces the checksum: it is a strictly stronger integrity check
 * (any change of key, header or payload fails it), so a value is hashed
 * once, in one pass, on write and on read.
 *
 * Any mismatch on read makes the value refused: the caller treats it as a
 * miss and deletes the key. Corrupt: short value, magic, version,
 * fingerprint, length, checksum, and `keyed` (a version-2 value read
 * without a secret, which cannot be checked). Unauthenticated, with a
 * secret: `no_mac` (a version-1 value: written without a secret, by an
 * older server, or by anyone who can write to Redis) and `bad_mac` (a MAC
 * that does not verify: forged, or another fleet's secret).
 */
import { timingSafeEqual } from "node:crypto"
import { hashHex } from "../../kv/TokenHasher.ts"
import type { KvLayout } from "../LayoutRegistry.ts"
import type { ObjectKey } from "../ObjectKey.ts"
import { type L2MacKey, MAC_BYTES, macOf } from "./L2Mac.ts"

/** Bytes of a checksummed (version 1) value's header. */
export const HEADER_BYTES = 32
/** Bytes of an authenticated (version 2) value's header: the checksummed layout, the checksum slot reserved, then the MAC. */
export const MAC_HEADER_BYTES = 64
const MAGIC = 0x324c504d // "MPL2" read as little-endian uint32
const CHECKSUMMED = 1
const AUTHENTICATED = 2

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

/** Why a value was refused as damaged or unreadable (`mpcache_l2_corrupt_values_total{reason}`). */
export type CorruptReason = "short" | "magic" | "version" | "fingerprint" | "length" | "checksum" | "keyed"
/** Why a server with a secret refused a value as not authenticated (`mpcache_l2_unauthenticated_values_total{reason}`). */
export type UnauthenticatedReason = "no_mac" | "bad_mac"
/** Why a value was refused. */
export type RefusedReason = CorruptReason | UnauthenticatedReason

/** Whether `reason` is a failed authentication rather than damage. */
export const isUnauthenticated = (reason: RefusedReason): reason is UnauthenticatedReason => reason === "no_mac" || reason === "bad_mac"

/** A decoded value: its payload (a view, no copy), or why it was refused. */
export type Decoded = { readonly payload: Uint8Array } | { readonly refused: RefusedReason }

/**
 * How a server writes and checks values: `checksummed` without `--l2-secret-file`,
 * `authenticated(key)` with it. Every function takes the value's full L2 key (l2KeyOf), which an
 * authenticated value's MAC covers.
 */
export interface ValueFormat {
  /** Bytes of the header before the payload (HEADER_BYTES or MAC_HEADER_BYTES). */
  readonly headerBytes: number
  /** Whether values carry a MAC. */
  readonly authenticated: boolean
  /** The value of `payload`: header then a copy of the bytes (one allocation). */
  readonly encode: (l2Key: string, fingerprint: string, payload: Uint8Array) => Buffer
  /**
   * The value of the last `payloadBytes` bytes of `extent`, without a copy: the header is written
   * into the `headerBytes` bytes before them and the value is a view of `extent` (an L1 object with
   * headroom, L1Store). Undefined when `extent` has less room than that in front of the payload.
   */
  readonly frame: (l2Key: string, fingerprint: string, extent: Buffer, payloadBytes: number) => Buffer | undefined
  /** The payload of `value` when it is a well-formed value of `expectedBytes` bytes for `fingerprint` (and, authenticated, `l2Key`). */
  readonly decode: (l2Key: string, value: Uint8Array, fingerprint: string, expectedBytes: number) => Decoded
}

const formatOf = (
  headerBytes: number,
  authenticated: boolean,
  writeHeader: (header: Buffer, l2Key: string, fingerprint: string, payload: Uint8Array) => void,
  decode: ValueFormat["decode"]
): ValueFormat => ({
  headerBytes,
  authenticated,
  encode: (l2Key, fingerprint, payload) => {
    const out = Buffer.allocUnsafe(headerBytes + payload.length)
    out.set(payload, headerBytes)
    writeHeader(out.subarray(0, headerBytes), l2Key, fingerprint, out.subarray(headerBytes))
    return out
  },
  frame: (l2Key, fingerprint, extent, payloadBytes) => {
    const start = extent.length - payloadBytes - headerBytes
    if (start < 0) return undefined
    const value = extent.subarray(start)
    writeHeader(value.subarray(0, headerBytes), l2Key, fingerprint, value.subarray(headerBytes))
    return value
  },
  decode
})

/** Bytes 0–23 of either header: magic, version, reserved, fingerprint, payload length. */
const writeCommon = (header: Buffer, version: number, fingerprint: string, payloadBytes: number): void => {
  header.writeUInt32LE(MAGIC, 0)
  header.writeUInt16LE(version, 4)
  header.writeUInt16LE(0, 6)
  header.write(fingerprint, 8, 8, "hex")
  header.writeBigUInt64LE(BigInt(payloadBytes), 16)
}

/** The checks both formats make before their checksum or MAC, once magic and version matched. */
const checkCommon = (b: Buffer, headerBytes: number, fingerprint: string, expectedBytes: number): CorruptReason | undefined => {
  if (b.toString("hex", 8, 16) !== fingerprint) return "fingerprint"
  if (b.readBigUInt64LE(16) !== BigInt(expectedBytes) || b.length !== headerBytes + expectedBytes) return "length"
  return undefined
}

const bufferOf = (value: Uint8Array) => Buffer.from(value.buffer, value.byteOffset, value.byteLength)

/** Version 1: the header and an xxHash3-64 of the payload; no key, no MAC (issue 15 item 3). */
export const checksummed: ValueFormat = formatOf(
  HEADER_BYTES,
  false,
  (header, _key, fingerprint, payload) => {
    writeCommon(header, CHECKSUMMED, fingerprint, payload.length)
    xxh3(payload).copy(header, 24)
  },
  (_key, value, fingerprint, expectedBytes) => {
    if (value.length < HEADER_BYTES) return { refused: "short" }
    const b = bufferOf(value)
    if (b.readUInt32LE(0) !== MAGIC) return { refused: "magic" }
    if (b.readUInt16LE(4) === AUTHENTICATED) return { refused: "keyed" }
    if (b.readUInt16LE(4) !== CHECKSUMMED) return { refused: "version" }
    const bad = checkCommon(b, HEADER_BYTES, fingerprint, expectedBytes)
    if (bad !== undefined) return { refused: bad }
    const payload = b.subarray(HEADER_BYTES)
    if (!xxh3(payload).equals(b.subarray(24, 32))) return { refused: "checksum" }
    return { payload }
  }
)

const MAC_AT = MAC_HEADER_BYTES - MAC_BYTES

/**
 * Version 2: the header, then HMAC-SHA256 under `mac` of the key, header bytes 0–31 and the payload
 * (issue 24 item 14). A value of any other kind is refused: version 1 as `no_mac`, a MAC that does
 * not verify (compared in constant time) as `bad_mac`. The cheap header checks run first, so a
 * value that fails them is not hashed.
 */
export const authenticated = (mac: L2MacKey): ValueFormat =>
  formatOf(
    MAC_HEADER_BYTES,
    true,
    (header, l2Key, fingerprint, payload) => {
      writeCommon(header, AUTHENTICATED, fingerprint, payload.length)
      header.fill(0, 24, MAC_AT)
      macOf(mac, l2Key, header.subarray(0, MAC_AT), payload).copy(header, MAC_AT)
    },
    (l2Key, value, fingerprint, expectedBytes) => {
      if (value.length < HEADER_BYTES) return { refused: "short" }
      const b = bufferOf(value)
      if (b.readUInt32LE(0) !== MAGIC) return { refused: "magic" }
      if (b.readUInt16LE(4) === CHECKSUMMED) return { refused: "no_mac" }
      if (b.readUInt16LE(4) !== AUTHENTICATED) return { refused: "version" }
      if (b.length < MAC_HEADER_BYTES) return { refused: "short" }
      const bad = checkCommon(b, MAC_HEADER_BYTES, fingerprint, expectedBytes)
      if (bad !== undefined) return { refused: bad }
      const payload = b.subarray(MAC_HEADER_BYTES)
      const expected = macOf(mac, l2Key, b.subarray(0, MAC_AT), payload)
      if (!timingSafeEqual(expected, b.subarray(MAC_AT, MAC_HEADER_BYTES))) return { refused: "bad_mac" }
      return { payload }
    }
  )
