/**
 * vLLM's KVEventBatch as the publisher writes it (src/schema/VllmKvEvents.ts): the hand-written msgpack decodes,
 * with a generic msgpack decoder, to exactly the array-like layout vLLM's msgspec structs read — every int width
 * of a token id, bytes and int hashes, nil parents, all three event kinds — and back through our decoder.
 */
import { assert, describe, it } from "@effect/vitest"
import { unpack } from "msgpackr"
import { decodeKvEventBatch, encodeKvEventBatch, type VllmKvEvent } from "../../src/schema/VllmKvEvents.ts"

const h1 = new Uint8Array(32).map((_, i) => i)
const h2 = new Uint8Array(32).fill(0xee)
const tokens = [0, 1, 127, 128, 255, 256, 65535, 65536, 2 ** 32 - 1]
const events: Array<VllmKvEvent> = [
  { _tag: "AllBlocksCleared" },
  { _tag: "BlockStored", blockHashes: [h1], parentBlockHash: null, tokenIds: Uint32Array.from(tokens), blockSize: 256, loraId: null, medium: "CPU" },
  { _tag: "BlockStored", blockHashes: [h2, 42, -7], parentBlockHash: h1, tokenIds: Array.from({ length: 20 }, (_, i) => i * 5000), blockSize: 16, loraId: 3, medium: null },
  { _tag: "BlockRemoved", blockHashes: [h1, h2], medium: "CPU" }
]

describe("vLLM KVEventBatch encoding", () => {
  it("decodes with a generic msgpack decoder to vLLM's array-like layout, exactly", () => {
    const payload = encodeKvEventBatch(1733200000.25, events)
    assert.deepStrictEqual(unpack(payload), [
      1733200000.25,
      [
        ["AllBlocksCleared"],
        ["BlockStored", [Buffer.from(h1)], null, tokens, 256, null, "CPU"],
        ["BlockStored", [Buffer.from(h2), 42, -7], Buffer.from(h1), Array.from({ length: 20 }, (_, i) => i * 5000), 16, 3, null],
        ["BlockRemoved", [Buffer.from(h1), Buffer.from(h2)], "CPU"]
      ]
    ])
  })

  it("an integral ts is still a float64 (msgspec's float), and our decoder reads back what was written", () => {
    const payload = encodeKvEventBatch(5, [events[3]!])
    assert.strictEqual(payload[1], 0xcb)
    const back = decodeKvEventBatch(payload)
    assert.deepStrictEqual(back, { ts: 5, events: [{ _tag: "BlockRemoved", blockHashes: [Buffer.from(h1), Buffer.from(h2)], medium: "CPU" }], dataParallelRank: null })
  })

  it("a batch of 70,000 events has an array32 header and every one decodes", () => {
    const many: Array<VllmKvEvent> = Array.from({ length: 70_000 }, () => events[0]!)
    const decoded = unpack(encodeKvEventBatch(1.5, many)) as [number, Array<unknown>]
    assert.strictEqual(decoded[1].length, 70_000)
  })
})
