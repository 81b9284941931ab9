/**
 * L2 keys and values (issue 15 item 3, issue 24 item 14): the key form, both
 * headers (checksummed, authenticated), and every corruption or missing
 * authentication a read must refuse; the server's `seal` and `check`, with
 * the MAC on the libuv pool or its node:crypto fallback, give the same.
 */
import { assert, describe, it } from "@effect/vitest"
import { createHmac, hkdfSync, randomBytes } from "node:crypto"
import { Effect } from "effect"
import { createXXHash3 } from "hash-wasm"
import { makeHmacSha256Unsafe } from "../../../../src/native/Hmac.ts"
import { L2_HEADROOM_BYTES } from "../../../../src/services/server/L1Store.ts"
import { macKeyOf } from "../../../../src/services/server/l2/L2Mac.ts"
import {
  authenticated,
  checksummed,
  HEADER_BYTES,
  l2KeyOf,
  layoutFingerprint,
  MAC_HEADER_BYTES
} from "../../../../src/services/server/l2/L2Value.ts"

const layout = { numLayers: 2, hiddenDim: 8, elementBytes: 2, dtype: "float16", chunkBytes: 2 * 2 * 256 * 8 * 2 }
const hash = Uint8Array.from({ length: 32 }, (_, i) => i)

describe("L2 keys", () => {
  it("prefix:v1:model~fingerprint@rank@hash[@salt]", () => {
    const fp = layoutFingerprint(layout, 256)
    assert.match(fp, /^[0-9a-f]{16}$/)
    const hex = Buffer.from(hash).toString("hex")
    assert.strictEqual(l2KeyOf("mpc", fp, { hash, modelName: "m", kvRank: 3, cacheSalt: "" }), `mpc:v1:m~${fp}@3@${hex}`)
    assert.strictEqual(l2KeyOf("mpc", fp, { hash, modelName: "m", kvRank: 0, cacheSalt: "t1" }), `mpc:v1:m~${fp}@0@${hex}@t1`)
  })
  it("another dtype, chunk size or shape is another fingerprint", () => {
    const fps = new Set([
      layoutFingerprint(layout, 256),
      layoutFingerprint({ ...layout, dtype: "bfloat16" }, 256),
      layoutFingerprint({ ...layout, chunkBytes: layout.chunkBytes / 2 }, 128),
      layoutFingerprint({ ...layout, numLayers: 4, chunkBytes: layout.chunkBytes * 2 }, 256),
      layoutFingerprint({ ...layout, hiddenDim: 16, chunkBytes: layout.chunkBytes * 2 }, 256)
    ])
    assert.strictEqual(fps.size, 5)
  })
})

const KEY = "mpc:v1:m~0011223344556677@0@aa"

describe("L2 values, checksummed (no --l2-secret-file)", () => {
  const fp = layoutFingerprint(layout, 256)
  const payload = Uint8Array.from({ length: 4096 }, (_, i) => (i * 7) & 255)
  const value = checksummed.encode(KEY, fp, payload)

  it("framed in an object's headroom: the same value as a view of the extent, the payload untouched", () => {
    const extent = Buffer.alloc(64 + 4096, 0xee)
    extent.set(payload, 64)
    const framed = checksummed.frame(KEY, fp, extent, 4096)!
    assert.isTrue(framed.equals(value))
    assert.strictEqual(framed.byteOffset, extent.byteOffset + 32)
    assert.strictEqual(framed.buffer, extent.buffer)
    assert.isTrue(extent.subarray(0, 32).equals(Buffer.alloc(32, 0xee)))
    assert.strictEqual(checksummed.frame(KEY, fp, extent.subarray(33), 4096), undefined)
    assert.strictEqual(checksummed.frame(KEY, fp, extent.subarray(32), 4096)!.length, HEADER_BYTES + 4096)
  })

  it("the checksum is xxHash3-64 (seed 0), the same from the native hasher as from hash-wasm's, its fallback", async () => {
    const wasm = await createXXHash3()
    for (const n of [0, 1, 16, 17, 128, 129, 240, 241, 4096, 100_003, 2 ** 20 + 7]) {
      const bytes = randomBytes(n)
      wasm.init()
      wasm.update(bytes)
      assert.strictEqual(checksummed.encode(KEY, fp, bytes).toString("hex", 24, 32), wasm.digest("hex"), `${n} bytes`)
    }
  })

  it("round-trips: header then the bytes", () => {
    assert.strictEqual(value.length, HEADER_BYTES + 4096)
    assert.strictEqual(value.toString("latin1", 0, 4), "MPL2")
    assert.strictEqual(value.readUInt16LE(4), 1)
    const r = checksummed.decode(KEY, value, fp, 4096)
    assert.isTrue("payload" in r && Buffer.from(r.payload).equals(Buffer.from(payload)))
  })
  it("each mismatch names its reason; an authenticated value, which it cannot check, is refused as keyed", () => {
    const flip = (at: number) => {
      const v = Buffer.from(value)
      v[at] = v[at]! ^ 1
      return v
    }
    const decode = (v: Uint8Array, f = fp, n = 4096) => checksummed.decode(KEY, v, f, n)
    assert.deepStrictEqual(decode(value.subarray(0, 31)), { refused: "short" })
    assert.deepStrictEqual(decode(flip(0)), { refused: "magic" })
    assert.deepStrictEqual(decode(flip(4)), { refused: "version" })
    assert.deepStrictEqual(decode(value, layoutFingerprint({ ...layout, dtype: "bfloat16" }, 256)), { refused: "fingerprint" })
    assert.deepStrictEqual(decode(value, fp, 4095), { refused: "length" })
    assert.deepStrictEqual(decode(value.subarray(0, value.length - 1)), { refused: "length" })
    assert.deepStrictEqual(decode(flip(HEADER_BYTES + 100)), { refused: "checksum" })
    assert.deepStrictEqual(decode(authenticated(macKeyOf(randomBytes(32))).encode(KEY, fp, payload)), { refused: "keyed" })
  })
})

describe("L2 values, authenticated (--l2-secret-file, issue 24 item 14)", () => {
  const fp = layoutFingerprint(layout, 256)
  const secret = Buffer.from("an-example-fleet-secret-of-more-than-32-bytes")
  const format = authenticated(macKeyOf(secret))
  const payload = Uint8Array.from({ length: 4096 }, (_, i) => (i * 13) & 255)
  const value = format.encode(KEY, fp, payload)

  it("the header: magic, version 2, fingerprint, length, 8 reserved bytes, then HMAC-SHA256 of label, key, header and payload", () => {
    assert.strictEqual(value.length, MAC_HEADER_BYTES + 4096)
    assert.strictEqual(value.toString("latin1", 0, 4), "MPL2")
    assert.strictEqual(value.readUInt16LE(4), 2)
    assert.strictEqual(value.readUInt16LE(6), 0)
    assert.strictEqual(value.toString("hex", 8, 16), fp)
    assert.strictEqual(value.readBigUInt64LE(16), 4096n)
    assert.isTrue(value.subarray(24, 32).equals(Buffer.alloc(8)))
    // The documented construction (docs/l2.md), computed here from its parts with node:crypto.
    const macKey = Buffer.from(hkdfSync("sha256", secret, Buffer.alloc(0), "mpcache l2 value mac v2", 32))
    const keyBytes = Buffer.from(KEY, "utf8")
    const keyLength = Buffer.alloc(4)
    keyLength.writeUInt32BE(keyBytes.length)
    const expected = createHmac("sha256", macKey)
      .update(Buffer.from("mpcache l2 v2\0", "latin1")).update(keyLength).update(keyBytes).update(value.subarray(0, 32)).update(payload)
      .digest()
    assert.isTrue(value.subarray(32, 64).equals(expected))
    assert.isTrue(Buffer.from(payload).equals(value.subarray(MAC_HEADER_BYTES)))
  })

  it("framed in an object's 64 bytes of L1 headroom without a copy; L1 keeps at least that much", () => {
    assert.isAtLeast(L2_HEADROOM_BYTES, MAC_HEADER_BYTES)
    const extent = Buffer.alloc(L2_HEADROOM_BYTES + 4096, 0xee)
    extent.set(payload, L2_HEADROOM_BYTES)
    const framed = format.frame(KEY, fp, extent, 4096)!
    assert.isTrue(framed.equals(value))
    assert.strictEqual(framed.buffer, extent.buffer)
    assert.strictEqual(framed.byteOffset, extent.byteOffset + L2_HEADROOM_BYTES - MAC_HEADER_BYTES)
    assert.strictEqual(format.frame(KEY, fp, extent.subarray(1), 4096), undefined)
  })

  it("round-trips under the same secret, read from another copy of it", () => {
    const r = authenticated(macKeyOf(Buffer.from(secret))).decode(KEY, value, fp, 4096)
    assert.isTrue("payload" in r && Buffer.from(r.payload).equals(Buffer.from(payload)))
  })

  it("never accepts a value without a valid MAC: checksummed (a correct checksum), forged, moved to another key, another secret, any byte changed", () => {
    const decode = (v: Uint8Array, key = KEY) => format.decode(key, v, fp, 4096)
    // What anyone who can write to Redis can build: a well-formed checksummed value.
    assert.deepStrictEqual(decode(checksummed.encode(KEY, fp, payload)), { refused: "no_mac" })
    // The right format with a MAC under a guessed key, or another fleet's.
    assert.deepStrictEqual(decode(authenticated(macKeyOf(randomBytes(32))).encode(KEY, fp, payload)), { refused: "bad_mac" })
    // A genuine value copied to another chunk's key.
    assert.deepStrictEqual(decode(value, "mpc:v1:m~0011223344556677@0@ab"), { refused: "bad_mac" })
    assert.deepStrictEqual(decode(value, "other:v1:m~0011223344556677@0@aa"), { refused: "bad_mac" })
    // One bit anywhere: the header checks name header bytes 0-23, the MAC everything else (reserved, MAC, payload).
    for (const at of [6, 24, 31, 32, 63, MAC_HEADER_BYTES, MAC_HEADER_BYTES + 2048, value.length - 1]) {
      const v = Buffer.from(value)
      v[at] = v[at]! ^ 1
      assert.deepStrictEqual(decode(v), { refused: "bad_mac" }, `bit 0 of byte ${at}`)
    }
    const v = Buffer.from(value)
    v[4] = 3
    assert.deepStrictEqual(decode(v), { refused: "version" })
    assert.deepStrictEqual(decode(value.subarray(0, 40)), { refused: "short" })
    assert.deepStrictEqual(decode(value.subarray(0, value.length - 1)), { refused: "length" })
    assert.deepStrictEqual(format.decode(KEY, value, layoutFingerprint({ ...layout, dtype: "bfloat16" }, 256), 4096), { refused: "fingerprint" })
  })
})

describe("seal and check, the server's path: the MAC off the JS thread (issue 24 item 14 follow-up)", () => {
  const fp = layoutFingerprint(layout, 256)
  const secret = Buffer.from("an-example-fleet-secret-of-more-than-32-bytes")
  const payload = Uint8Array.from({ length: 4096 }, (_, i) => (i * 29) & 255)
  const backends = [["on the libuv pool", makeHmacSha256Unsafe()], ["with node:crypto (fallback)", makeHmacSha256Unsafe({ native: false })]] as const

  for (const [where, hmac] of backends) {
    it.effect(`${where}: seal writes into L1's headroom the value encode gives (a copy without headroom); check gives decode's verdicts`, () =>
      Effect.gen(function*() {
        const format = authenticated(macKeyOf(secret), hmac)
        const value = format.encode(KEY, fp, payload)
        const extent = Buffer.alloc(L2_HEADROOM_BYTES + 4096, 0xee)
        extent.set(payload, L2_HEADROOM_BYTES)
        const sealed = yield* format.seal(KEY, fp, extent, extent.subarray(L2_HEADROOM_BYTES))
        assert.isTrue(sealed.equals(value))
        assert.strictEqual(sealed.buffer, extent.buffer)
        assert.strictEqual(sealed.byteOffset, extent.byteOffset + L2_HEADROOM_BYTES - MAC_HEADER_BYTES)
        const tight = Buffer.from(payload)
        const copied = yield* format.seal(KEY, fp, tight, tight)
        assert.isTrue(copied.equals(value))
        tight.fill(0) // a copy: the extent's bytes are not the value's
        assert.isTrue(copied.equals(value))

        const flipped = Buffer.from(value)
        flipped[MAC_HEADER_BYTES + 7] = flipped[MAC_HEADER_BYTES + 7]! ^ 1
        for (
          const [v, key] of [
            [value, KEY],
            [value, "mpc:v1:m~0011223344556677@0@ab"],
            [flipped, KEY],
            [checksummed.encode(KEY, fp, payload), KEY],
            [authenticated(macKeyOf(randomBytes(32))).encode(KEY, fp, payload), KEY],
            [value.subarray(0, 40), KEY]
          ] as const
        ) {
          assert.deepStrictEqual(yield* format.check(key, v, fp, 4096), format.decode(key, v, fp, 4096))
        }
        const ok = yield* format.check(KEY, value, fp, 4096)
        assert.isTrue("payload" in ok && Buffer.from(ok.payload).equals(Buffer.from(payload)))
        assert.deepStrictEqual(yield* format.check(KEY, flipped, fp, 4096), { refused: "bad_mac" })
      }))
  }

  it.effect("checksummed: seal and check give frame's value and decode's verdicts", () =>
    Effect.gen(function*() {
      const value = checksummed.encode(KEY, fp, payload)
      const extent = Buffer.alloc(64 + 4096, 0xee)
      extent.set(payload, 64)
      assert.isTrue((yield* checksummed.seal(KEY, fp, extent, extent.subarray(64))).equals(value))
      const flipped = Buffer.from(value)
      flipped[HEADER_BYTES + 1] = flipped[HEADER_BYTES + 1]! ^ 1
      assert.deepStrictEqual(yield* checksummed.check(KEY, flipped, fp, 4096), { refused: "checksum" })
      const ok = yield* checksummed.check(KEY, value, fp, 4096)
      assert.isTrue("payload" in ok && Buffer.from(ok.payload).equals(Buffer.from(payload)))
    }))
})
