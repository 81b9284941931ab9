/**
 * The native memory addon and its Effect facade (DESIGN §4): segments,
 * scoped mappings, off-thread gather/scatter, close waiting for copies in
 * flight, one release per mapping, and no mapping left behind.
 *
 * Stats are process-wide; the tests of this file run one after another and
 * are the only users of the addon in their worker, so they assert exact values.
 */
import { assert, describe, it } from "@effect/vitest"
import { spawnSync } from "node:child_process"
import { randomUUID } from "node:crypto"
import { readFileSync } from "node:fs"
import { Context, Effect, Exit, Fiber, Layer, Scope } from "effect"
import fc from "fast-check"
import { NativeMemoryLive } from "../../src/layers/NativeMemory.ts"
import { addonPath, loadNativeAddon, NativeError, NativeMemory } from "../../src/native/Native.ts"
import { InvalidArgument } from "../../src/schema/WireError.ts"

const MiB = 1024 * 1024

const segmentName = (): string => `mpcache-test-${randomUUID()}`

/** A fresh segment of `nbytes` bytes, unlinked when the test's scope closes. */
const withSegment = (nbytes: number) =>
  Effect.gen(function*() {
    const mem = yield* NativeMemory
    const name = segmentName()
    yield* Effect.acquireRelease(mem.createSegment(name, nbytes), () => Effect.ignore(mem.unlinkSegment(name)))
    return name
  })

/** Bytes 0..n-1 of a recognisable pattern (never all zero). */
const pattern = (n: number, seed: number): Uint8Array => {
  const out = new Uint8Array(n)
  for (let i = 0; i < n; i++) out[i] = (i * 31 + seed) % 251 + 1
  return out
}

/** A large buffer filled fast: each 32-bit word holds its index plus a seed. */
const bigPattern = (nbytes: number, seed: number): Uint8Array => {
  const words = new Uint32Array(nbytes / 4)
  for (let i = 0; i < words.length; i++) words[i] = i + seed
  return new Uint8Array(words.buffer)
}

const sameBytes = (a: Uint8Array, b: Uint8Array): boolean => Buffer.compare(a, b) === 0

/** /proc/self/maps lines that mention a segment name (mapped shm shows as /dev/shm/<name>). */
const mapsLinesFor = (names: ReadonlyArray<string>): Array<string> =>
  readFileSync("/proc/self/maps", "utf8").split("\n").filter((line) => names.some((n) => line.includes(n)))

describe("NativeMemory", () => {
  it.effect("scatters non-contiguous ranges and gathers them back; stats return to 0 after the scope", () =>
    Effect.gen(function*() {
      const mem = yield* NativeMemory
      const name = yield* withSegment(MiB)
      assert.strictEqual(yield* mem.segmentSize(name), MiB)

      const src = pattern(10_000, 7)
      // (mappingOffset, bufferOffset, length): out of order, gaps in both.
      const scatterRanges = new Float64Array([
        512 * 1024, 0, 4096,
        100, 5000, 3000,
        MiB - 1000, 9000, 1000,
        0, 4096, 0 // empty triple: a no-op
      ])
      const back = new Uint8Array(8096)
      // Read the same three ranges back into another layout.
      const gatherRanges = new Float64Array([
        MiB - 1000, 0, 1000,
        512 * 1024, 1000, 4096,
        100, 5096, 3000
      ])
      yield* Effect.scoped(Effect.gen(function*() {
        const mapping = yield* mem.map(name, MiB)
        assert.strictEqual(mapping.name, name)
        assert.strictEqual(mapping.sizeBytes, MiB)
        assert.isFalse(mapping.isClosed())
        assert.deepStrictEqual(mem.stats(), { openMappings: 1, mappedBytes: MiB })

        yield* mem.scatter(mapping, scatterRanges, src)
        yield* mem.gather(mapping, gatherRanges, back)

        const whole = new Uint8Array(MiB)
        yield* mem.gather(mapping, new Float64Array([0, 0, MiB]), whole)
        const expected = new Uint8Array(MiB)
        expected.set(src.subarray(0, 4096), 512 * 1024)
        expected.set(src.subarray(5000, 8000), 100)
        expected.set(src.subarray(9000, 10_000), MiB - 1000)
        assert.isTrue(sameBytes(whole, expected))
      }))
      const expectedBack = new Uint8Array(8096)
      expectedBack.set(src.subarray(9000, 10_000), 0)
      expectedBack.set(src.subarray(0, 4096), 1000)
      expectedBack.set(src.subarray(5000, 8000), 5096)
      assert.isTrue(sameBytes(back, expectedBack))
      assert.deepStrictEqual(mem.stats(), { openMappings: 0, mappedBytes: 0 })

      yield* mem.unlinkSegment(name)
      const gone = yield* Effect.flip(mem.segmentSize(name))
      assert.instanceOf(gone, NativeError)
      assert.strictEqual(gone.errno, "ENOENT")
      assert.strictEqual(gone.call, "shm_open")
      assert.include(gone.message, name)
    }).pipe(Effect.provide(NativeMemoryLive)))

  it.effect("data written through one mapping is seen through another of the same segment", () =>
    Effect.gen(function*() {
      const mem = yield* NativeMemory
      const name = yield* withSegment(64 * 1024)
      const a = yield* mem.map(name, 64 * 1024)
      const b = yield* mem.map(name, 4096)
      const src = pattern(4096, 3)
      yield* mem.scatter(a, new Float64Array([0, 0, 4096]), src)
      const dest = new Uint8Array(4096)
      yield* mem.gather(b, new Float64Array([0, 0, 4096]), dest)
      assert.isTrue(sameBytes(dest, src))
      assert.deepStrictEqual(mem.stats(), { openMappings: 2, mappedBytes: 64 * 1024 + 4096 })
    }).pipe(Effect.provide(NativeMemoryLive)))

  it.effect("segment-level failures are NativeErrors with the errno", () =>
    Effect.gen(function*() {
      const mem = yield* NativeMemory
      const name = yield* withSegment(4096)
      const taken = yield* Effect.flip(mem.createSegment(name, 4096))
      assert.instanceOf(taken, NativeError)
      assert.strictEqual(taken.errno, "EEXIST")
      assert.strictEqual(taken.call, "shm_open")
      assert.strictEqual(
        taken.message,
        `shm_open of shared-memory segment ${name} failed: File exists (EEXIST)`
      )
      const empty = yield* Effect.flip(mem.createSegment("", 4096))
      assert.strictEqual(empty.errno, "EINVAL")
      const missing = yield* Effect.flip(mem.unlinkSegment(segmentName()))
      assert.strictEqual(missing.errno, "ENOENT")
    }).pipe(Effect.provide(NativeMemoryLive)))

  it.effect("mapping a missing segment is an InvalidArgument naming it", () =>
    Effect.gen(function*() {
      const mem = yield* NativeMemory
      const name = segmentName()
      const error = yield* Effect.flip(Effect.scoped(mem.map(name, 4096)))
      assert.instanceOf(error, InvalidArgument)
      assert.strictEqual(
        error.message,
        `shared-memory segment ${name} does not exist (expected /dev/shm/${name}, created by the worker before it registers)`
      )
      assert.deepStrictEqual(mem.stats(), { openMappings: 0, mappedBytes: 0 })
    }).pipe(Effect.provide(NativeMemoryLive)))

  it.effect("a segment shorter than the descriptor claims is refused at map time (no SIGBUS)", () =>
    Effect.gen(function*() {
      const mem = yield* NativeMemory
      const name = yield* withSegment(4096)
      const error = yield* Effect.flip(Effect.scoped(mem.map(name, 8192)))
      assert.instanceOf(error, InvalidArgument)
      assert.strictEqual(
        error.message,
        `openMapping: segment ${name} holds 4096 bytes, the descriptor claims 8192; expected nbytes (8192) <= the segment's size`
      )
      assert.deepStrictEqual(mem.stats(), { openMappings: 0, mappedBytes: 0 })
    }).pipe(Effect.provide(NativeMemoryLive)))

  it.effect("bad names and byte counts are InvalidArguments", () =>
    Effect.gen(function*() {
      const mem = yield* NativeMemory
      const slash = yield* Effect.flip(Effect.scoped(mem.map("dir/name", 4096)))
      assert.instanceOf(slash, InvalidArgument)
      assert.include(slash.message, `invalid shared-memory segment name "dir/name": it contains '/'`)
      const empty = yield* Effect.flip(Effect.scoped(mem.map("", 4096)))
      assert.include(empty.message, "it is empty")
      const name = yield* withSegment(4096)
      const zero = yield* Effect.flip(Effect.scoped(mem.map(name, 0)))
      assert.instanceOf(zero, InvalidArgument)
      assert.include(zero.message, "must be an integer >= 1")
      const fraction = yield* Effect.flip(Effect.scoped(mem.map(name, 1.5)))
      assert.instanceOf(fraction, InvalidArgument)
    }).pipe(Effect.provide(NativeMemoryLive)))

  it.effect("ranges outside the mapping or the buffer are InvalidArguments naming the triple; nothing is copied", () =>
    Effect.gen(function*() {
      const mem = yield* NativeMemory
      const name = yield* withSegment(8192)
      const mapping = yield* mem.map(name, 8192)
      const buffer = pattern(1000, 1)

      const pastMapping = yield* Effect.flip(
        mem.scatter(mapping, new Float64Array([0, 0, 100, 8100, 0, 100]), buffer)
      )
      assert.instanceOf(pastMapping, InvalidArgument)
      assert.strictEqual(
        pastMapping.message,
        `scatter on segment ${name}: range #1 (mappingOffset 8100, bufferOffset 0, length 100) exceeds the mapping: mappingOffset + length must be <= 8192 bytes (the mapping size)`
      )
      // Validation precedes queueing: triple #0 was not written either.
      const head = new Uint8Array(100)
      yield* mem.gather(mapping, new Float64Array([0, 0, 100]), head)
      assert.isTrue(sameBytes(head, new Uint8Array(100)))

      const pastBuffer = yield* Effect.flip(mem.gather(mapping, new Float64Array([0, 950, 51]), buffer))
      assert.instanceOf(pastBuffer, InvalidArgument)
      assert.strictEqual(
        pastBuffer.message,
        `gather on segment ${name}: range #0 (mappingOffset 0, bufferOffset 950, length 51) exceeds the buffer: bufferOffset + length must be <= 1000 bytes (the buffer's byteLength)`
      )

      // Overflow-safe: offset + length wraps nothing.
      const huge = yield* Effect.flip(
        mem.gather(mapping, new Float64Array([8192, 0, Number.MAX_SAFE_INTEGER]), buffer)
      )
      assert.include(huge.message, "range #0 (mappingOffset 8192, bufferOffset 0, length 9007199254740991) exceeds the mapping")

      const negative = yield* Effect.flip(mem.gather(mapping, new Float64Array([0, 0, 1, -1, 0, 1]), buffer))
      assert.strictEqual(
        negative.message,
        `gather on segment ${name}: range #1 has mappingOffset = -1; expected an integer in [0, 2^53-1]`
      )
      const fractional = yield* Effect.flip(mem.gather(mapping, new Float64Array([0, 0.5, 1]), buffer))
      assert.include(fractional.message, "range #0 has bufferOffset = 0.5")
      const notFinite = yield* Effect.flip(mem.gather(mapping, new Float64Array([0, 0, Number.NaN]), buffer))
      assert.include(notFinite.message, "range #0 has length = nan")
      const notTriples = yield* Effect.flip(mem.gather(mapping, new Float64Array([0, 0]), buffer))
      assert.include(notTriples.message, "ranges holds 2 numbers")

      // A subarray's bound is its own byteLength, not its ArrayBuffer's.
      const view = new Uint8Array(new ArrayBuffer(4096), 1024, 16)
      const pastView = yield* Effect.flip(mem.gather(mapping, new Float64Array([0, 0, 17]), view))
      assert.include(pastView.message, "must be <= 16 bytes (the buffer's byteLength)")
      yield* mem.scatter(mapping, new Float64Array([200, 0, 16]), pattern(16, 9))
      yield* mem.gather(mapping, new Float64Array([200, 0, 16]), view)
      assert.isTrue(sameBytes(view, pattern(16, 9)))
    }).pipe(Effect.provide(NativeMemoryLive)))

  it.effect("a copy after close fails with NativeError ECLOSED", () =>
    Effect.gen(function*() {
      const mem = yield* NativeMemory
      const name = yield* withSegment(4096)
      const scope = yield* Scope.make()
      const mapping = yield* mem.map(name, 4096).pipe(Scope.provide(scope))
      yield* Scope.close(scope, Exit.void)
      assert.isTrue(mapping.isClosed())
      assert.strictEqual(mapping.releases(), 1)
      const error = yield* Effect.flip(mem.gather(mapping, new Float64Array([0, 0, 1]), new Uint8Array(1)))
      assert.instanceOf(error, NativeError)
      assert.strictEqual(error.errno, "ECLOSED")
      assert.strictEqual(error.call, "gather")
      assert.strictEqual(error.message, `mapping ${name} is closed`)
      const scatterError = yield* Effect.flip(mem.scatter(mapping, new Float64Array([0, 0, 1]), new Uint8Array(1)))
      assert.strictEqual(scatterError._tag, "NativeError")
    }).pipe(Effect.provide(NativeMemoryLive)))

  it.effect("closing the scope during a 256 MiB gather waits for it; the data is intact and then unmapped", () =>
    Effect.gen(function*() {
      const mem = yield* NativeMemory
      const size = 256 * MiB
      const name = yield* withSegment(size)
      const src = bigPattern(size, 0x5a5a)
      const scope = yield* Scope.make()
      const mapping = yield* mem.map(name, size).pipe(Scope.provide(scope))
      yield* mem.scatter(mapping, new Float64Array([0, 0, size]), src)

      const dest = new Uint8Array(size)
      const copy = yield* Effect.forkChild(mem.gather(mapping, new Float64Array([0, 0, size]), dest), {
        startImmediately: true
      })
      const close = yield* Effect.forkChild(Scope.close(scope, Exit.void), { startImmediately: true })
      // The gather is queued, so the close is waiting: still mapped, but closed to new copies.
      assert.isTrue(mapping.isClosed())
      assert.deepStrictEqual(mem.stats(), { openMappings: 1, mappedBytes: size })
      const late = yield* Effect.flip(mem.gather(mapping, new Float64Array([0, 0, 1]), new Uint8Array(1)))
      assert.strictEqual(late._tag === "NativeError" ? late.errno : late._tag, "ECLOSED")

      yield* Fiber.join(copy)
      yield* Fiber.join(close)
      assert.isTrue(sameBytes(dest, src))
      assert.strictEqual(mapping.releases(), 1)
      assert.deepStrictEqual(mem.stats(), { openMappings: 0, mappedBytes: 0 })
    }).pipe(Effect.provide(NativeMemoryLive)))

  it.effect("closing the scope with 64 copies queued waits for all of them", () =>
    Effect.gen(function*() {
      const mem = yield* NativeMemory
      const chunk = 4 * MiB
      const count = 64
      const name = yield* withSegment(chunk * count)
      const src = bigPattern(chunk * count, 17)
      const scope = yield* Scope.make()
      const mapping = yield* mem.map(name, chunk * count).pipe(Scope.provide(scope))
      yield* mem.scatter(mapping, new Float64Array([0, 0, chunk * count]), src)

      const dests = Array.from({ length: count }, () => new Uint8Array(chunk))
      const copies: Array<Fiber.Fiber<void, InvalidArgument | NativeError>> = []
      for (let i = 0; i < count; i++) {
        // startImmediately: each copy is queued on the thread pool before the next line runs.
        copies.push(
          yield* Effect.forkChild(mem.gather(mapping, new Float64Array([i * chunk, 0, chunk]), dests[i]!), {
            startImmediately: true
          })
        )
      }
      yield* Scope.close(scope, Exit.void)
      assert.deepStrictEqual(mem.stats(), { openMappings: 0, mappedBytes: 0 })
      yield* Fiber.joinAll(copies)
      dests.forEach((dest, i) => assert.isTrue(sameBytes(dest, src.subarray(i * chunk, (i + 1) * chunk))))
    }).pipe(Effect.provide(NativeMemoryLive)))
})

describe("batched copies (gatherAll / scatterAll)", () => {
  it.effect("several mappings into one buffer and back, byte for byte, in one job", () =>
    Effect.gen(function*() {
      const mem = yield* NativeMemory
      const [a, b] = [yield* withSegment(64 * 1024), yield* withSegment(64 * 1024)]
      const ma = yield* mem.map(a, 64 * 1024)
      const mb = yield* mem.map(b, 64 * 1024)
      const src = pattern(96 * 1024, 9)
      // a takes [0, 32K) and [64K, 80K) of the buffer; b takes [32K, 64K) and [80K, 96K); b appears twice.
      yield* mem.scatterAll([
        { mapping: ma, ranges: Float64Array.of(0, 0, 32768, 40960, 65536, 16384) },
        { mapping: mb, ranges: Float64Array.of(4096, 32768, 32768) },
        { mapping: mb, ranges: Float64Array.of(49152, 81920, 16384) }
      ], src)
      const one = new Uint8Array(32768)
      yield* mem.gather(mb, Float64Array.of(4096, 0, 32768), one)
      assert.isTrue(sameBytes(one, src.subarray(32768, 65536)))
      const back = new Uint8Array(96 * 1024)
      yield* mem.gatherAll([
        { mapping: mb, ranges: Float64Array.of(49152, 81920, 16384, 4096, 32768, 32768) },
        { mapping: ma, ranges: Float64Array.of(40960, 65536, 16384, 0, 0, 32768) }
      ], back)
      assert.isTrue(sameBytes(back, src))
    }).pipe(Effect.scoped, Effect.provide(NativeMemoryLive)))

  it.effect("any offsets and lengths (streaming stores from 4 KiB on, unaligned heads and tails) copy byte for byte", () =>
    Effect.gen(function*() {
      const mem = yield* NativeMemory
      const size = 256 * 1024
      const name = yield* withSegment(size)
      const mapping = yield* mem.map(name, size)
      const src = pattern(size, 77)
      yield* mem.scatter(mapping, Float64Array.of(0, 0, size), src)
      const samples = fc.sample(
        fc.tuple(fc.integer({ min: 0, max: size - 1 }), fc.integer({ min: 0, max: 1023 }), fc.integer({ min: 0, max: 20_000 })),
        { numRuns: 200, seed: 7 }
      )
      for (const [mappingOffset, bufferOffset, wanted] of samples) {
        const length = Math.min(wanted, size - mappingOffset)
        const dest = new Uint8Array(bufferOffset + length + 64).fill(0xee)
        yield* mem.gatherAll([{ mapping, ranges: Float64Array.of(mappingOffset, bufferOffset, length) }], dest)
        const expected = new Uint8Array(dest.length).fill(0xee)
        expected.set(src.subarray(mappingOffset, mappingOffset + length), bufferOffset)
        assert.isTrue(sameBytes(dest, expected), `gather (${mappingOffset}, ${bufferOffset}, ${length})`)
        // And back: scatter the same bytes at a shifted place, read them with a plain gather.
        const back = (mappingOffset + 1) % (size - length + 1)
        yield* mem.scatterAll([{ mapping, ranges: Float64Array.of(back, bufferOffset, length) }], dest)
        const check = new Uint8Array(length)
        yield* mem.gather(mapping, Float64Array.of(back, 0, length), check)
        assert.isTrue(sameBytes(check, dest.subarray(bufferOffset, bufferOffset + length)), `scatter (${back}, ${bufferOffset}, ${length})`)
        yield* mem.scatter(mapping, Float64Array.of(0, 0, size), src)
      }
    }).pipe(Effect.scoped, Effect.provide(NativeMemoryLive)))

  it.effect("a bad part or a closed mapping fails the whole batch before anything is copied", () =>
    Effect.gen(function*() {
      const mem = yield* NativeMemory
      const [a, b] = [yield* withSegment(4096), yield* withSegment(4096)]
      const ma = yield* mem.map(a, 4096)
      const scope = yield* Scope.make()
      const mb = yield* mem.map(b, 4096).pipe(Scope.provide(scope))
      const dest = new Uint8Array(8).fill(0xee)
      const outside = yield* Effect.flip(mem.gatherAll([
        { mapping: ma, ranges: Float64Array.of(0, 0, 4) },
        { mapping: mb, ranges: Float64Array.of(4094, 4, 4) }
      ], dest))
      assert.instanceOf(outside, InvalidArgument)
      assert.include(outside.message, `gather on segment ${b}: range #0`)
      assert.deepStrictEqual([...dest], new Array(8).fill(0xee), "nothing copied")
      yield* Scope.close(scope, Exit.void)
      const closed = yield* Effect.flip(mem.gatherAll([
        { mapping: ma, ranges: Float64Array.of(0, 0, 4) },
        { mapping: mb, ranges: Float64Array.of(0, 4, 4) }
      ], dest))
      assert.strictEqual(closed._tag === "NativeError" ? `${closed.errno} ${closed.message}` : closed._tag, `ECLOSED mapping ${b} is closed`)
      assert.deepStrictEqual([...dest], new Array(8).fill(0xee), "nothing copied")
      assert.deepStrictEqual(mem.stats(), { openMappings: 1, mappedBytes: 4096 }, "the open mapping's copy count is back to 0")
    }).pipe(Effect.scoped, Effect.provide(NativeMemoryLive)))

  it.live("the addon refuses what is not a batch: a direction, one range list per Mapping", () =>
    Effect.gen(function*() {
      const addon = loadNativeAddon()
      const name = segmentName()
      addon.shmCreate(name, 4096)
      yield* Effect.addFinalizer(() => Effect.sync(() => addon.shmUnlink(name)))
      const m = addon.openMapping(name, 4096)
      yield* Effect.addFinalizer(() => Effect.promise(() => m.close()))
      const r = Float64Array.of(0, 0, 1)
      const b = new Uint8Array(1)
      const thrown = (f: () => unknown): string => {
        try {
          f()
          return "no error"
        } catch (e) {
          return `${(e as { code?: string }).code}: ${(e as Error).message}`
        }
      }
      assert.strictEqual(thrown(() => addon.copyBatch("copy" as never, [m], [r], b)), 'EINVAL: copyBatch: direction must be "gather" or "scatter"')
      assert.strictEqual(thrown(() => addon.copyBatch("gather", [m, m], [r], b)), "EINVAL: gather: 2 mappings but 1 range lists; expected one range list per mapping")
      assert.strictEqual(thrown(() => addon.copyBatch("scatter", [{} as never], [r], b)), "EINVAL: scatter: mappings[0] is not a Mapping")
      assert.strictEqual(
        thrown(() => addon.copyBatch("gather", [m], [new Uint32Array(3) as never], b)),
        "EINVAL: gather: ranges[0] must be a Float64Array of (mappingOffset, bufferOffset, length) triples"
      )
      // A close waits for a batch queued before it, however many parts name the mapping.
      const events: Array<string> = []
      const copy = addon.copyBatch("gather", [m, m, m], [r, r, r], b).then(() => events.push("batch"))
      const close = m.close().then(() => events.push("close"))
      yield* Effect.promise(() => Promise.all([copy, close]))
      assert.deepStrictEqual(events, ["batch", "close"])
    }))
})

describe("addon Mapping.close", () => {
  it.live("resolves after every copy queued before it, and every close resolves after that one munmap", () =>
    Effect.gen(function*() {
      const addon = loadNativeAddon()
      const name = segmentName()
      addon.shmCreate(name, 4 * MiB)
      yield* Effect.addFinalizer(() => Effect.sync(() => addon.shmUnlink(name)))
      const mapping = addon.openMapping(name, 4 * MiB)
      const events: Array<string> = []
      const copies = Array.from({ length: 32 }, (_, i) =>
        mapping.gather(new Float64Array([0, 0, 4 * MiB]), new Uint8Array(4 * MiB)).then(() => {
          events.push(`copy ${i}`)
        }))
      const first = mapping.close().then(() => events.push("close 1"))
      const second = mapping.close().then(() => events.push("close 2"))
      assert.isTrue(mapping.closed)
      assert.deepStrictEqual(addon.stats(), { openMappings: 1, mappedBytes: 4 * MiB })
      const late = yield* Effect.flip(
        Effect.tryPromise(() => mapping.scatter(new Float64Array([0, 0, 1]), new Uint8Array(1)))
      )
      assert.strictEqual((late.cause as { code?: unknown }).code, "ECLOSED")
      yield* Effect.promise(() => Promise.all([...copies, first, second]))
      assert.strictEqual(events.length, 34)
      assert.deepStrictEqual(events.slice(32), ["close 1", "close 2"])
      assert.deepStrictEqual(addon.stats(), { openMappings: 0, mappedBytes: 0 })
      yield* Effect.promise(() => mapping.close()) // closed already: resolves at once
    }))
})

describe("one release per mapping", () => {
  /** Builds a fresh NativeMemoryLive into its own scope, so the test decides when it shuts down. */
  const buildLayer = Effect.gen(function*() {
    const layerScope = yield* Scope.make()
    const context = yield* Layer.buildWithScope(Layer.fresh(NativeMemoryLive), layerScope)
    return { layerScope, mem: Context.get(context, NativeMemory) }
  })

  it.effect("scope first, then layer shutdown: the release ran once", () =>
    Effect.gen(function*() {
      const { layerScope, mem } = yield* buildLayer
      const name = yield* withSegment(4096).pipe(Effect.provideService(NativeMemory, mem))
      const mapScope = yield* Scope.make()
      const mapping = yield* mem.map(name, 4096).pipe(Scope.provide(mapScope))
      yield* Scope.close(mapScope, Exit.void)
      yield* Scope.close(layerScope, Exit.void)
      assert.strictEqual(mapping.releases(), 1)
      assert.isTrue(mapping.isClosed())
      assert.deepStrictEqual(mem.stats(), { openMappings: 0, mappedBytes: 0 })
    }))

  it.effect("layer shutdown first (with a copy in flight), then the scope: the release ran once", () =>
    Effect.gen(function*() {
      const { layerScope, mem } = yield* buildLayer
      const size = 64 * MiB
      const name = yield* withSegment(size).pipe(Effect.provideService(NativeMemory, mem))
      const mapScope = yield* Scope.make()
      const mapping = yield* mem.map(name, size).pipe(Scope.provide(mapScope))
      const src = bigPattern(size, 99)
      yield* mem.scatter(mapping, new Float64Array([0, 0, size]), src)
      const dest = new Uint8Array(size)
      const copy = yield* Effect.forkChild(mem.gather(mapping, new Float64Array([0, 0, size]), dest), {
        startImmediately: true
      })
      yield* Scope.close(layerScope, Exit.void) // server shutdown: waits for the copy, unmaps
      assert.deepStrictEqual(mem.stats(), { openMappings: 0, mappedBytes: 0 })
      assert.strictEqual(mapping.releases(), 1)
      yield* Fiber.join(copy)
      assert.isTrue(sameBytes(dest, src))
      yield* Scope.close(mapScope, Exit.void) // unregister after shutdown: a no-op
      assert.strictEqual(mapping.releases(), 1)
      const refused = yield* Effect.flip(Effect.scoped(mem.map(name, size)))
      assert.strictEqual(refused._tag === "NativeError" ? refused.errno : refused._tag, "ECLOSED")
    }))

  it.effect("scope and layer closing concurrently: the release ran once", () =>
    Effect.gen(function*() {
      const { layerScope, mem } = yield* buildLayer
      const name = yield* withSegment(4096).pipe(Effect.provideService(NativeMemory, mem))
      const mapScope = yield* Scope.make()
      const mapping = yield* mem.map(name, 4096).pipe(Scope.provide(mapScope))
      yield* Effect.all([Scope.close(mapScope, Exit.void), Scope.close(layerScope, Exit.void)], {
        concurrency: "unbounded"
      })
      assert.strictEqual(mapping.releases(), 1)
      assert.deepStrictEqual(mem.stats(), { openMappings: 0, mappedBytes: 0 })
    }))
})

describe("no mapping left behind", () => {
  it.effect("10 create/map/unmap/unlink cycles leave nothing in /proc/self/maps", () =>
    Effect.gen(function*() {
      const mem = yield* NativeMemory
      const names: Array<string> = []
      for (let i = 0; i < 10; i++) {
        const name = segmentName()
        names.push(name)
        yield* mem.createSegment(name, MiB)
        yield* Effect.scoped(Effect.gen(function*() {
          const mapping = yield* mem.map(name, MiB)
          yield* mem.scatter(mapping, new Float64Array([i * 1000, 0, 64]), pattern(64, i))
          // While mapped, the kernel lists it: the check below can see a leak.
          assert.strictEqual(mapsLinesFor([name]).length, 1)
        })).pipe(Effect.ensuring(Effect.ignore(mem.unlinkSegment(name))))
      }
      assert.deepStrictEqual(mapsLinesFor(names), [])
      assert.deepStrictEqual(mem.stats(), { openMappings: 0, mappedBytes: 0 })
    }).pipe(Effect.provide(NativeMemoryLive)))

  it("the GC finalizer unmaps a mapping that was never closed", () => {
    const name = segmentName()
    const script = `
      const addon = require(${JSON.stringify(addonPath)})
      addon.shmCreate(${JSON.stringify(name)}, 65536)
      ;(async () => {
        try {
          ;(() => { addon.openMapping(${JSON.stringify(name)}, 65536) })()
          const before = addon.stats().openMappings
          // Node-API runs ObjectWrap finalizers after the GC, from the event loop.
          for (let i = 0; i < 20 && addon.stats().openMappings !== 0; i++) {
            globalThis.gc()
            await new Promise((resolve) => setImmediate(resolve))
          }
          console.log(JSON.stringify({ before, after: addon.stats() }))
        } finally {
          addon.shmUnlink(${JSON.stringify(name)})
        }
      })()`
    const run = spawnSync(process.execPath, ["--expose-gc", "-e", script], { encoding: "utf8" })
    assert.strictEqual(run.status, 0, run.stderr)
    assert.deepStrictEqual(JSON.parse(run.stdout), { before: 1, after: { openMappings: 0, mappedBytes: 0 } })
  })
})
