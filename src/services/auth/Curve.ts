/**
 * CURVE key material shared by the server and its clients (docs/security.md):
 * Z85 (ZeroMQ RFC 32) text of 32-byte Curve25519 keys, the public key of a
 * secret key, key files, and the HELLO proof that binds a connection to a
 * tenant (a client proves it holds the secret key of a listed public key
 * over a nonce the server chose for that connection).
 *
 * Pure: Node's `crypto` and `fs`, no sockets; imported by client programs.
 */
import { createHmac, createPrivateKey, createPublicKey, diffieHellman, type KeyObject, randomBytes, timingSafeEqual } from "node:crypto"
import { readFileSync } from "node:fs"
import { Schema } from "effect"

const ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
const DECODE = new Map([...ALPHABET].map((c, i) => [c, i] as const))

/** A Z85 key: 40 characters of the Z85 alphabet (32 bytes). */
export const isZ85Key = (s: string): boolean => s.length === 40 && [...s].every((c) => DECODE.has(c))

/** Z85 text of `bytes` (a multiple of 4 bytes). */
export const z85Encode = (bytes: Uint8Array): string => {
  let out = ""
  for (let i = 0; i < bytes.length; i += 4) {
    let v = ((bytes[i]! << 24) >>> 0) + (bytes[i + 1]! << 16) + (bytes[i + 2]! << 8) + bytes[i + 3]!
    const chunk: Array<string> = []
    for (let j = 0; j < 5; j++) {
      chunk.unshift(ALPHABET[v % 85]!)
      v = Math.floor(v / 85)
    }
    out += chunk.join("")
  }
  return out
}

/** The bytes of Z85 text (a multiple of 5 characters); undefined when it is not Z85. */
export const z85Decode = (text: string): Buffer | undefined => {
  if (text.length % 5 !== 0) return undefined
  const out = Buffer.alloc((text.length / 5) * 4)
  for (let i = 0; i < text.length; i += 5) {
    let v = 0
    for (let j = 0; j < 5; j++) {
      const d = DECODE.get(text[i + j]!)
      if (d === undefined) return undefined
      v = v * 85 + d
    }
    if (v > 0xffffffff) return undefined
    out.writeUInt32BE(v, (i / 5) * 4)
  }
  return out
}

// DER wrappers of raw X25519 keys (RFC 8410): PKCS#8 for a secret key, SPKI for a public one.
const PKCS8_X25519 = Buffer.from("302e020100300506032b656e04220420", "hex")
const SPKI_X25519 = Buffer.from("302a300506032b656e032100", "hex")

const secretKeyObject = (secretZ85: string): KeyObject =>
  createPrivateKey({ key: Buffer.concat([PKCS8_X25519, z85Decode(secretZ85)!]), format: "der", type: "pkcs8" })
const publicKeyObject = (publicZ85: string): KeyObject =>
  createPublicKey({ key: Buffer.concat([SPKI_X25519, z85Decode(publicZ85)!]), format: "der", type: "spki" })

/**
 * The Z85 public key of a Z85 CURVE secret key (Curve25519 scalar
 * multiplication of the base point, as libzmq's `zmq_curve_public`).
 */
export const publicKeyOf = (secretZ85: string): string => {
  const spki = createPublicKey(secretKeyObject(secretZ85)).export({ format: "der", type: "spki" })
  return z85Encode(spki.subarray(spki.length - 32))
}

/**
 * A fresh CURVE key pair, Z85: 32 random bytes as the secret key (any 32
 * bytes are a Curve25519 secret, as libzmq's `zmq_curve_keypair` draws
 * them) and its public key.
 */
export const newKeyPair = (): { readonly secretKey: string; readonly publicKey: string } => {
  const secretKey = z85Encode(randomBytes(32))
  return { secretKey, publicKey: publicKeyOf(secretKey) }
}

/** A key file could not be read or does not hold one Z85 key. */
export class KeyFileInvalid extends Schema.TaggedError<KeyFileInvalid>()("KeyFileInvalid", {
  path: Schema.String,
  reason: Schema.String
}) {
  override get message(): string {
    return `${this.path}: ${this.reason}`
  }
}

/**
 * Reads a key file written by `mpcache keygen`: one line, a 40-character Z85
 * key (surrounding whitespace ignored). Throws `KeyFileInvalid`.
 */
export const readKeyFile = (path: string): string => {
  let text: string
  try {
    text = readFileSync(path, "utf8")
  } catch (e) {
    throw new KeyFileInvalid({ path, reason: `cannot read: ${e instanceof Error ? e.message : String(e)}` })
  }
  const key = text.trim()
  if (!isZ85Key(key)) throw new KeyFileInvalid({ path, reason: "must hold one 40-character Z85 CURVE key (mpcache keygen writes one)" })
  return key
}

/** A client's CURVE keys: the server's public key and its own pair, Z85. */
export interface ClientCurveKeys {
  readonly serverPublicKey: string
  readonly secretKey: string
  readonly publicKey: string
}

/**
 * The client keys from the two files of `--curve-server-public-key-file` and
 * `--curve-secret-key-file`; the client's public key derives from its
 * secret key. Throws `KeyFileInvalid`.
 */
export const readClientKeys = (serverPublicKeyFile: string, secretKeyFile: string): ClientCurveKeys => {
  const secretKey = readKeyFile(secretKeyFile)
  return { serverPublicKey: readKeyFile(serverPublicKeyFile), secretKey, publicKey: publicKeyOf(secretKey) }
}

/** Bytes of a HELLO nonce. */
export const NONCE_BYTES = 32
const PROOF_LABEL = Buffer.from("mpcache hello v1\0", "latin1")

/**
 * The HELLO proof: HMAC-SHA256 keyed with the X25519 shared secret of one
 * side's secret key and the other side's public key, over a fixed label and
 * the server's nonce. The client computes it with (its secret, the server's
 * public key); the server with (its secret, the client's public key): equal
 * only when the client holds the secret key of the public key it names.
 */
export const helloProof = (ownSecretZ85: string, peerPublicZ85: string, nonce: Uint8Array): Buffer => {
  const shared = diffieHellman({ privateKey: secretKeyObject(ownSecretZ85), publicKey: publicKeyObject(peerPublicZ85) })
  return createHmac("sha256", shared).update(PROOF_LABEL).update(nonce).digest()
}

/** Constant-time equality of two byte strings (false when the lengths differ). */
export const sameBytes = (a: Uint8Array, b: Uint8Array): boolean => a.length === b.length && timingSafeEqual(a, b)
