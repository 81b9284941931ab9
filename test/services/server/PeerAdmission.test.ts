import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import type { BoundRouter } from "../../../src/services/zmq/Sockets.ts"
import { makePeerAdmission } from "../../../src/services/server/internal/PeerAdmission.ts"
import { generatedCounterOf, generatedRoutingId, makeRoutingIdCounter } from "../../../src/services/zmq/RoutingIds.ts"

/** A BoundRouter whose probes and kicks are recorded, not sent. */
const fakeRouter = (first: number) => {
  const probes: Array<Buffer> = []
  const kicked: Array<string> = []
  const router = {
    socket: undefined as never,
    firstGeneratedId: first,
    openProbe: (marker: Buffer) => {
      probes.push(marker)
      return { close: () => undefined }
    },
    kick: (id: Buffer) => void kicked.push(id.toString("hex"))
  } satisfies BoundRouter
  return { router, probes, kicked }
}

describe("RoutingIds (issue 24 item 1)", () => {
  it("generatedCounterOf reads a zero byte and a 32-bit counter, nothing else", () => {
    assert.strictEqual(generatedCounterOf(generatedRoutingId(0xfffffffe)), 0xfffffffe)
    assert.strictEqual(generatedCounterOf(Buffer.from([1, 0, 0, 0, 1])), undefined)
    assert.strictEqual(generatedCounterOf(Buffer.from([0, 0, 0, 1])), undefined)
    assert.strictEqual(generatedCounterOf(Buffer.from("worker-1")), undefined)
  })

  it("the counter's verdicts across a wrap of 2^32: passed ids are generated, later ones verified, a probe decides", () => {
    const c = makeRoutingIdCounter(0xfffffff0)
    assert.deepStrictEqual([c.judge(generatedRoutingId(0xfffffff0)), c.judge(generatedRoutingId(0xfffffff1)), c.judge(Buffer.from("x"))], ["generated", "verify", "chosen"])
    // The probe came back as 0x00000004 (20 past the first, across the wrap).
    const before = c.probed(generatedRoutingId(4))
    assert.deepStrictEqual([before(generatedRoutingId(0xfffffff5)), before(generatedRoutingId(3)), before(generatedRoutingId(4)), before(generatedRoutingId(5)), before(generatedRoutingId(0xffffffef))], [true, true, false, false, false])
    assert.deepStrictEqual([c.judge(generatedRoutingId(3)), c.judge(generatedRoutingId(4)), c.judge(generatedRoutingId(5))], ["generated", "generated", "verify"])
  })
})

describe("PeerAdmission (issue 24 item 1)", () => {
  it.effect("a peer past the known counter is held until a probe: admitted with its messages in order, or kicked", () =>
    Effect.scoped(Effect.gen(function*() {
      const { router, probes, kicked } = fakeRouter(100)
      const handled: Array<string> = []
      const admission = yield* makePeerAdmission(router, (m) => Effect.sync(() => void handled.push(`${m[0]!.toString("hex")}:${m[1]!.toString()}`)), () => Effect.void)
      const legit = generatedRoutingId(101)
      const attacker = generatedRoutingId(5000)
      for (const [id, frame] of [[legit, "a"], [attacker, "x"], [legit, "b"]] as const) {
        assert.isFalse(yield* admission.admit([id, Buffer.from(frame)], id.toString("hex")))
      }
      assert.strictEqual(probes.length, 1)
      assert.deepStrictEqual(admission.stats(), { refused: { chosen: 0, ahead: 0 }, verifying: 2 })
      // The probe comes back as generated id 102: 101 was generated before it; 5000, first seen after the probe was
      // out, waits for the next probe (103), and was not generated before it either.
      assert.isFalse(yield* admission.admit([generatedRoutingId(102), probes[0]!], generatedRoutingId(102).toString("hex")))
      assert.deepStrictEqual(handled, [`${legit.toString("hex")}:a`, `${legit.toString("hex")}:b`])
      assert.deepStrictEqual([kicked, probes.length], [[], 2])
      assert.isFalse(yield* admission.admit([generatedRoutingId(103), probes[1]!], generatedRoutingId(103).toString("hex")))
      assert.deepStrictEqual(kicked, [attacker.toString("hex")])
      assert.deepStrictEqual(admission.stats(), { refused: { chosen: 0, ahead: 1 }, verifying: 0 })
      assert.isTrue(admission.isServed(legit))
      assert.isTrue(yield* admission.admit([legit, Buffer.from("c")], legit.toString("hex")))
      assert.isFalse(admission.isServed(attacker))
    })))

  it.effect("a peer first seen while a probe is out waits for the next probe (its id may be newer than that probe's)", () =>
    Effect.scoped(Effect.gen(function*() {
      const { router, probes } = fakeRouter(100)
      const admission = yield* makePeerAdmission(router, () => Effect.void, () => Effect.void)
      yield* admission.admit([generatedRoutingId(101), Buffer.from("a")], generatedRoutingId(101).toString("hex"))
      yield* admission.admit([generatedRoutingId(103), Buffer.from("a")], generatedRoutingId(103).toString("hex"))
      assert.strictEqual(probes.length, 1)
      yield* admission.admit([generatedRoutingId(102), probes[0]!], generatedRoutingId(102).toString("hex"))
      // 101 decided; 103 (seen after probe 1 was out) goes to probe 2, which is 104.
      assert.deepStrictEqual([admission.isServed(generatedRoutingId(101)), admission.isServed(generatedRoutingId(103)), probes.length], [true, false, 2])
      yield* admission.admit([generatedRoutingId(104), probes[1]!], generatedRoutingId(104).toString("hex"))
      assert.deepStrictEqual([admission.isServed(generatedRoutingId(103)), admission.stats().verifying], [true, 0])
    })))

  it.effect("a chosen id is refused: its requests answered, never handled, counted once; forgotten at its disconnect", () =>
    Effect.scoped(Effect.gen(function*() {
      const { router, kicked } = fakeRouter(100)
      const answered: Array<string> = []
      const handled: Array<string> = []
      const admission = yield* makePeerAdmission(router, (m) => Effect.sync(() => void handled.push(m[1]!.toString())), (_id, uid) => Effect.sync(() => void answered.push(uid.toString())))
      const id = Buffer.from("worker-1")
      const peer = id.toString("hex")
      assert.isFalse(yield* admission.admit([id, Buffer.alloc(0)], peer))
      assert.isFalse(yield* admission.admit([id, Buffer.from("1"), Buffer.from("op")], peer))
      assert.isFalse(yield* admission.admit([id, Buffer.from("2"), Buffer.from("op")], peer))
      assert.deepStrictEqual([answered, handled, kicked], [["1", "2"], [], []])
      assert.deepStrictEqual(admission.stats().refused, { chosen: 1, ahead: 0 })
      admission.forget(id, peer)
      yield* admission.admit([id, Buffer.from("3"), Buffer.from("op")], peer)
      assert.deepStrictEqual(admission.stats().refused, { chosen: 2, ahead: 0 })
    })))
})
