import { blake3 } from "@noble/hashes/blake3.js"
import { assert, describe, it } from "@effect/vitest"
import { chunkHashes, hashHex, NONE_HASH } from "../../../src/services/kv/TokenHasher.ts"

// Fixed vectors, computed once with this implementation and checked in (DESIGN §3.2).
const TOKENS_20 = [0, 7919, 15838, 23757, 31676, 39595, 47514, 55433, 63352, 5735, 13654, 21573, 29492, 37411, 45330, 53249, 61168, 3551, 11470, 19389]
const VECTORS_20_BY_4 = [
  "37a0c5864f60a56e0a265cd7b54afe85d57dcf3a3211ba6521fc51ffa47880bd",
  "eca6916128f290e72a411c8999eb9da9bdbf69bebf65840816e3332996146f00",
  "bf9d526e5c072a4bd024db8403d28627485024779e6d37893064fc52da3aa4df",
  "a3899b5915566485e2239c32f456e6e950e5aa8aa2cabe7d46c57e5e290c750a",
  "340e62fd140b00a034e8f6f896f2b5434f48f6e8981f9da4953a04143ba7d3d4"
]
const TOKENS_512 = Array.from({ length: 512 }, (_, i) => (i * 2654435761) >>> 0)
const VECTORS_512_BY_256 = [
  "e77d0c7108c1b6c8b3921cbc67e935a8455303ab321a867a104e269d6d6566f7",
  "257cb07b72d7e5fdb961fb6cb205f355fc78a9cf2836f83a81348ac65464e580"
]

describe("TokenHasher", () => {
  it("the seed is BLAKE3 of the prefix int 0 (8 bytes) and the token 0 (4 bytes)", () => {
    assert.strictEqual(hashHex(NONE_HASH), "7e3eff9ef7613a50340eb12677ee03b83ac759fcba9bb32705f07248d56d473b")
  })

  it("matches the checked-in vectors", () => {
    assert.deepStrictEqual(chunkHashes(TOKENS_20, 4).map(hashHex), VECTORS_20_BY_4)
    assert.deepStrictEqual(chunkHashes(TOKENS_512, 256).map(hashHex), VECTORS_512_BY_256)
  })

  it("is the rolling chain BLAKE3(previous ‖ tokens as big-endian uint32)", () => {
    const chunk = (from: number) => {
      const b = Buffer.alloc(16)
      for (let t = 0; t < 4; t++) b.writeUInt32BE(TOKENS_20[from + t]!, 4 * t)
      return b
    }
    const h0 = blake3(Buffer.concat([NONE_HASH, chunk(0)]))
    const h1 = blake3(Buffer.concat([h0, chunk(4)]))
    assert.deepStrictEqual(chunkHashes(TOKENS_20, 4).slice(0, 2).map(hashHex), [hashHex(h0), hashHex(h1)])
  })

  it("a trailing partial chunk has no hash; count limits the chain", () => {
    assert.strictEqual(chunkHashes(TOKENS_20.slice(0, 19), 4).length, 4)
    assert.strictEqual(chunkHashes(TOKENS_20.slice(0, 3), 4).length, 0)
    assert.deepStrictEqual(chunkHashes(TOKENS_20, 4, 2).map(hashHex), VECTORS_20_BY_4.slice(0, 2))
  })

  it("a hash stands for its whole prefix: equal prefixes give equal hashes, a changed earlier token changes every later one", () => {
    const other = [...TOKENS_20]
    other[17] = 1
    assert.deepStrictEqual(chunkHashes(other, 4).slice(0, 4).map(hashHex), VECTORS_20_BY_4.slice(0, 4))
    const changed = [...TOKENS_20]
    changed[0] = 1
    const hashes = chunkHashes(changed, 4).map(hashHex)
    hashes.forEach((h, i) => assert.notStrictEqual(h, VECTORS_20_BY_4[i]))
  })
})
