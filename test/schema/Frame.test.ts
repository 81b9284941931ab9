import { assert, describe, it } from "@effect/vitest"
import { Arbitrary, Cause, Exit, Schema } from "effect"
import fc from "fast-check"
import { CacheKey, CacheKeyFields } from "../../src/schema/CacheKey.ts"
import {
  decodeHeaderInt,
  decodeInstanceIdFrame,
  decodePayload,
  decodeReplyHeader,
  decodeResponse,
  encodeErrorReply,
  encodeReply,
  encodeRequest,
  ERROR_MARKER,
  pack,
  unpack
} from "../../src/schema/Frame.ts"
import { makeInstanceId, MAX_INSTANCE_ID } from "../../src/schema/InstanceId.ts"
import { OPS, Ping, RegisterKvCache, Store, type Op } from "../../src/schema/Op.ts"
import { describeValue } from "../../src/schema/ValueDescription.ts"
import { BadRequest, detailOf, errorBodyOf, NotRegistered } from "../../src/schema/WireError.ts"
import { referenceBomb } from "../support/MsgpackBomb.ts"

const Uid = Schema.Int.check(Schema.isBetween({ minimum: 0, maximum: Number.MAX_SAFE_INTEGER }))

/**
 * CacheKeys whose range lies inside their tokens and whose worker_id is below their world size (the
 * Schema's rules, which random generation rarely meets).
 */
const cacheKeyArbitrary = Arbitrary.schema(Schema.Struct(CacheKeyFields)).pipe(
  Arbitrary.map((k) => {
    const n = k.token_ids.length
    const a = Math.min(k.start, n)
    const b = Math.min(k.end, n)
    return { ...k, start: Math.min(a, b), end: Math.max(a, b), worker_id: k.worker_id === null ? null : k.worker_id % k.world_size }
  })
)

const payloadArbitrary = (op: Op): Arbitrary.Arbitrary<ReadonlyArray<unknown>> =>
  Arbitrary.all(op.payload.map(([, s]) => s === CacheKey ? cacheKeyArbitrary : Arbitrary.schema(s)))

const roundTripRequest = (op: Op, uid: number, payload: ReadonlyArray<unknown>) => {
  const frames = encodeRequest(op, uid, payload as never)
  assert.isTrue(Exit.isSuccess(frames), `${op.name} encodes`)
  if (Exit.isFailure(frames)) return
  assert.strictEqual(decodeHeaderInt(frames.value[0]!), uid)
  assert.strictEqual(decodeHeaderInt(frames.value[1]!), op.id)
  const decoded = decodePayload(op, frames.value.slice(2))
  assert.isTrue(Exit.isSuccess(decoded), `${op.name} decodes`)
  if (Exit.isSuccess(decoded)) assert.deepStrictEqual(decoded.value, payload)
}

describe("request frames", () => {
  for (const op of OPS) {
    it.prop(`${op.name} (${op.id}) round-trips every payload`, [Uid, payloadArbitrary(op)], ([uid, payload]) => {
      roundTripRequest(op, uid, payload)
    }, { arbitrary: { runs: 100 } })
  }

  it("instance ids 0, 2^53+1 and 2^63-1 round-trip exactly as bigint", () => {
    for (const id of [0n, (1n << 53n) + 1n, MAX_INSTANCE_ID]) {
      roundTripRequest(Ping, 7, [makeInstanceId(id)])
    }
  })

  it("an instance id sent as a small plain int (another stack) decodes to bigint", () => {
    const decoded = decodePayload(Ping, [pack(42)])
    assert.deepStrictEqual(decoded, Exit.succeed([makeInstanceId(42n)] as const))
  })

  it("an id of 2^63 or a negative id is a bad_request naming the field", () => {
    for (const bad of [1n << 63n, -1]) {
      const decoded = decodePayload(Ping, [pack(bad)])
      assert.isTrue(Exit.isFailure(decoded))
      if (Exit.isFailure(decoded)) {
        const msg = String(Exit.isFailure(decoded) && (decoded.cause.reasons[0] as { error: BadRequest }).error.message)
        assert.include(msg, "ping: payload 0 (instance_id)")
        assert.include(msg, "Expected a value between 0n and 9223372036854775807n")
      }
    }
  })

  it("a wrong payload count names the op, the expected and the actual count", () => {
    const decoded = decodePayload(Store, [pack(1)])
    assert.deepStrictEqual(
      decoded,
      Exit.fail(new BadRequest({ message: "store: expected 4 payload frame(s) (key, instance_id, block_ids, event_handle), got 1" }))
    )
  })

  it("the client refuses to send a payload of the wrong length and says the versions differ", () => {
    const frames = encodeRequest(Ping, 1, [] as never)
    assert.deepStrictEqual(
      frames,
      Exit.fail(new BadRequest({
        message: "ping: this client sends 0 payload frame(s) but the protocol defines 1 (instance_id); the client and server versions differ"
      }))
    )
  })

  it("header ints: non-negative MessagePack ints only", () => {
    assert.strictEqual(decodeHeaderInt(pack(0)), 0)
    assert.strictEqual(decodeHeaderInt(pack(2 ** 40)), 2 ** 40)
    assert.strictEqual(decodeHeaderInt(pack(5n)), 5)
    assert.strictEqual(decodeHeaderInt(pack(-1)), undefined)
    assert.strictEqual(decodeHeaderInt(pack("22")), undefined)
    assert.strictEqual(decodeHeaderInt(pack(1.5)), undefined)
    assert.strictEqual(decodeHeaderInt(Buffer.from([0xc1])), undefined)
    assert.strictEqual(decodeHeaderInt(Buffer.from([0x01, 0x02])), undefined)
    assert.strictEqual(decodeHeaderInt(Buffer.alloc(0)), undefined)
  })

  it("instance id frames (the fast path's in-place reading): every id it reads is the one PING's Schema decodes", () => {
    /** What PING's own decoding makes of `frame`: the id, or undefined for nil and errors. */
    const bySchema = (frame: Uint8Array) => {
      const decoded = decodePayload(Ping, [frame])
      return Exit.isSuccess(decoded) ? decoded.value[0] ?? undefined : undefined
    }
    const u64 = (b0: number, n: bigint) => {
      const frame = Buffer.alloc(9)
      frame[0] = b0
      frame.writeBigUInt64BE(n, 1)
      return frame
    }
    const cases: ReadonlyArray<readonly [string, Uint8Array, bigint | undefined]> = [
      ["fixint 0", pack(0), 0n],
      ["fixint 127", Buffer.from([0x7f]), 127n],
      ["uint8", Buffer.from([0xcc, 0xff]), 255n],
      ["uint16", Buffer.from([0xcd, 0xbe, 0xef]), 0xbeefn],
      ["uint32", Buffer.from([0xce, 0xff, 0xff, 0xff, 0xff]), 0xffffffffn],
      ["uint64 (other stacks' large ids)", u64(0xcf, MAX_INSTANCE_ID), MAX_INSTANCE_ID],
      ["int64 (msgpackr's bigint)", pack(MAX_INSTANCE_ID), MAX_INSTANCE_ID],
      ["int64 small", u64(0xd3, 5n), 5n],
      ["uint64 2^63 (out of range)", u64(0xcf, 1n << 63n), undefined],
      ["int64 −1", pack(-1n), undefined],
      ["nil", pack(null), undefined],
      ["float", pack(1.5), undefined],
      ["string", pack("42"), undefined],
      ["a truncated uint64", u64(0xcf, 5n).subarray(0, 8), undefined],
      ["two values in one frame", Buffer.from([0x01, 0x02]), undefined],
      ["empty", Buffer.alloc(0), undefined]
    ]
    for (const [what, frame, expected] of cases) {
      assert.strictEqual(decodeInstanceIdFrame(frame), expected, what)
      // Where it reads an id, the Schema reads the same one; where it declines, the pooled path decides.
      if (expected !== undefined) assert.strictEqual(bySchema(frame), expected, `${what} (Schema)`)
    }
    // The signed 8/16/32-bit formats are valid ids the in-place reading leaves to the Schema.
    assert.strictEqual(decodeInstanceIdFrame(Buffer.from([0xd0, 0x05])), undefined)
    assert.strictEqual(bySchema(Buffer.from([0xd0, 0x05])), 5n)
  })

  it("header ints: the in-place reading of uint 8/16/32 agrees with MessagePack for every width", () => {
    const cases: ReadonlyArray<readonly [Array<number>, number | undefined]> = [
      [[0x7f], 127],
      [[0x80], undefined], // fixmap, not an int
      [[0xcc, 0xff], 255],
      [[0xcd, 0x12, 0x34], 0x1234],
      [[0xce, 0xff, 0xff, 0xff, 0xff], 2 ** 32 - 1],
      [[0xce, 0x80, 0x00, 0x00, 0x01], 2 ** 31 + 1],
      [[0xd0, 0x05], 5], // int 8 holding a non-negative value
      [[0xd0, 0xff], undefined], // int 8 -1
      [[0xcc, 0x05, 0x00], undefined], // trailing byte: not exactly one value
      [[0xcd, 0x01], undefined] // truncated
    ]
    for (const [bytes, expected] of cases) assert.strictEqual(decodeHeaderInt(Buffer.from(bytes)), expected, `${bytes}`)
    fc.assert(fc.property(fc.integer({ min: 0, max: 2 ** 32 - 1 }), (n) => decodeHeaderInt(pack(n)) === n))
  })
})

describe("reply frames", () => {
  it("a primitive response reuses its frame only for the same value", () => {
    const first = encodeReply(Ping, pack(1), pack(Ping.id), true)
    const second = encodeReply(Ping, pack(2), pack(Ping.id), true)
    assert.isTrue(Exit.isSuccess(first) && Exit.isSuccess(second))
    if (Exit.isSuccess(first) && Exit.isSuccess(second)) {
      assert.strictEqual(second.value[2], first.value[2])
      assert.deepStrictEqual(unpack(second.value[0]!)?.value, 2)
      assert.deepStrictEqual(unpack(second.value[2]!)?.value, true)
    }
    const wrong = encodeReply(Ping, pack(3), pack(Ping.id), false as never)
    assert.isTrue(Exit.isFailure(wrong), "a response outside the op's schema is refused even after a memoized one")
  })

  for (const op of OPS) {
    if (op.response === undefined) {
      it(`${op.name} (${op.id}) replies [uid, op] with no response frame`, () => {
        const reply = encodeReply(op, pack(3), pack(op.id), undefined as never)
        assert.isTrue(Exit.isSuccess(reply))
        if (Exit.isFailure(reply)) return
        assert.strictEqual(reply.value.length, 2)
        const header = decodeReplyHeader(reply.value)
        assert.deepStrictEqual(header, { _tag: "Ok", uid: 3, opId: op.id, body: [] })
        assert.isTrue(Exit.isSuccess(decodeResponse(op, [])))
      })
    } else {
      const response = op.response
      it.prop(`${op.name} (${op.id}) round-trips every response`, [Uid, response], ([uid, value]) => {
        const reply = encodeReply(op, pack(uid), pack(op.id), value as never)
        assert.isTrue(Exit.isSuccess(reply))
        if (Exit.isFailure(reply)) return
        const header = decodeReplyHeader(reply.value)
        assert.isDefined(header)
        if (header === undefined || header._tag !== "Ok") return assert.fail("not an ok reply")
        assert.strictEqual(header.uid, uid)
        assert.strictEqual(header.opId, op.id)
        assert.deepStrictEqual(decodeResponse(op, header.body) as Exit.Exit<unknown, BadRequest>, Exit.succeed(value))
      }, { arbitrary: { runs: 100 } })
    }
  }

  it("error replies carry the raw marker and {code, message}", () => {
    const frames = encodeErrorReply(pack(9), pack(6), new NotRegistered({ message: "store: instance 5 is not registered" }))
    assert.strictEqual(frames.length, 4)
    assert.isTrue(Buffer.from(frames[2]!).equals(Buffer.from("MPCACHE_ERR", "ascii")))
    assert.isTrue(Buffer.from(frames[2]!).equals(ERROR_MARKER))
    const header = decodeReplyHeader(frames)
    assert.deepStrictEqual(header, {
      _tag: "Error",
      uid: 9,
      opId: 6,
      error: new NotRegistered({ message: "store: instance 5 is not registered" })
    })
  })

  it("errors are data: a decode failure names op, field, expected and actual as keys, and the client rebuilds them", () => {
    const decoded = decodePayload(Ping, [pack(-1)])
    assert.isTrue(Exit.isFailure(decoded))
    const error = Cause.squash((decoded as Exit.Failure<unknown, BadRequest>).cause) as BadRequest
    assert.deepStrictEqual(detailOf(error), {
      op: "ping",
      field: "payload 0 (instance_id)",
      expected: error.expected!,
      actual: "-1"
    })
    assert.strictEqual(error.message, `ping: payload 0 (instance_id): ${error.expected}; actual: -1`)
    const count = decodePayload(Store, [pack(1)])
    const countError = Cause.squash((count as Exit.Failure<unknown, BadRequest>).cause) as BadRequest
    assert.deepStrictEqual(detailOf(countError), {
      op: "store",
      field: "payload",
      expected: "4 payload frame(s) (key, instance_id, block_ids, event_handle)",
      actual: "1"
    })
    // On the wire: the detail keys beside code and message; the client's error has the same fields.
    const frames = encodeErrorReply(pack(3), pack(Store.id), countError)
    assert.deepStrictEqual(unpack(frames[3]!)?.value, {
      code: "bad_request",
      message: "store: expected 4 payload frame(s) (key, instance_id, block_ids, event_handle), got 1",
      op: "store",
      field: "payload",
      expected: "4 payload frame(s) (key, instance_id, block_ids, event_handle)",
      actual: "1"
    })
    const header = decodeReplyHeader(frames)
    assert.strictEqual(header?._tag, "Error")
    if (header?._tag !== "Error") return
    assert.deepStrictEqual(errorBodyOf(header.error), errorBodyOf(countError))
    // A body from a server that sends no detail still decodes.
    const bare = decodeReplyHeader([pack(3), pack(Store.id), ERROR_MARKER, pack({ code: "not_registered", message: "m" })])
    assert.deepStrictEqual(bare?._tag === "Error" ? errorBodyOf(bare.error) : undefined, { code: "not_registered", message: "m" })
  })
})

/** The BadRequest a failed decode carries. */
const badRequestOf = (exit: Exit.Exit<unknown, BadRequest>): BadRequest => {
  if (Exit.isSuccess(exit)) return assert.fail("decoded")
  return Cause.squash(exit.cause) as BadRequest
}

const NOT_PLAIN_BOMB = {
  expected: "plain MessagePack (the protocol defines no extension types)",
  actual: "an ext value of type 0x69 (msgpackr's structured-clone id) at byte 0"
}

describe("frames that are not plain MessagePack (issue 24 item 3)", () => {
  for (const op of OPS.filter((o) => o.payload.length > 0)) {
    const [name] = op.payload[0]!
    it(`${op.name}: a reference bomb in payload 0 (${name}) is a bad_request naming the frame, the ext by type and offset`, () => {
      const frames = [referenceBomb(26, true), ...op.payload.slice(1).map(() => pack(0))]
      const error = badRequestOf(decodePayload(op, frames))
      const field = `payload 0 (${name})`
      assert.deepStrictEqual(detailOf(error), { op: op.name, field, ...NOT_PLAIN_BOMB })
      assert.strictEqual(
        error.message,
        `${op.name}: ${field} is not a single plain MessagePack value: ${NOT_PLAIN_BOMB.actual}; expected ${NOT_PLAIN_BOMB.expected}`
      )
    })
  }

  for (const op of OPS.filter((o) => o.response !== undefined)) {
    it(`${op.name}: a response frame holding a reference bomb is refused by the client the same way`, () => {
      const error = badRequestOf(decodeResponse(op, [referenceBomb(26, false)]) as Exit.Exit<unknown, BadRequest>)
      assert.deepStrictEqual(detailOf(error), { op: op.name, field: "response", ...NOT_PLAIN_BOMB })
    })
  }

  it("a uid or op frame holding an ext is not a header int, and an error body holding one is not an error reply", () => {
    assert.strictEqual(decodeHeaderInt(Buffer.from([0xd4, 0x00, 0x00])), undefined)
    assert.strictEqual(decodeReplyHeader([pack(1), pack(22), ERROR_MARKER, referenceBomb(20, false)]), undefined)
  })
})

describe("a bad value is described by type and size, never serialised (issue 24 item 3)", () => {
  it("describeValue: scalars as themselves, everything else by type and size", () => {
    const cases: ReadonlyArray<readonly [unknown, string]> = [
      [-1, "-1"],
      [-0, "-0"],
      [1.5, "1.5"],
      [Number.NaN, "NaN"],
      [5n, "5n"],
      [true, "true"],
      [null, "nil"],
      [undefined, "undefined"],
      ["NHD", "\"NHD\""],
      ["a\nb", "\"a\\nb\""],
      ["x".repeat(32), JSON.stringify("x".repeat(32))],
      ["x".repeat(33), "a string of 33 characters"],
      ["x".repeat(1_048_576), "a string of 1,048,576 characters"],
      [new Uint8Array(1), "a bin of 1 byte"],
      [Buffer.alloc(4096), "a bin of 4,096 bytes"],
      [[], "an array of 0 elements"],
      [[[1]], "an array of 1 element"],
      [new Array<number>(4096).fill(7), "an array of 4,096 elements"],
      [{ a: 1, b: [2], c: { d: 3 } }, "a map of 3 keys"],
      [{ k: 1 }, "a map of 1 key"],
      [new Date(0), "an object (Date)"]
    ]
    for (const [value, expected] of cases) assert.strictEqual(describeValue(value), expected)
  })

  it("a Schema failure on a 100,000-element array names it by size; Effect's message names only the expectation", () => {
    const error = badRequestOf(decodePayload(Ping, [pack(new Array<number>(100_000).fill(1))]))
    assert.strictEqual(error.actual, "an array of 100,000 elements")
    assert.notInclude(error.expected!, "1,1")
    assert.strictEqual(error.message, `ping: payload 0 (instance_id): ${error.expected}; actual: an array of 100,000 elements`)
  })

  it("a Schema path quoting a 100,000-character map key is clipped to 300 characters", () => {
    const key = "k".repeat(100_000)
    const frames = [pack(1), pack([]), pack("m"), pack(1), pack("vllm"), pack({ [key]: { nested: true } }), pack([])]
    const error = badRequestOf(decodePayload(RegisterKvCache, frames))
    assert.strictEqual(error.field, "payload 5 (layout_hints)")
    assert.strictEqual(error.actual, "a map of 1 key")
    assert.strictEqual(error.expected!.length, 300)
    assert.isTrue(error.expected!.endsWith("..."))
    assert.isBelow(error.message.length, 400)
  })
})
