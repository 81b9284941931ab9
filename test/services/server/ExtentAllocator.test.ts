import { assert, describe, it } from "@effect/vitest"
import { makeExtentAllocator } from "../../../src/services/server/internal/ExtentAllocator.ts"

describe("ExtentAllocator", () => {
  it("first fit, 64-byte alignment for multiples of 64, merging on release", () => {
    const a = makeExtentAllocator(1024)
    assert.strictEqual(a.allocate(10), 0)
    assert.strictEqual(a.allocate(128), 64)
    assert.strictEqual(a.allocate(128), 192)
    assert.strictEqual(a.freeBytes(), 1024 - 266)
    a.release(64, 128)
    assert.strictEqual(a.allocate(64), 64, "first fit reuses the hole")
    a.release(0, 10)
    a.release(64, 64)
    a.release(192, 128)
    assert.strictEqual(a.freeBytes(), 1024)
    assert.strictEqual(a.largestFree(), 1024, "all neighbours merged back")
  })

  it("wouldFit answers what allocate would after releasing some extents, and changes nothing", () => {
    const a = makeExtentAllocator(256)
    const offsets = [0, 1, 2, 3].map(() => a.allocate(64)!) // 0, 64, 128, 192: full
    assert.isFalse(a.wouldFit(64, []))
    assert.isTrue(a.wouldFit(64, [{ offset: 128, length: 64 }]))
    // Two extents with a used one between: 128 free bytes, never 128 contiguous.
    assert.isFalse(a.wouldFit(128, [{ offset: 0, length: 64 }, { offset: 128, length: 64 }]))
    // Touching ones merge, in any order given; with a free neighbour too.
    assert.isTrue(a.wouldFit(128, [{ offset: 128, length: 64 }, { offset: 64, length: 64 }]))
    a.release(offsets[3]!, 64)
    assert.isTrue(a.wouldFit(192, [{ offset: 64, length: 64 }, { offset: 128, length: 64 }]))
    // Alignment: 64 bytes (a multiple of 64) need a 64-aligned start; 63 bytes do not.
    const b = makeExtentAllocator(180)
    b.allocate(10)
    b.allocate(100)
    assert.isFalse(b.wouldFit(128, [{ offset: 10, length: 100 }]))
    assert.isTrue(b.wouldFit(127, [{ offset: 10, length: 100 }]))
    assert.deepStrictEqual([a.freeBytes(), b.freeBytes()], [64, 70])
  })

  it("refuses what does not fit, even when enough bytes are free in pieces", () => {
    const a = makeExtentAllocator(256)
    const x = a.allocate(64)!
    a.allocate(64)
    const y = a.allocate(64)!
    a.allocate(64)
    a.release(x, 64)
    a.release(y, 64)
    assert.strictEqual(a.freeBytes(), 128)
    assert.strictEqual(a.allocate(128), undefined)
    assert.strictEqual(a.allocate(0), undefined)
    assert.strictEqual(a.allocate(64), 0)
  })

  it("random allocations and releases never overlap and account every byte", () => {
    const cap = 1 << 16
    const a = makeExtentAllocator(cap)
    const live = new Map<number, number>()
    let seed = 12345
    const rnd = () => (seed = (seed * 1103515245 + 12345) >>> 0) / 2 ** 32
    for (let i = 0; i < 5000; i++) {
      if (rnd() < 0.55) {
        const len = rnd() < 0.5 ? 64 * (1 + Math.floor(rnd() * 32)) : 1 + Math.floor(rnd() * 700)
        const off = a.allocate(len)
        if (off === undefined) continue
        for (const [o, l] of live) assert.isTrue(off + len <= o || o + l <= off, "no overlap")
        assert.isTrue(off + len <= cap)
        live.set(off, len)
      } else if (live.size > 0) {
        const [o, l] = [...live][Math.floor(rnd() * live.size)]!
        live.delete(o)
        a.release(o, l)
      }
      const used = [...live.values()].reduce((n, l) => n + l, 0)
      assert.strictEqual(a.freeBytes(), cap - used)
    }
  })
})
