/**
 * Blend over real sockets, real shared-memory KV caches and real cos/sin
 * tables in shared memory: chunks stored by one worker with STORE are
 * placed by CB_RETRIEVE_PRE_COMPUTED at shifted positions in another
 * worker's blocks — K re-rotated (checked against a float64 reference to
 * within 1 ulp), V byte for byte, every other position untouched — and the
 * failure rows, after each of which the server keeps serving.
 * The whole suite runs with CURVE off and on (test/support/CurveMode.ts, issue 14).
 */
import { randomUUID } from "node:crypto"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import type { CacheKey } from "../../src/schema/CacheKey.ts"
import type { CbMatch } from "../../src/schema/CbMatch.ts"
import type { Dtype } from "../../src/schema/Dtype.ts"
import { makeInstanceId } from "../../src/schema/InstanceId.ts"
import {
  CbRegisterRope,
  CbRetrievePreComputed,
  CbUnregisterRope,
  Noop,
  PingRegistered,
  RegisterKvCache,
  Store
} from "../../src/schema/Op.ts"
import { InvalidArgument, NotRegistered } from "../../src/schema/WireError.ts"
import { Blend } from "../../src/services/server/Blend.ts"
import { MqClient } from "../../src/services/client/MqClient.ts"
import { makePagedKvCache, type PagedKvCache } from "../../src/services/client/PagedKvCache.ts"
import { chunkHashes } from "../../src/services/kv/TokenHasher.ts"
import {
  encodeAll,
  gaussian,
  makeTableSegment,
  referenceRotate,
  type TestDtype,
  worstUlp
} from "../support/RopeReference.ts"
import { CURVE_MODES, curveFixture } from "../support/CurveMode.ts"
import { testServer } from "../support/TestServer.ts"

const CHUNK = 32
const BLOCK = 16
const NUM_LAYERS = 2
const NUM_HEADS = 2
const HEAD = 16
/** Positions of the stored request: 4 chunks. */
const TOKENS = 128
const tokens = Array.from({ length: TOKENS }, (_, i) => (i * 31 + 11) % 30000)
const hashes = chunkHashes(tokens, CHUNK)
const EVENT = new Uint8Array([7, 7])
const TABLE_ROWS = 256

const key = (over: Partial<CacheKey> = {}): CacheKey => ({
  model_name: "blend-model",
  world_size: 1,
  worker_id: 0,
  token_ids: tokens,
  start: 0,
  end: TOKENS,
  request_id: "cb-1",
  cache_salt: "",
  ...over
})

const newCache = (dtype: Dtype) =>
  makePagedKvCache({ backing: "cpu_shm", namePrefix: `mpcache-test-${randomUUID()}`, numLayers: NUM_LAYERS, numBlocks: 64, blockSizeTokens: BLOCK, numHeads: NUM_HEADS, headSize: HEAD, dtype })

const tokenBytes = (cache: PagedKvCache) => cache.geometry.blockBytes / BLOCK

/** Writes `data` (tokens in position order) into `blocks` of `layer`'s K or V. */
const writePositions = (cache: PagedKvCache, blocks: ReadonlyArray<number>, layer: number, kv: 0 | 1, data: Uint8Array) =>
  Effect.forEach(blocks, (b, j) => cache.writeBlock(layer, kv, b, data.subarray(j * cache.geometry.blockBytes, (j + 1) * cache.geometry.blockBytes)), {
    discard: true
  })

/** Reads `layer`'s K or V of `blocks` as tokens in position order. */
const readPositions = (cache: PagedKvCache, blocks: ReadonlyArray<number>, layer: number, kv: 0 | 1) =>
  Effect.map(Effect.forEach(blocks, (b) => cache.readBlock(layer, kv, b)), (parts) => new Uint8Array(Buffer.concat(parts)))

const id = (n: number) => makeInstanceId(BigInt(n))

const registerKv = (n: number, cache: PagedKvCache) =>
  Effect.gen(function*() {
    const client = yield* MqClient
    yield* client.request(RegisterKvCache, [id(n), cache.descriptors, "blend-model", 1, "vllm", {}, []])
  })

/**
 * One world: worker 1 stores 4 chunks of random K/V; worker 2 registers its
 * own KV cache (filled with a sentinel) and a cos/sin table. Returns what
 * the checks need.
 */
const setup = (dtype: TestDtype, isNeoxStyle: boolean) =>
  Effect.gen(function*() {
    const client = yield* MqClient
    const a = yield* newCache(dtype)
    const b = yield* newCache(dtype)
    yield* registerKv(1, a)
    yield* registerKv(2, b)
    const blocksA = [1, 2, 3, 4, 5, 6, 7, 8]
    const blocksB = [50, 12, 33, 7, 60, 21, 2, 45]
    const next = gaussian(dtype === "float16" ? 11 : 22, 3)
    /** source[layer][kv]: tokens 0…127 of worker 1, position order. */
    const source: Array<[Uint8Array, Uint8Array]> = []
    for (let l = 0; l < NUM_LAYERS; l++) {
      const kv = [0, 1].map(() => encodeAll(dtype, Array.from({ length: TOKENS * NUM_HEADS * HEAD }, next))) as [Uint8Array, Uint8Array]
      source.push(kv)
      yield* writePositions(a, blocksA, l, 0, kv[0])
      yield* writePositions(a, blocksA, l, 1, kv[1])
    }
    const sentinel = new Uint8Array(TOKENS * tokenBytes(b)).fill(0xab)
    for (let l = 0; l < NUM_LAYERS; l++) for (const kv of [0, 1] as const) yield* writePositions(b, blocksB, l, kv, sentinel)
    assert.deepStrictEqual(yield* client.request(Store, [key(), id(1), [blocksA], EVENT]), [EVENT, true])
    const table = yield* makeTableSegment(TABLE_ROWS, HEAD, 16)
    yield* client.request(CbRegisterRope, [id(2), [table], HEAD, isNeoxStyle, [0], [null]])
    return { a, b, blocksB, source, table, sentinel }
  })

/** Checks worker 2's blocks after the matches were applied: K within 1 ulp, V exact, the rest the sentinel. */
const verify = (
  dtype: TestDtype,
  isNeoxStyle: boolean,
  world: Effect.Success<ReturnType<typeof setup>>,
  matches: ReadonlyArray<CbMatch>
) =>
  Effect.gen(function*() {
    const { b, blocksB, source, sentinel } = world
    const tb = tokenBytes(b)
    const spec = { dtype, numHeads: NUM_HEADS, headSize: HEAD, rotaryOffset: 0, rotaryDim: HEAD, isNeoxStyle }
    for (let l = 0; l < NUM_LAYERS; l++) {
      const k = yield* readPositions(b, blocksB, l, 0)
      const v = yield* readPositions(b, blocksB, l, 1)
      const covered = new Array<boolean>(TOKENS).fill(false)
      for (const m of matches) {
        const n = m.old_ed - m.old_st
        const delta = m.cur_st - m.old_st
        const old = (kv: 0 | 1) => source[l]![kv].subarray(m.old_st * tb, m.old_ed * tb)
        const cur = (data: Uint8Array) => data.subarray(m.cur_st * tb, m.cur_ed * tb)
        assert.deepStrictEqual(cur(v), old(1), `layer ${l}: V of [${m.cur_st}, ${m.cur_ed}) is byte-equal`)
        if (delta === 0) {
          assert.deepStrictEqual(cur(k), old(0), `layer ${l}: K of a zero shift is byte-equal`)
        } else {
          const worst = worstUlp(dtype, cur(k), referenceRotate(spec, old(0), n, delta))
          assert.isAtMost(worst.ulps, 1, `layer ${l} Δ=${delta}: K ${worst.ulps} ulps off at element ${worst.at}`)
          assert.notDeepEqual(cur(k), old(0))
        }
        for (let p = m.cur_st; p < m.cur_ed; p++) covered[p] = true
      }
      for (let p = 0; p < TOKENS; p++) {
        if (covered[p]) continue
        assert.deepStrictEqual(k.subarray(p * tb, (p + 1) * tb), sentinel.subarray(0, tb), `layer ${l}: K at ${p} untouched`)
        assert.deepStrictEqual(v.subarray(p * tb, (p + 1) * tb), sentinel.subarray(0, tb), `layer ${l}: V at ${p} untouched`)
      }
    }
  })

const match = (old_st: number, old_ed: number, cur_st: number): CbMatch => ({
  old_st,
  old_ed,
  cur_st,
  cur_ed: cur_st + old_ed - old_st,
  hash: hashes[Math.floor(old_st / CHUNK)]!
})

/** Shifts forward, backward, none; part of a chunk and a whole one; across block boundaries. */
const MATCHES: ReadonlyArray<CbMatch> = [
  match(40, 64, 100), // chunk 1 tokens 8…31 → Δ = +60
  match(0, 20, 3), // chunk 0 → Δ = +3
  match(96, 128, 30), // all of chunk 3 → Δ = −66
  match(64, 70, 64), // chunk 2, Δ = 0
  match(70, 75, 90) // chunk 2 again, Δ = +20
]

describe.each(CURVE_MODES)("CacheBlend over real sockets (CURVE $curve)", ({ curve }) => {
  const fx = curveFixture(curve)

  const env = () => testServer({ curve: fx, config: { chunkSize: CHUNK } })

  describe("CB_RETRIEVE_PRE_COMPUTED over real sockets", () => {
    for (const [dtype, isNeoxStyle] of [["float16", true], ["bfloat16", false], ["float16", false], ["bfloat16", true]] as const) {
      it.live(`${dtype}, ${isNeoxStyle ? "neox" : "GPT-J"}: stored chunks land at the shifted positions, K re-rotated, V byte-equal, nothing else written`, () =>
        Effect.gen(function*() {
          const client = yield* MqClient
          const world = yield* setup(dtype, isNeoxStyle)
          const reply = yield* client.request(CbRetrievePreComputed, [key({ token_ids: [], end: 0 }), MATCHES, [world.blocksB], id(2), EVENT])
          assert.deepStrictEqual(reply, [EVENT, true])
          yield* verify(dtype, isNeoxStyle, world, MATCHES)
          assert.deepStrictEqual(yield* client.request(PingRegistered, [id(2), ["kv_cache", "cb_rope"]]), [])
          assert.deepStrictEqual(yield* (yield* Blend).status(), { blend: { rope_instances: ["2"] } })
        }).pipe(Effect.scoped, Effect.provide(env())))
    }

    it.live("a retrieve large enough to yield to the event loop mid-rotation (over 2^18 K pairs) is still exact", () =>
      Effect.gen(function*() {
        const client = yield* MqClient
        // One 256-token chunk of 3 layers × 8 heads × 128 dims: 131,072 pairs per layer, so the rotation yields after layer 2.
        const geometry = { numLayers: 3, numBlocks: 40, blockSizeTokens: 16, numHeads: 8, headSize: 128, dtype: "float16" as const }
        const a = yield* makePagedKvCache({ backing: "cpu_shm", namePrefix: `mpcache-test-${randomUUID()}`, ...geometry })
        const b = yield* makePagedKvCache({ backing: "cpu_shm", namePrefix: `mpcache-test-${randomUUID()}`, ...geometry })
        yield* client.request(RegisterKvCache, [id(1), a.descriptors, "big", 1, "vllm", {}, []])
        yield* client.request(RegisterKvCache, [id(2), b.descriptors, "big", 1, "vllm", {}, []])
        const bigTokens = Array.from({ length: 256 }, (_, i) => i + 1)
        const bigKey = key({ model_name: "big", token_ids: bigTokens, end: 256 })
        const blocksA = Array.from({ length: 16 }, (_, i) => i)
        const blocksB = Array.from({ length: 32 }, (_, i) => 39 - i)
        const next = gaussian(5, 2)
        const source = Array.from({ length: 3 }, () => encodeAll("float16", Array.from({ length: 256 * 8 * 128 }, next)))
        for (let l = 0; l < 3; l++) {
          yield* writePositions(a, blocksA, l, 0, source[l]!)
          yield* writePositions(a, blocksA, l, 1, source[l]!)
        }
        assert.deepStrictEqual(yield* client.request(Store, [bigKey, id(1), [blocksA], EVENT]), [EVENT, true])
        const table = yield* makeTableSegment(512, 128)
        yield* client.request(CbRegisterRope, [id(2), [table], 128, true, [], []])
        const m: CbMatch = { old_st: 0, old_ed: 256, cur_st: 256, cur_ed: 512, hash: chunkHashes(bigTokens, 256)[0]! }
        assert.deepStrictEqual(yield* client.request(CbRetrievePreComputed, [bigKey, [m], [blocksB], id(2), EVENT]), [EVENT, true])
        const spec = { dtype: "float16" as const, numHeads: 8, headSize: 128, rotaryOffset: 0, rotaryDim: 128, isNeoxStyle: true }
        for (let l = 0; l < 3; l++) {
          const k = (yield* readPositions(b, blocksB, l, 0)).subarray(256 * b.geometry.blockBytes / 16)
          const v = (yield* readPositions(b, blocksB, l, 1)).subarray(256 * b.geometry.blockBytes / 16)
          assert.deepStrictEqual(v, source[l]!)
          const worst = worstUlp("float16", k, referenceRotate(spec, source[l]!, 256, 256))
          assert.isAtMost(worst.ulps, 1, `layer ${l}: ${worst.ulps} ulps at ${worst.at}`)
        }
      }).pipe(Effect.scoped, Effect.provide(testServer({ curve: fx, config: { chunkSize: 256 } }))))

    it.live("a chunk missing from L1 fails closed: ok = false and nothing is written for the request", () =>
      Effect.gen(function*() {
        const client = yield* MqClient
        const world = yield* setup("float16", true)
        const unknown = { ...match(0, 16, 0), hash: new Uint8Array(32).fill(9) }
        const reply = yield* client.request(CbRetrievePreComputed, [key(), [match(40, 64, 100), unknown], [world.blocksB], id(2), EVENT])
        assert.deepStrictEqual(reply, [EVENT, false])
        yield* verify("float16", true, world, [])
        // Another salt is another key: not found either.
        const salted = yield* client.request(CbRetrievePreComputed, [key({ cache_salt: "tenant-b" }), [match(40, 64, 100)], [world.blocksB], id(2), EVENT])
        assert.deepStrictEqual(salted, [EVENT, false])
        yield* verify("float16", true, world, [])
      }).pipe(Effect.scoped, Effect.provide(env())))

    it.live("bad input gets a clear error, writes nothing, and the server keeps serving", () =>
      Effect.gen(function*() {
        const client = yield* MqClient
        const world = yield* setup("float16", true)
        const cb = (matches: ReadonlyArray<CbMatch>, n = 2, blocks: ReadonlyArray<number> = world.blocksB, k: CacheKey = key()) =>
          Effect.flip(client.request(CbRetrievePreComputed, [k, matches, [blocks], id(n), EVENT]))

        const unknown = yield* cb(MATCHES, 99)
        assert.instanceOf(unknown, NotRegistered)
        assert.include(unknown.message, "cb_retrieve_pre_computed: instance 99 is not registered")

        const lengths = yield* cb([{ ...match(40, 64, 100), cur_ed: 120 }])
        assert.instanceOf(lengths, InvalidArgument)
        assert.include(lengths.message, "cb_retrieve_pre_computed: matches[0]: the old range [40, 64) has 24 tokens but the current range [100, 120) has 20")

        const crossing = yield* cb([match(20, 40, 0)])
        assert.instanceOf(crossing, InvalidArgument)
        assert.include(crossing.message, "crosses the end of chunk 0")

        const shortBlocks = yield* cb(MATCHES, 2, world.blocksB.slice(0, 4))
        assert.instanceOf(shortBlocks, InvalidArgument)
        assert.include(shortBlocks.message, "block_ids[0] has 4 ids")

        const nilRank = yield* cb(MATCHES, 2, world.blocksB, key({ worker_id: null }))
        assert.instanceOf(nilRank, InvalidArgument)
        assert.include(nilRank.message, "key.worker_id is nil")

        const table = world.table
        const badTable = yield* Effect.flip(client.request(CbRegisterRope, [id(2), [{ ...table, shape: [TABLE_ROWS, HEAD], stride: [1, TABLE_ROWS] }], HEAD, true, [], []]))
        assert.instanceOf(badTable, InvalidArgument)
        assert.strictEqual(badTable.message, "cb_register_rope: cos_sin_caches[0].stride: expected the contiguous strides [16, 1] (elements), got [1, 256]")
        const cuda = yield* Effect.flip(client.request(CbRegisterRope, [id(2), [{ kind: "cuda_ipc", ipc_handle: new Uint8Array(64), device_uuid: "GPU-0", nbytes: table.nbytes, dtype: "float32", shape: table.shape, stride: table.stride, storage_offset: 0 }], HEAD, true, [], []]))
        assert.instanceOf(cuda, InvalidArgument)
        assert.include(cuda.message, "CUDA IPC backend not available on this host")
        const tooFar = yield* cb([match(0, 4, TABLE_ROWS - 16 + 100)], 2, Array.from({ length: 32 }, (_, i) => i))
        assert.instanceOf(tooFar, InvalidArgument)
        assert.include(tooFar.message, "needs cos/sin row 340, but the table has 256 rows")

        // KV context without RoPE state, and RoPE without a KV context.
        const c = yield* newCache("float16")
        yield* registerKv(3, c)
        const noRope = yield* cb(MATCHES, 3)
        assert.instanceOf(noRope, NotRegistered)
        assert.include(noRope.message, "instance 3 has no CB RoPE state")
        const noKv = yield* Effect.flip(client.request(CbRegisterRope, [id(4), [table], HEAD, true, [], []]))
        assert.instanceOf(noKv, NotRegistered)

        yield* verify("float16", true, world, [])
        assert.strictEqual(yield* client.request(Noop, []), "OK")
        // The state survived the failed re-registers: a good retrieve still works.
        assert.deepStrictEqual(yield* client.request(CbRetrievePreComputed, [key(), MATCHES, [world.blocksB], id(2), EVENT]), [EVENT, true])
        yield* verify("float16", true, world, MATCHES)
        // CB_UNREGISTER_ROPE: the KV context stays, the next CB retrieve is not_registered.
        yield* client.request(CbUnregisterRope, [id(2)])
        assert.deepStrictEqual(yield* client.request(PingRegistered, [id(2), ["kv_cache", "cb_rope"]]), ["cb_rope"])
        assert.instanceOf(yield* cb(MATCHES), NotRegistered)
      }).pipe(Effect.scoped, Effect.provide(env())))
  })
})
