/**
 * Blend's copies of worker memory under the fault guard (issue 13 item 1),
 * over real sockets with real shared memory and a real SIGBUS (in this test
 * process, which serves): a worker shrinks its cos/sin table (the read of
 * the rows faults) or its KV segment (the scatter faults) after
 * CB_REGISTER_ROPE; CB_RETRIEVE_PRE_COMPUTED is answered invalid_argument
 * naming the instance, the segment and "the segment shrank below its
 * registered size"; both its kv_cache context and its RoPE state are
 * released; the other worker keeps its context and its chunks.
 * The whole suite runs with CURVE off and on (test/support/CurveMode.ts, issue 14).
 */
import { randomUUID } from "node:crypto"
import { truncateSync } from "node:fs"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import type { CacheKey } from "../../src/schema/CacheKey.ts"
import type { CbMatch } from "../../src/schema/CbMatch.ts"
import { makeInstanceId } from "../../src/schema/InstanceId.ts"
import { CbRegisterRope, CbRetrievePreComputed, PingRegistered, RegisterKvCache, Retrieve, Store } from "../../src/schema/Op.ts"
import { InvalidArgument } from "../../src/schema/WireError.ts"
import { Blend } from "../../src/services/server/Blend.ts"
import { MqClient } from "../../src/services/client/MqClient.ts"
import { makePagedKvCache } from "../../src/services/client/PagedKvCache.ts"
import { chunkHashes } from "../../src/services/kv/TokenHasher.ts"
import { makeTableSegment } from "../support/RopeReference.ts"
import { CURVE_MODES, curveFixture } from "../support/CurveMode.ts"
import { testServer } from "../support/TestServer.ts"

const CHUNK = 32
const HEAD = 16
const TOKENS = 128
const tokens = Array.from({ length: TOKENS }, (_, i) => (i * 29 + 5) % 30000)
const hashes = chunkHashes(tokens, CHUNK)
const EVENT = new Uint8Array([3])
const SHRANK = "the segment shrank below its registered size"

const key = (over: Partial<CacheKey> = {}): CacheKey => ({
  model_name: "blend-fault",
  world_size: 1,
  worker_id: 0,
  token_ids: tokens,
  start: 0,
  end: TOKENS,
  request_id: "cb-fault",
  cache_salt: "",
  ...over
})

const match = (old_st: number, old_ed: number, cur_st: number): CbMatch => ({
  old_st,
  old_ed,
  cur_st,
  cur_ed: cur_st + old_ed - old_st,
  hash: hashes[Math.floor(old_st / CHUNK)]!
})

const id = (n: number) => makeInstanceId(BigInt(n))

/** Worker 1 stores 4 chunks; worker 2 registers its KV cache and a cos/sin table of 256 rows. */
const setup = Effect.gen(function*() {
  const client = yield* MqClient
  const cache = () =>
    makePagedKvCache({ backing: "cpu_shm", namePrefix: `mpcache-test-${randomUUID()}`, numLayers: 2, numBlocks: 64, blockSizeTokens: 16, numHeads: 2, headSize: HEAD, dtype: "float16" })
  const a = yield* cache()
  const b = yield* cache()
  yield* client.request(RegisterKvCache, [id(1), a.descriptors, "blend-fault", 1, "vllm", {}, []])
  yield* client.request(RegisterKvCache, [id(2), b.descriptors, "blend-fault", 1, "vllm", {}, []])
  const blocksA = [1, 2, 3, 4, 5, 6, 7, 8]
  assert.deepStrictEqual(yield* client.request(Store, [key(), id(1), [blocksA], EVENT]), [EVENT, true])
  const table = yield* makeTableSegment(256, HEAD, 16)
  yield* client.request(CbRegisterRope, [id(2), [table], HEAD, true, [0], [null]])
  return { a, b, blocksA, table }
})

/** After the fault: instance 2 holds nothing, instance 1 still retrieves its chunks. */
const afterFault = (blocksA: ReadonlyArray<number>) =>
  Effect.gen(function*() {
    const client = yield* MqClient
    assert.deepStrictEqual(yield* client.request(PingRegistered, [id(2), ["kv_cache", "cb_rope"]]), ["kv_cache", "cb_rope"])
    assert.deepStrictEqual(yield* (yield* Blend).status(), { blend: { rope_instances: [] } })
    assert.deepStrictEqual(yield* client.request(PingRegistered, [id(1), ["kv_cache"]]), [])
    assert.deepStrictEqual(yield* client.request(Retrieve, [key({ request_id: "after" }), id(1), [blocksA], EVENT, 0]), [EVENT, true])
  })

describe.each(CURVE_MODES)("CacheBlend of shrunk worker memory (CURVE $curve)", ({ curve }) => {
  const fx = curveFixture(curve)

  describe("CB_RETRIEVE_PRE_COMPUTED of shrunk worker memory", () => {
    it.live("the cos/sin table shrank: the read of its rows faults; invalid_argument, the instance released, the other served", () =>
      Effect.gen(function*() {
        const client = yield* MqClient
        const { blocksA, table } = yield* setup
        truncateSync(`/dev/shm/${table.shm_name}`, 0)
        const e = yield* Effect.flip(client.request(CbRetrievePreComputed, [key({ token_ids: [], end: 0 }), [match(40, 64, 100)], [[50, 12, 33, 7, 60, 21, 2, 45]], id(2), EVENT]))
        assert.deepStrictEqual(
          e,
          new InvalidArgument({
            op: "cb_retrieve_pre_computed",
            instance_id: "2",
            field: "kv_caches",
            expected: `segment ${table.shm_name} of at least ${table.nbytes} bytes (as registered)`,
            actual: "0 bytes",
            // Δ = +60: row 60 of the table, bytes 64 + 60 × 64 = 3904…, on page 0.
            message: `cb_retrieve_pre_computed: instance 2: segment ${table.shm_name}: ${SHRANK} (${table.nbytes} bytes registered, 0 bytes now; gather faulted on the page at byte 0); its context is released: recreate the memory and register it again`
          })
        )
        yield* afterFault(blocksA)
      }).pipe(Effect.scoped, Effect.provide(testServer({ curve: fx, config: { chunkSize: CHUNK } }))))

    it.live("the KV segment shrank: the scatter faults; invalid_argument, the instance released, the other served", () =>
      Effect.gen(function*() {
        const client = yield* MqClient
        const { b, blocksA } = yield* setup
        const segment = b.segmentNames[0]!
        const nbytes = b.descriptors[0]!.nbytes
        truncateSync(`/dev/shm/${segment}`, 0)
        const e = yield* Effect.flip(client.request(CbRetrievePreComputed, [key({ token_ids: [], end: 0 }), [match(64, 70, 64)], [[50, 12, 33, 7, 60, 21, 2, 45]], id(2), EVENT]))
        // Δ = 0: a plain scatter of chunk 2's tokens 0…5 to position 64, i.e. block blocks[64 / 16] = 60; layer 0's K of
        // block 60 (60 × 16 tokens × 64 bytes) comes first in that segment's one job.
        const page = Math.floor((60 * 16 * 2 * HEAD * 2) / 4096) * 4096
        assert.deepStrictEqual(
          e,
          new InvalidArgument({
            op: "cb_retrieve_pre_computed",
            instance_id: "2",
            field: "kv_caches",
            expected: `segment ${segment} of at least ${nbytes} bytes (as registered)`,
            actual: "0 bytes",
            message: `cb_retrieve_pre_computed: instance 2: segment ${segment}: ${SHRANK} (${nbytes} bytes registered, 0 bytes now; scatter faulted on the page at byte ${page}); its context is released: recreate the memory and register it again`
          })
        )
        yield* afterFault(blocksA)
      }).pipe(Effect.scoped, Effect.provide(testServer({ curve: fx, config: { chunkSize: CHUNK } }))))
  })
})
