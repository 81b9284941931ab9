/** The pool owner's zero-copy view of a mapping, and prefaulting. */
import { randomUUID } from "node:crypto"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Exit, Scope } from "effect"
import { NativeMemoryLive } from "../../src/layers/NativeMemory.ts"
import { NativeMemory } from "../../src/native/Native.ts"

describe("view and prefault", () => {
  it.live("a view shows what scatter wrote; prefault keeps the contents; release detaches the view", () =>
    Effect.gen(function*() {
      const native = yield* NativeMemory
      const name = `mpcache-test-${randomUUID()}`
      const size = 1 << 20
      yield* native.createSegment(name, size)
      yield* Effect.addFinalizer(() => Effect.ignore(native.unlinkSegment(name)))
      const scope = yield* Scope.make()
      const mapping = yield* native.map(name, size).pipe(Scope.provide(scope))
      const view = yield* native.view(mapping)
      assert.strictEqual(view, yield* native.view(mapping), "the same ArrayBuffer every time")
      assert.strictEqual(view.byteLength, size)
      yield* native.scatter(mapping, Float64Array.of(4096, 0, 3), Buffer.from([7, 8, 9]))
      assert.deepStrictEqual([...new Uint8Array(view, 4096, 3)], [7, 8, 9])
      new Uint8Array(view, 100, 2).set([5, 6])
      const out = Buffer.alloc(2)
      yield* native.gather(mapping, Float64Array.of(100, 0, 2), out)
      assert.deepStrictEqual([...out], [5, 6])
      yield* native.prefault(mapping, 0, size)
      assert.deepStrictEqual([...new Uint8Array(view, 4096, 3)], [7, 8, 9])
      // touch writes every page once (the first byte of each: 4096 holds 7), atomically and unchanged.
      const before = Buffer.from(new Uint8Array(view)).fill(3, 8192, 12288)
      new Uint8Array(view, 8192, 4096).fill(3)
      yield* native.prefault(mapping, 0, size, { touch: true })
      assert.isTrue(Buffer.from(new Uint8Array(view)).equals(before), "touch leaves every byte as it was")
      const bad = yield* Effect.flip(native.prefault(mapping, size, 1))
      assert.strictEqual(bad._tag, "InvalidArgument")
      yield* Scope.close(scope, Exit.void)
      assert.strictEqual(view.byteLength, 0, "detached before munmap")
      assert.strictEqual((yield* Effect.flip(native.view(mapping)))._tag, "NativeError")
    }).pipe(Effect.scoped, Effect.provide(NativeMemoryLive)))
})
