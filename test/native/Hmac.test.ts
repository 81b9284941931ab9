/**
 * HMAC-SHA256 off the JS thread (issue 24 item 14 follow-up; src/native/Hmac.ts, src/native/addon/hmac.h): the
 * addon's OpenSSL HMAC (both APIs it resolves) gives createHmac's tag over any parts; the event loop keeps turning
 * while a 64 MiB MAC runs, where createHmac holds it; an interrupt waits for the job holding the bytes; at most half
 * the libuv pool hashes at once; the node:crypto fallback, forced by option or MPCACHE_NATIVE_HMAC=0, says why.
 *
 * hmacInFlight is process-wide; the tests of this file run one after another and are the only users of the MAC in
 * their worker, so they assert exact counts.
 */
import { assert, describe, it } from "@effect/vitest"
import { createHmac, createSecretKey, randomBytes } from "node:crypto"
import { Effect, Exit, Fiber } from "effect"
import fc from "fast-check"
import { defaultHmacSha256, type HmacSha256, makeHmacSha256Unsafe } from "../../src/native/Hmac.ts"
import { loadNativeAddon } from "../../src/native/Native.ts"

const MiB = 1024 * 1024
const addon = loadNativeAddon()

const reference = (key: Uint8Array, parts: ReadonlyArray<Uint8Array>): string => {
  const h = createHmac("sha256", key)
  for (const p of parts) h.update(p)
  return h.digest("hex")
}

/** How many turns the event loop made (setImmediate callbacks run) while `effect` ran, and its result. */
const turnsWhile = <A>(effect: Effect.Effect<A>) =>
  Effect.gen(function*() {
    let turns = 0
    let running = true
    const spin = () => {
      if (!running) return
      turns++
      setImmediate(spin)
    }
    setImmediate(spin)
    const a = yield* effect.pipe(Effect.ensuring(Effect.sync(() => (running = false))))
    return { turns, a }
  })

describe("the addon's HMAC-SHA256 (OpenSSL of this Node, on the libuv pool)", () => {
  it("this Node (24, OpenSSL 3) exports both APIs, and each passes the probe's RFC 4231 test", () => {
    assert.deepStrictEqual(addon.hmacProbe(), { apis: ["evp_mac", "hmac"], reason: "" })
  })

  for (const api of ["evp_mac", "hmac"] as const) {
    it(`${api}: createHmac's tag over random parts of random sizes, empty key and empty parts included`, async () => {
      await fc.assert(
        fc.asyncProperty(
          fc.uint8Array({ minLength: 0, maxLength: 200 }),
          fc.array(fc.oneof(fc.constant(0), fc.integer({ min: 1, max: 64 }), fc.integer({ min: 65, max: 70_000 })), { maxLength: 6 }),
          async (key, sizes) => {
            const parts = sizes.map((n) => randomBytes(n))
            const tag = await addon.hmacSha256(key, parts, api)
            assert.strictEqual(tag.length, 32)
            assert.strictEqual(tag.toString("hex"), reference(key, parts))
          }
        ),
        { numRuns: 60 }
      )
    })

    it(`${api}: a multi-MiB payload between small parts, read in place from views of one buffer`, async () => {
      const key = randomBytes(32)
      const backing = randomBytes(5 * MiB + 100)
      const parts = [backing.subarray(0, 14), backing.subarray(14, 14), backing.subarray(14, 50), backing.subarray(100)]
      assert.strictEqual((await addon.hmacSha256(key, parts, api)).toString("hex"), reference(key, parts))
    })
  }

  it("bad arguments are refused before anything is queued, saying what was expected", () => {
    const key = randomBytes(32)
    assert.throws(() => addon.hmacSha256(key, [Buffer.alloc(1), 7 as unknown as Uint8Array]), /hmacSha256: part 1 is not a Uint8Array/)
    assert.throws(() => addon.hmacSha256("k" as unknown as Uint8Array, []), /expected \(key: Uint8Array, parts: Uint8Array\[\], api\?\)/)
    assert.throws(() => addon.hmacSha256(key, [], "md5" as "hmac"), /api must be "evp_mac" or "hmac", got "md5"/)
    assert.strictEqual(addon.hmacInFlight(), 0)
  })
})

describe("HmacSha256 (src/native/Hmac.ts)", () => {
  const secret = createSecretKey(randomBytes(32))
  const parts = [Buffer.from("mpcache l2 v2\0", "latin1"), Buffer.from([0, 0, 0, 3]), Buffer.from("k:1"), Buffer.alloc(32, 7), randomBytes(MiB)]
  const expected = reference(secret.export(), parts)

  it.effect("the default backend is native (EVP_MAC) and gives createHmac's tag; so does HMAC_*", () =>
    Effect.gen(function*() {
      const native = defaultHmacSha256()
      assert.deepInclude(native, { backend: "evp_mac", fallbackReason: "" })
      assert.strictEqual(native.description, "computed on the libuv pool with this Node's OpenSSL (EVP_MAC)")
      assert.strictEqual((yield* native.digest(secret, parts)).toString("hex"), expected)
      const legacy = makeHmacSha256Unsafe({ api: "hmac" })
      assert.deepInclude(legacy, { backend: "hmac", description: "computed on the libuv pool with this Node's OpenSSL (HMAC_*)" })
      assert.strictEqual((yield* legacy.digest(secret, parts)).toString("hex"), expected)
    }))

  it.effect("the fallback (node:crypto on the JS thread), forced by the option or by MPCACHE_NATIVE_HMAC=0, says why and gives the same tag", () =>
    Effect.gen(function*() {
      const off = makeHmacSha256Unsafe({ native: false })
      assert.deepStrictEqual(
        { backend: off.backend, fallbackReason: off.fallbackReason, description: off.description },
        {
          backend: "node:crypto",
          fallbackReason: "turned off by the caller",
          description: "computed on the JS thread with node:crypto (the native HMAC is not used: turned off by the caller)"
        }
      )
      assert.strictEqual((yield* off.digest(secret, parts)).toString("hex"), expected)
      const before = process.env["MPCACHE_NATIVE_HMAC"]
      process.env["MPCACHE_NATIVE_HMAC"] = "0"
      let byEnv: HmacSha256
      try {
        byEnv = makeHmacSha256Unsafe()
      } finally {
        if (before === undefined) delete process.env["MPCACHE_NATIVE_HMAC"]
        else process.env["MPCACHE_NATIVE_HMAC"] = before
      }
      assert.deepInclude(byEnv, { backend: "node:crypto", fallbackReason: "turned off by MPCACHE_NATIVE_HMAC=0" })
      assert.strictEqual((yield* byEnv.digest(secret, parts)).toString("hex"), expected)
      assert.strictEqual(makeHmacSha256Unsafe().backend, "evp_mac")
    }))

  it.effect("the event loop turns while a 64 MiB MAC runs natively; createHmac holds it for the whole MAC", () =>
    Effect.gen(function*() {
      const big = [randomBytes(64 * MiB)]
      const native = yield* turnsWhile(defaultHmacSha256().digest(secret, big))
      const onThread = yield* turnsWhile(makeHmacSha256Unsafe({ native: false }).digest(secret, big))
      assert.strictEqual(native.a.toString("hex"), onThread.a.toString("hex"))
      // Not a speed bound: the native job takes tens of ms of a pool thread, and a loop that is not blocked turns
      // at least once before it settles, however busy the machine; the JS-thread MAC gives it no turn at all.
      assert.isAtLeast(native.turns, 1)
      assert.strictEqual(onThread.turns, 0)
    }))

  it.effect("an interrupt of a MAC in flight waits for the job, so whoever holds its bytes releases them after it", () =>
    Effect.gen(function*() {
      const big = [randomBytes(64 * MiB)]
      let released = -1
      const fiber = yield* Effect.forkChild(
        defaultHmacSha256().digest(secret, big).pipe(Effect.ensuring(Effect.sync(() => (released = addon.hmacInFlight()))))
      )
      for (let turn = 0; addon.hmacInFlight() === 0; turn++) {
        if (turn > 10_000) return assert.fail("the MAC never started")
        yield* Effect.yieldNow
      }
      assert.strictEqual(addon.hmacInFlight(), 1)
      const exit = yield* Fiber.interrupt(fiber).pipe(Effect.andThen(Fiber.await(fiber)))
      assert.isTrue(Exit.hasInterrupts(exit))
      // The finalizer (an L1 unlock, in the tier) ran once the job had settled, not before.
      assert.strictEqual(released, 0)
      assert.strictEqual(addon.hmacInFlight(), 0)
    }))

  it.effect("at most half the libuv pool (UV_THREADPOOL_SIZE, default 4: 2 jobs) hashes at once; the rest wait their turn", () =>
    Effect.gen(function*() {
      const share = Math.max(1, Math.floor(Number(process.env["UV_THREADPOOL_SIZE"] ?? "4") / 2))
      const hmac = makeHmacSha256Unsafe()
      const each = [randomBytes(16 * MiB)]
      let most = 0
      const fibers = yield* Effect.forEach(Array.from({ length: share + 3 }), () => Effect.forkChild(hmac.digest(secret, each)))
      const all = Fiber.joinAll(fibers)
      const watching = yield* Effect.forkChild(
        Effect.gen(function*() {
          for (;;) {
            most = Math.max(most, addon.hmacInFlight())
            yield* Effect.yieldNow
          }
        })
      )
      const tags = yield* all
      yield* Fiber.interrupt(watching)
      assert.strictEqual(most, share)
      assert.strictEqual(new Set(tags.map((t) => t.toString("hex"))).size, 1)
      assert.strictEqual(addon.hmacInFlight(), 0)
    }))
})
