/**
 * Chunk hashes (DESIGN §3.2; upstream `token_hasher.py`, blake3 mode): a
 * rolling prefix hash over complete chunks only,
 *
 *   h_0     = BLAKE3(NONE_HASH ‖ tokens[0 : c] as big-endian uint32)
 *   h_i     = BLAKE3(h_{i-1} ‖ tokens[i·c : (i+1)·c] as big-endian uint32)
 *
 * where c is the chunk size in tokens and NONE_HASH is upstream's fallback
 * seed H((0, (0,), None)): BLAKE3 of the prefix int 0 as 8 bytes big-endian
 * signed followed by the single token 0 as big-endian uint32 (12 zero bytes).
 * A trailing partial chunk has no hash and is never stored. Each hash is
 * 32 bytes and stands for the whole prefix up to the end of its chunk.
 */
import { createBLAKE3 } from "hash-wasm"

/** Bytes per chunk hash. */
export const HASH_BYTES = 32

// One BLAKE3 state (hash-wasm, WebAssembly), reused synchronously by every call: every STORE, RETRIEVE and
// LOOKUP hashes its chunks, and the pure-JS BLAKE3 measured ~10× slower here and allocated ~1 MB per request
// (boxed 32-bit words), which fed the GC pauses that delayed PING under transfers (docs/benchmarks.md).
const hasher = await createBLAKE3()

/** BLAKE3-256 of `bytes`. */
const blake3 = (bytes: Uint8Array): Uint8Array => {
  hasher.init()
  hasher.update(bytes)
  return hasher.digest("binary")
}

/** The seed of every chain: BLAKE3 of 12 zero bytes. */
export const NONE_HASH: Uint8Array = blake3(new Uint8Array(12))

/**
 * Hashes of the first `count` complete chunks of `tokenIds` (fewer when the
 * tokens run out): `result[i]` covers tokens `[0, (i + 1) · chunkSizeTokens)`.
 * `tokenIds` are uint32 (the CacheKey Schema enforces it).
 */
export const chunkHashes = (
  tokenIds: ReadonlyArray<number>,
  chunkSizeTokens: number,
  count: number = Math.floor(tokenIds.length / chunkSizeTokens)
): Array<Uint8Array> => {
  const n = Math.min(count, Math.floor(tokenIds.length / chunkSizeTokens))
  const out: Array<Uint8Array> = new Array(n)
  const input = new Uint8Array(HASH_BYTES + 4 * chunkSizeTokens)
  const view = new DataView(input.buffer)
  let previous = NONE_HASH
  for (let i = 0; i < n; i++) {
    input.set(previous, 0)
    const base = i * chunkSizeTokens
    for (let t = 0; t < chunkSizeTokens; t++) view.setUint32(HASH_BYTES + 4 * t, tokenIds[base + t]!, false)
    previous = blake3(input)
    out[i] = previous
  }
  return out
}

/** Lower-case hex of a hash, for keys and logs. */
export const hashHex = (hash: Uint8Array): string => Buffer.from(hash.buffer, hash.byteOffset, hash.byteLength).toString("hex")
