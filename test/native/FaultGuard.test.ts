/**
 * The addon's fault guard (issue 13 item 1; src/native/addon/guard.h) with
 * the real signal: a segment mapped, then shrunk with a real `ftruncate`
 * (fs.truncateSync on /dev/shm/<name>), so copying its vanished pages takes
 * SIGBUS on the libuv pool thread. The guard turns that into a rejected
 * copy (EFAULT naming the segment and the page), for gather, scatter,
 * copyBatch and prefault, on several pool threads at once and again and
 * again on the same ones; a fault outside a guarded copy still kills the
 * process with its signal (child processes); and the mapping identity and
 * `unlinkSegmentIf` that --unlink-reaped-segments uses (item 3).
 *
 * The guarded-fault counter is process-wide: the tests of this file run one
 * after another in their own worker and assert differences of it.
 */
import { assert, describe, it } from "@effect/vitest"
import { spawnSync } from "node:child_process"
import { randomUUID } from "node:crypto"
import { statSync, truncateSync } from "node:fs"
import { Effect } from "effect"
import { NativeMemoryLive } from "../../src/layers/NativeMemory.ts"
import { addonPath, isSegmentFault, loadNativeAddon, NativeError, NativeMemory } from "../../src/native/Native.ts"

const KiB = 1024
const PAGE = 4096

const segmentName = (): string => `mpcache-fault-${randomUUID()}`

/** A segment of `nbytes`, mapped through the facade; unlinked when the test's scope closes. */
const mappedSegment = (nbytes: number) =>
  Effect.gen(function*() {
    const mem = yield* NativeMemory
    const name = segmentName()
    yield* Effect.acquireRelease(mem.createSegment(name, nbytes), () => Effect.ignore(mem.unlinkSegment(name)))
    const mapping = yield* mem.map(name, nbytes)
    return { mem, name, mapping }
  })

const shrink = (name: string, bytes: number) => truncateSync(`/dev/shm/${name}`, bytes)

/** What a fault rejection carries, from the raw addon. */
const faultOf = (e: unknown) => {
  const { code, call, segment, signal, offset } = e as Record<string, unknown>
  return { code, call, segment, signal, offset }
}

describe("fault guard: copies of a shrunk segment", () => {
  it.effect("gather, scatter, gatherAll and prefault fail with a NativeError EFAULT naming the segment and the page; the pages left copy", () =>
    Effect.gen(function*() {
      const { mem, name, mapping } = yield* mappedSegment(64 * KiB)
      const before = mem.guardedFaults()
      const pattern = Uint8Array.from({ length: 64 * KiB }, (_, i) => (i * 7 + 3) % 251)
      yield* mem.scatter(mapping, new Float64Array([0, 0, 64 * KiB]), pattern)
      shrink(name, 16 * KiB)
      const buffer = new Uint8Array(64 * KiB)
      const fault = (call: string, page: number) =>
        new NativeError({
          call,
          errno: "EFAULT",
          segment: name,
          offset: page,
          message: `${call} on segment ${name}: SIGBUS on the page at byte ${page} of the 65536-byte mapping: the segment shrank below its registered size`
        })
      const gathered = yield* Effect.flip(mem.gather(mapping, new Float64Array([8 * KiB, 0, 40 * KiB]), buffer))
      assert.deepStrictEqual(gathered, fault("gather", 16 * KiB))
      assert.isTrue(isSegmentFault(gathered))
      const scattered = yield* Effect.flip(mem.scatter(mapping, new Float64Array([20 * KiB + 100, 0, 100]), buffer))
      assert.deepStrictEqual(scattered, fault("scatter", 20 * KiB))
      const batch = yield* Effect.flip(
        mem.gatherAll([{ mapping, ranges: new Float64Array([0, 0, 4 * KiB, 60 * KiB, 4 * KiB, 4 * KiB]) }], buffer)
      )
      assert.deepStrictEqual(batch, fault("gather", 60 * KiB))
      const prefaulted = yield* Effect.flip(mem.prefault(mapping, 0, 64 * KiB))
      assert.deepStrictEqual(prefaulted, fault("prefault", 16 * KiB))
      const touched = yield* Effect.flip(mem.prefault(mapping, 32 * KiB, 8 * KiB, { touch: true }))
      assert.deepStrictEqual(touched, fault("prefault", 32 * KiB))
      assert.strictEqual(mem.guardedFaults() - before, 5)
      // The 16 KiB still there copy as before, on the same pool threads.
      const kept = new Uint8Array(16 * KiB)
      yield* mem.gather(mapping, new Float64Array([0, 0, 16 * KiB]), kept)
      assert.deepStrictEqual(kept, pattern.subarray(0, 16 * KiB))
      assert.isFalse(mapping.isClosed())
    }).pipe(Effect.provide(NativeMemoryLive)))

  it.live("several pool threads fault at once, and the same threads fault again and again", () =>
    Effect.gen(function*() {
      const addon = loadNativeAddon()
      const name = segmentName()
      addon.shmCreate(name, 1024 * KiB)
      yield* Effect.addFinalizer(() => Effect.sync(() => addon.shmUnlink(name)))
      const mapping = addon.openMapping(name, 1024 * KiB)
      shrink(name, PAGE)
      const before = addon.guardedFaults()
      const settle = (p: Promise<void>) => p.then(() => "ok" as const, faultOf)
      // 48 jobs queued at once onto the libuv pool (4 threads unless UV_THREADPOOL_SIZE says otherwise).
      const all = yield* Effect.promise(() =>
        Promise.all([
          ...Array.from({ length: 32 }, () => settle(mapping.gather(new Float64Array([0, 0, 1024 * KiB]), new Uint8Array(1024 * KiB)))),
          ...Array.from({ length: 8 }, (_, i) => settle(mapping.scatter(new Float64Array([(i + 1) * 64 * KiB, 0, 64 * KiB]), new Uint8Array(64 * KiB)))),
          ...Array.from({ length: 8 }, () => settle(mapping.prefault(0, 1024 * KiB, true)))
        ])
      )
      assert.deepStrictEqual(all.slice(0, 32), Array(32).fill({ code: "EFAULT", call: "gather", segment: name, signal: "SIGBUS", offset: PAGE }))
      assert.deepStrictEqual(
        all.slice(32, 40),
        Array.from({ length: 8 }, (_, i) => ({ code: "EFAULT", call: "scatter", segment: name, signal: "SIGBUS", offset: (i + 1) * 64 * KiB }))
      )
      assert.deepStrictEqual(all.slice(40), Array(8).fill({ code: "EFAULT", call: "prefault", segment: name, signal: "SIGBUS", offset: PAGE }))
      // One after another: each fault leaves the thread's signal mask as it was, so the next is caught too.
      for (let i = 0; i < 50; i++) {
        const r = yield* Effect.promise(() => settle(mapping.gather(new Float64Array([PAGE, 0, 8]), new Uint8Array(8))))
        assert.deepStrictEqual(r, { code: "EFAULT", call: "gather", segment: name, signal: "SIGBUS", offset: PAGE })
      }
      assert.strictEqual(addon.guardedFaults() - before, 98)
      yield* Effect.promise(() => mapping.close())
    }))

  it("a fault outside a guarded copy still kills the process with SIGBUS, after a guarded one was caught", () => {
    const name = segmentName()
    // In a child: map, shrink, one guarded gather (caught, printed), then a read through the mapping's
    // ArrayBuffer view on the JS thread: not a guarded copy, so the signal's default action ends the process.
    const child = spawnSync(process.execPath, [
      "-e",
      `
      const fs = require("node:fs")
      const a = require(${JSON.stringify(addonPath)})
      const name = ${JSON.stringify(name)}
      a.shmCreate(name, 65536)
      const m = a.openMapping(name, 65536)
      fs.truncateSync("/dev/shm/" + name, 4096)
      a.shmUnlink(name)
      m.gather(new Float64Array([0, 0, 65536]), new Uint8Array(65536)).then(
        () => console.log("no fault"),
        (e) => {
          console.log(JSON.stringify({ code: e.code, call: e.call, offset: e.offset }))
          const view = new Uint8Array(m.arrayBuffer())
          console.log("read", view[8192])
        })
      `
    ], { encoding: "utf8", timeout: 20_000 })
    assert.strictEqual(child.stdout.trim(), JSON.stringify({ code: "EFAULT", call: "gather", offset: 4096 }))
    assert.strictEqual(child.signal, "SIGBUS")
    assert.strictEqual(child.status, null)
  })

  it("a SIGSEGV that is not a guarded copy's still ends the process with SIGSEGV (the guard chains to what was there)", () => {
    const child = spawnSync(process.execPath, [
      "-e",
      `require(${JSON.stringify(addonPath)}); console.log("loaded"); process.kill(process.pid, "SIGSEGV"); setTimeout(() => console.log("survived"), 2000)`
    ], { encoding: "utf8", timeout: 20_000 })
    assert.strictEqual(child.stdout.trim(), "loaded")
    assert.strictEqual(child.signal, "SIGSEGV")
  })
})

describe("mapping identity and unlinkSegmentIf (--unlink-reaped-segments)", () => {
  it.effect("identity is the segment's st_dev:st_ino at map time; unlinkSegmentIf keeps a re-created name", () =>
    Effect.gen(function*() {
      const mem = yield* NativeMemory
      const name = segmentName()
      yield* mem.createSegment(name, 8 * KiB)
      yield* Effect.addFinalizer(() => Effect.ignore(mem.unlinkSegment(name)))
      const st = statSync(`/dev/shm/${name}`)
      const mapping = yield* mem.map(name, 8 * KiB)
      assert.strictEqual(mapping.identity, `${st.dev}:${st.ino}`)
      // Re-created by "a restarted worker": another file under the same name is kept.
      yield* mem.unlinkSegment(name)
      yield* mem.createSegment(name, 8 * KiB)
      assert.strictEqual(yield* mem.unlinkSegmentIf(name, mapping.identity), "replaced")
      assert.strictEqual(yield* mem.segmentSize(name), 8 * KiB)
      // The file it mapped: unlinked; then absent.
      const again = yield* mem.map(name, 8 * KiB)
      assert.strictEqual(yield* mem.unlinkSegmentIf(name, again.identity), "unlinked")
      assert.strictEqual(yield* mem.unlinkSegmentIf(name, again.identity), "absent")
      assert.strictEqual((yield* Effect.flip(mem.segmentSize(name))).errno, "ENOENT")
    }).pipe(Effect.provide(NativeMemoryLive)))
})

describe("copyBatchUnguarded (bench/transfer/transfer.ts's reference for the guard's cost)", () => {
  it.live("copies exactly what copyBatch copies, both directions, over several mappings", () =>
    Effect.gen(function*() {
      const mem = yield* NativeMemory
      const addon = loadNativeAddon()
      const names = [segmentName(), segmentName()]
      for (const name of names) {
        yield* Effect.acquireRelease(mem.createSegment(name, 16 * KiB), () => Effect.ignore(mem.unlinkSegment(name)))
      }
      const mappings = names.map((name) => addon.openMapping(name, 16 * KiB))
      yield* Effect.addFinalizer(() => Effect.promise(() => Promise.all(mappings.map((m) => m.close()))))
      // Two ranges of each mapping, interleaved in one 24 KiB buffer.
      const ranges = [new Float64Array([0, 0, 4 * KiB, 8 * KiB, 8 * KiB, 8 * KiB]), new Float64Array([4 * KiB, 4 * KiB, 4 * KiB, 8 * KiB, 16 * KiB, 8 * KiB])]
      const source = Uint8Array.from({ length: 24 * KiB }, (_, i) => (i * 11 + 1) % 253)
      yield* Effect.promise(() => addon.copyBatchUnguarded("scatter", mappings, ranges, source))
      const guarded = new Uint8Array(24 * KiB)
      const unguarded = new Uint8Array(24 * KiB)
      yield* Effect.promise(() => addon.copyBatch("gather", mappings, ranges, guarded))
      yield* Effect.promise(() => addon.copyBatchUnguarded("gather", mappings, ranges, unguarded))
      assert.strictEqual(Buffer.compare(guarded, source), 0)
      assert.strictEqual(Buffer.compare(unguarded, source), 0)
      // Its arguments are checked as copyBatch's are.
      const bad = yield* Effect.flip(Effect.tryPromise(() => addon.copyBatchUnguarded("gather", mappings, [ranges[0]!], guarded)))
      assert.include(String(bad.cause), "gather: 2 mappings but 1 range lists; expected one range list per mapping")
    }).pipe(Effect.scoped, Effect.provide(NativeMemoryLive)))
})
