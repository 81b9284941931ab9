/**
 * docs/kv-events.md's chunk-hash test vector (issue 28 item 2: a router computes a prompt's prefix hashes itself):
 * the server's hasher (hash-wasm's BLAKE3) and an independent BLAKE3 (@noble/hashes) both give the figures the doc
 * prints, read from the doc itself.
 */
import { readFileSync } from "node:fs"
import { assert, describe, it } from "@effect/vitest"
import { blake3 } from "@noble/hashes/blake3.js"
import { chunkHashes, hashHex, NONE_HASH } from "../../../src/services/kv/TokenHasher.ts"

const doc = readFileSync(new URL("../../../docs/kv-events.md", import.meta.url), "utf8")
const field = (name: string) => {
  const m = new RegExp("`" + name.replace(/[.*+?^${}()|[\]\\]/g, "\\$&") + "` = `([^`]+)`").exec(doc)
  assert.isNotNull(m, `docs/kv-events.md has no \`${name}\` = \`…\``)
  return m![1]!
}

/** The doc's algorithm, written again from its text with another BLAKE3. */
const independent = (tokens: ReadonlyArray<number>, c: number): Array<string> => {
  let previous = blake3(new Uint8Array(12))
  const out: Array<string> = []
  for (let i = 0; (i + 1) * c <= tokens.length; i++) {
    const input = new Uint8Array(32 + 4 * c)
    input.set(previous, 0)
    const view = new DataView(input.buffer)
    for (let k = 0; k < c; k++) view.setUint32(32 + 4 * k, tokens[i * c + k]!, false)
    previous = blake3(input)
    out.push(Buffer.from(previous).toString("hex"))
  }
  return out
}

describe("docs/kv-events.md test vector", () => {
  it("NONE_HASH, h_0 and h_1 as printed, from the server's hasher and from an independent BLAKE3", () => {
    const c = Number(field("c"))
    const tokens = JSON.parse(field("t")) as Array<number>
    assert.strictEqual(c, 8)
    assert.strictEqual(tokens.length, 16)
    assert.strictEqual(field("NONE_HASH"), hashHex(NONE_HASH))
    assert.strictEqual(field("NONE_HASH"), Buffer.from(blake3(new Uint8Array(12))).toString("hex"))
    const expected = [field("h_0"), field("h_1")]
    assert.deepStrictEqual(chunkHashes(tokens, c).map(hashHex), expected)
    assert.deepStrictEqual(independent(tokens, c), expected)
  })
})
