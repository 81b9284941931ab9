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
import { Effect } from "effect"
import { defaultHmacSha256, type HmacSha256 } from "../../../native/Hmac.ts"
import { hashHex } from "../../kv/TokenHasher.ts"
import type { KvLayout } from "../LayoutRegistry.ts"
import type { ObjectKey } from "../ObjectKey.ts"
import { type L2MacKey, MAC_BYTES, macEffect, macOf } from "./L2Mac.ts"

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
 * authenticated value's MAC covers. `encode`, `frame` and `decode` hash on the calling thread (tests,
 * tools); `seal` and `check` are what the server uses: the same bytes, with an authenticated value's MAC
 * computed off the JS thread (src/native/Hmac.ts) while they wait.
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
  /**
   * The value of `payload`, the last bytes of `extent`: `frame` when `extent` has the room in front of
   * it, else `encode`. `extent` (its headroom is written, its payload read) must stay unchanged and
   * mapped until the effect ends: an L1 object's read lock (L2Tier's write-through).
   */
  readonly seal: (l2Key: string, fingerprint: string, extent: Buffer, payload: Uint8Array) => Effect.Effect<Buffer>
  /** `decode`, with the MAC off the JS thread; `value` must stay unchanged until the effect ends. */
  readonly check: (l2Key: string, value: Uint8Array, fingerprint: string, expectedBytes: number) => Effect.Effect<Decoded>
}

/** What a format hashes and checks, once on the calling thread and once as an Effect (see ValueFormat). */
interface FormatParts {
  readonly headerBytes: number
  readonly authenticated: boolean
  /** Writes the header of `payload` into `header` (its `headerBytes` bytes). */
  readonly writeHeader: (header: Buffer, l2Key: string, fingerprint: string, payload: Uint8Array) => void
  /** `writeHeader`, hashing off the JS thread where the format can. */
  readonly sealHeader: (header: Buffer, l2Key: string, fingerprint: string, payload: Uint8Array) => Effect.Effect<void>
  readonly decode: ValueFormat["decode"]
  readonly check: ValueFormat["check"]
}

const formatOf = ({ authenticated, check, decode, headerBytes, sealHeader, writeHeader }: FormatParts): ValueFormat => {
  /** A fresh buffer holding a copy of `payload` after `headerBytes` bytes for the header. */
  const copied = (payload: Uint8Array) => {
    const out = Buffer.allocUnsafe(headerBytes + payload.length)
    out.set(payload, headerBytes)
    return out
  }
  /** The view of `extent` from `headerBytes` before its last `payloadBytes` bytes; undefined without that room. */
  const inPlace = (extent: Buffer, payloadBytes: number) => {
    const start = extent.length - payloadBytes - headerBytes
    return start < 0 ? undefined : extent.subarray(start)
  }
  return {
    headerBytes,
    authenticated,
    encode: (l2Key, fingerprint, payload) => {
      const out = copied(payload)
      writeHeader(out.subarray(0, headerBytes), l2Key, fingerprint, out.subarray(headerBytes))
      return out
    },
    frame: (l2Key, fingerprint, extent, payloadBytes) => {
      const value = inPlace(extent, payloadBytes)
      if (value !== undefined) writeHeader(value.subarray(0, headerBytes), l2Key, fingerprint, value.subarray(headerBytes))
      return value
    },
    decode,
    seal: (l2Key, fingerprint, extent, payload) =>
      Effect.suspend(() => {
        const value = inPlace(extent, payload.length) ?? copied(payload)
        return sealHeader(value.subarray(0, headerBytes), l2Key, fingerprint, value.subarray(headerBytes)).pipe(Effect.as(value))
      }),
    check
  }
}

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

const writeChecksummed = (header: Buffer, _key: string, fingerprint: string, payload: Uint8Array): void => {
  writeCommon(header, CHECKSUMMED, fingerprint, payload.length)
  xxh3(payload).copy(header, 24)
}

const decodeChecksummed: ValueFormat["decode"] = (_key, value, fingerprint, expectedBytes) => {
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

/**
 * Version 1: the header and an xxHash3-64 of the payload; no key, no MAC (issue 15 item 3). The
 * checksum (~3 ms per 32 MiB) runs on the calling thread in `seal` and `check` too.
 */
export const checksummed: ValueFormat = formatOf({
  headerBytes: HEADER_BYTES,
  authenticated: false,
  writeHeader: writeChecksummed,
  sealHeader: (header, key, fingerprint, payload) => Effect.sync(() => writeChecksummed(header, key, fingerprint, payload)),
  decode: decodeChecksummed,
  check: (key, value, fingerprint, expectedBytes) => Effect.sync(() => decodeChecksummed(key, value, fingerprint, expectedBytes))
})

const MAC_AT = MAC_HEADER_BYTES - MAC_BYTES

/** Bytes 0–31 of an authenticated header: the common fields, the checksum slot reserved (0). */
const writeAuthenticatedFields = (header: Buffer, fingerprint: string, payloadBytes: number): void => {
  writeCommon(header, AUTHENTICATED, fingerprint, payloadBytes)
  header.fill(0, 24, MAC_AT)
}

/** An authenticated value that passed the header checks: what its MAC covers and the MAC it carries. */
interface Opened {
  readonly fields: Buffer
  readonly payload: Buffer
  readonly tag: Buffer
}

/** The header checks of an authenticated read, cheapest first (a value that fails them is not hashed). */
const openAuthenticated = (value: Uint8Array, fingerprint: string, expectedBytes: number): Opened | { readonly refused: RefusedReason } => {
  if (value.length < HEADER_BYTES) return { refused: "short" }
  const b = bufferOf(value)
  if (b.readUInt32LE(0) !== MAGIC) return { refused: "magic" }
  if (b.readUInt16LE(4) === CHECKSUMMED) return { refused: "no_mac" }
  if (b.readUInt16LE(4) !== AUTHENTICATED) return { refused: "version" }
  if (b.length < MAC_HEADER_BYTES) return { refused: "short" }
  const bad = checkCommon(b, MAC_HEADER_BYTES, fingerprint, expectedBytes)
  if (bad !== undefined) return { refused: bad }
  return { fields: b.subarray(0, MAC_AT), payload: b.subarray(MAC_HEADER_BYTES), tag: b.subarray(MAC_AT, MAC_HEADER_BYTES) }
}

/** The payload when `expected` equals the value's MAC (compared in constant time), else `bad_mac`. */
const verdict = (opened: Opened, expected: Buffer): Decoded =>
  timingSafeEqual(expected, opened.tag) ? { payload: opened.payload } : { refused: "bad_mac" }

/**
 * Version 2: the header, then HMAC-SHA256 under `mac` of the key, header bytes 0–31 and the payload
 * (issue 24 item 14). A value of any other kind is refused: version 1 as `no_mac`, a MAC that does
 * not verify (compared in constant time) as `bad_mac`. The cheap header checks run first, so a
 * value that fails them is not hashed. `seal` and `check` compute the MAC with `hmac` (default: the
 * process's, src/native/Hmac.ts: on the libuv pool when available); `encode`, `frame` and `decode` with
 * node:crypto on the calling thread. Both hash the same bytes.
 */
export const authenticated = (mac: L2MacKey, hmac: HmacSha256 = defaultHmacSha256()): ValueFormat =>
  formatOf({
    headerBytes: MAC_HEADER_BYTES,
    authenticated: true,
    writeHeader: (header, l2Key, fingerprint, payload) => {
      writeAuthenticatedFields(header, fingerprint, payload.length)
      macOf(mac, l2Key, header.subarray(0, MAC_AT), payload).copy(header, MAC_AT)
    },
    sealHeader: (header, l2Key, fingerprint, payload) =>
      Effect.suspend(() => {
        writeAuthenticatedFields(header, fingerprint, payload.length)
        return macEffect(hmac, mac, l2Key, header.subarray(0, MAC_AT), payload).pipe(
          Effect.map((tag) => void tag.copy(header, MAC_AT))
        )
      }),
    decode: (l2Key, value, fingerprint, expectedBytes) => {
      const opened = openAuthenticated(value, fingerprint, expectedBytes)
      return "refused" in opened ? opened : verdict(opened, macOf(mac, l2Key, opened.fields, opened.payload))
    },
    check: (l2Key, value, fingerprint, expectedBytes) =>
      Effect.suspend(() => {
        const opened = openAuthenticated(value, fingerprint, expectedBytes)
        if ("refused" in opened) return Effect.succeed<Decoded>(opened)
        return macEffect(hmac, mac, l2Key, opened.fields, opened.payload).pipe(Effect.map((tag) => verdict(opened, tag)))
      })
  })
