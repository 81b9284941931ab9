/**
 * Authentication of L2 values (issue 24 item 14, DESIGN §9): the fleet's
 * secret (`--l2-secret-file`) and the HMAC-SHA256 every value carries when
 * it is set.
 *
 * Threat: anyone who can write to the shared Redis — any process holding its
 * url or password, another service on the same instance, a tenant's process
 * on a node of the fleet — planting a value with a valid header and checksum
 * for a chunk key (keys derive from tokens and the salt: anyone can compute
 * them), which every server sharing that L2 would then serve to its engines
 * as KV: poisoned attention state, wrong model output, silently. With a
 * secret a server serves a value only when its MAC verifies under the
 * fleet's key; without one, L2 must be as trusted as the servers themselves.
 *
 * The MAC is HMAC-SHA256 (RFC 2104) from OpenSSL, keyed with
 * HKDF-SHA256 (RFC 5869) of the secret, over a label, the full Redis key
 * (prefix included, length-prefixed), the value's header fields and the
 * payload (L2Value.ts gives the layout). Why not keyed BLAKE3: measured on
 * this 2-core VM, 32 MiB takes ~35 ms with OpenSSL's HMAC-SHA256 (it uses
 * the CPU's SHA extensions), ~75 ms with hash-wasm's keyed BLAKE3 and ~1.2 s
 * with @noble/hashes' (pure JavaScript); and OpenSSL ships with Node, so it
 * adds no dependency. The server computes it off the JS thread, with the OpenSSL of the Node binary on
 * the libuv pool (src/native/Hmac.ts, {@link macEffect}); {@link macOf} is the same MAC on the calling
 * thread (tests, tools).
 */
import { closeSync, constants, fstatSync, openSync, readFileSync } from "node:fs"
import { createHmac, createSecretKey, hkdfSync, type KeyObject } from "node:crypto"
import { Effect, Schema } from "effect"
import type { HmacSha256 } from "../../../native/Hmac.ts"

/** The `--l2-secret-file` cannot be used: `reason` says what is wrong and what is expected. */
export class L2SecretInvalid extends Schema.TaggedError<L2SecretInvalid>()("L2SecretInvalid", {
  path: Schema.String,
  reason: Schema.String
}) {
  override get message(): string {
    return `--l2-secret-file ${this.path}: ${this.reason}`
  }
}

/** Fewest bytes of secret accepted: 32 (256 bits when they are random; `openssl rand -hex 32` writes 64). */
export const MIN_SECRET_BYTES = 32
/** Most bytes a secret file may hold: 4096 (a larger file is not a secret someone wrote for this, e.g. a wrong path). */
export const MAX_SECRET_FILE_BYTES = 4096

/** The MAC key of one fleet, derived from its secret. Opaque: it never prints (a KeyObject logs as `{}`). */
export interface L2MacKey {
  readonly key: KeyObject
}

const HKDF_INFO = "mpcache l2 value mac v2"
const LABEL = Buffer.from("mpcache l2 v2\0", "latin1")

/** The MAC key of `secret` (HKDF-SHA256, no salt, info "mpcache l2 value mac v2", 32 bytes). */
export const macKeyOf = (secret: Uint8Array): L2MacKey => ({
  key: createSecretKey(Buffer.from(hkdfSync("sha256", secret, Buffer.alloc(0), HKDF_INFO, 32)))
})

/** Bytes of a MAC (HMAC-SHA256). */
export const MAC_BYTES = 32

/**
 * HMAC-SHA256 under `mac` of `"mpcache l2 v2\0" ‖ u32be(byte length of l2Key) ‖ l2Key (UTF-8) ‖
 * header ‖ payload`, 32 bytes. `header` is what precedes the MAC in the value (L2Value.ts), so the
 * MAC covers every header field; `payload` is read in place (no copy).
 */
export const macOf = (mac: L2MacKey, l2Key: string, header: Uint8Array, payload: Uint8Array): Buffer => {
  const h = createHmac("sha256", mac.key)
  for (const part of macInput(l2Key, header, payload)) h.update(part)
  return h.digest()
}

/**
 * {@link macOf} computed by `hmac` (src/native/Hmac.ts: on the libuv pool when the addon's OpenSSL HMAC is
 * available, else node:crypto on the JS thread): the same bytes hashed, the same 32 bytes. `header` and
 * `payload` are read in place while it runs: the caller keeps them unchanged and mapped until it ends (an
 * L1 object's read lock, or the GET reply it holds); it is uninterruptible while the hash runs.
 */
export const macEffect = (
  hmac: HmacSha256,
  mac: L2MacKey,
  l2Key: string,
  header: Uint8Array,
  payload: Uint8Array
): Effect.Effect<Buffer> => hmac.digest(mac.key, macInput(l2Key, header, payload))

/** The parts of the MAC's input, in order: label, u32be(key length), key (UTF-8), header, payload (views, no copy). */
const macInput = (l2Key: string, header: Uint8Array, payload: Uint8Array): ReadonlyArray<Uint8Array> => {
  const key = Buffer.from(l2Key, "utf8")
  const keyLength = Buffer.allocUnsafe(4)
  keyLength.writeUInt32BE(key.length)
  return [LABEL, keyLength, key, header, payload]
}

const isSpace = (b: number) => b === 0x20 || (b >= 0x09 && b <= 0x0d)

/** `bytes` without leading and trailing ASCII whitespace (space, tab, CR, LF, VT, FF). */
const trimmed = (bytes: Buffer): Buffer => {
  let start = 0
  let end = bytes.length
  while (start < end && isSpace(bytes[start]!)) start++
  while (end > start && isSpace(bytes[end - 1]!)) end--
  return bytes.subarray(start, end)
}

/**
 * The secret in `path`, or why it cannot be used. The rule: a regular file (symlinks followed), that
 * neither group nor others may read or write (mode `0600` or `0400`: the secret is the fleet's
 * authority over what engines are fed), of at most MAX_SECRET_FILE_BYTES bytes, whose contents
 * without surrounding whitespace are at least MIN_SECRET_BYTES bytes (any bytes; used as they are).
 * Opened non-blocking, so a FIFO at `path` cannot hold the start.
 */
const loadSecret = (path: string): Buffer | string => {
  let fd: number
  try {
    fd = openSync(path, constants.O_RDONLY | constants.O_NONBLOCK)
  } catch (e) {
    return `cannot read: ${e instanceof Error ? e.message : String(e)}`
  }
  try {
    const st = fstatSync(fd)
    if (!st.isFile()) return "must be a regular file holding the secret"
    const mode = st.mode & 0o777
    if ((mode & 0o077) !== 0) {
      return `group or others may read or write it (mode ${mode.toString(8).padStart(4, "0")}); the secret must be readable by the server's user only: chmod 600 it`
    }
    if (st.size > MAX_SECRET_FILE_BYTES) return `holds ${st.size} bytes; a secret file holds at most ${MAX_SECRET_FILE_BYTES}`
    const secret = trimmed(readFileSync(fd))
    if (secret.length < MIN_SECRET_BYTES) {
      return `the secret must be at least ${MIN_SECRET_BYTES} bytes without surrounding whitespace (got ${secret.length}); e.g. openssl rand -hex 32 > FILE`
    }
    return secret
  } catch (e) {
    return `cannot read: ${e instanceof Error ? e.message : String(e)}`
  } finally {
    closeSync(fd)
  }
}

/**
 * The MAC key of the secret in `path` (`--l2-secret-file`; the rule is loadSecret's). Fails with
 * L2SecretInvalid naming the path and what is wrong; `mpcache serve` then exits 2.
 */
export const readL2Secret = (path: string): Effect.Effect<L2MacKey, L2SecretInvalid> =>
  Effect.suspend(() => {
    const secret = loadSecret(path)
    if (typeof secret === "string") return Effect.fail(new L2SecretInvalid({ path, reason: secret }))
    const key = macKeyOf(secret)
    secret.fill(0)
    return Effect.succeed(key)
  })
