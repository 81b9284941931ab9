/**
 * The engine-driven data path over real sockets, in one process: two
 * engine-driven worker adapters (the shared pool mapped by the "worker",
 * or inline bytes) and a scheduler adapter against a real MQ server; the
 * wire's failure rows; PING_REGISTERED; re-registration after
 * not_registered.
 * The whole suite runs with CURVE off and on (test/support/CurveMode.ts, issue 14);
 * with CURVE on the server's transport is inline, its default there: shm,
 * which would hand every tenant the pool, is refused (issue 24 item 7,
 * test/e2e/tenantPool.test.ts).
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { decodeReplyHeader, pack } from "../../src/schema/Frame.ts"
import type { CacheKey } from "../../src/schema/CacheKey.ts"
import { makeInstanceId } from "../../src/schema/InstanceId.ts"
import {
  CommitStore,
  PingRegistered,
  PrepareStore,
  RegisterKvCacheEngineDrivenContext,
  UnregisterKvCacheEngineDrivenContext
} from "../../src/schema/Op.ts"
import { BadRequest, InvalidArgument, NotRegistered } from "../../src/schema/WireError.ts"
import { EngineDrivenTransfer } from "../../src/services/server/EngineDrivenTransfer.ts"
import { makeEngineDrivenWorkerAdapter, type EngineDrivenWorkerAdapterOptions } from "../../src/services/client/EngineDrivenWorkerAdapter.ts"
import { L1Store } from "../../src/services/server/L1Store.ts"
import { MqClient } from "../../src/services/client/MqClient.ts"
import { MqServer } from "../../src/services/server/MqServer.ts"
import { makeSchedulerAdapter } from "../../src/services/client/SchedulerAdapter.ts"
import { rawDealer } from "../support/RawDealer.ts"
import { CURVE_MODES, curveFixture } from "../support/CurveMode.ts"
import { TestCurve, testServer } from "../support/TestServer.ts"

const CHUNK = 32
const LAYERS = 3
const HIDDEN = 16
/** [2, 3, 32, 16] bfloat16. */
const CHUNK_BYTES = 2 * LAYERS * CHUNK * HIDDEN * 2
const tokens = Array.from({ length: 150 }, (_, i) => (i * 17 + 11) % 9000)

/** Chunk c's L1 object as worker `seed` computes it. */
const chunkContent = (seed: number, c: number) => {
  const out = new Uint8Array(CHUNK_BYTES)
  let x = (seed * 2246822519 + c * 3266489917) >>> 0
  for (let i = 0; i < out.length; i++) {
    x = (x ^ (x << 13)) >>> 0
    x = (x ^ (x >>> 17)) >>> 0
    x = (x ^ (x << 5)) >>> 0
    out[i] = x & 0xff
  }
  return out
}

const adapter = (n: number, over: Partial<EngineDrivenWorkerAdapterOptions> = {}) =>
  Effect.gen(function*() {
    const server = yield* MqServer
    return yield* makeEngineDrivenWorkerAdapter({
      endpoint: server.endpoint,
      ...(yield* TestCurve).client(),
      modelName: "edm",
      worldSize: 1,
      kvRank: 0,
      blockSizeTokens: 16,
      numLayers: LAYERS,
      hiddenDimSize: HIDDEN,
      dtype: "bfloat16",
      instanceId: makeInstanceId(BigInt(n)),
      requestTimeoutMs: 5_000,
      ...over
    })
  })

const scheduler = Effect.gen(function*() {
  const server = yield* MqServer
  return yield* makeSchedulerAdapter({
    endpoint: server.endpoint,
    modelName: "edm",
    worldSize: 1,
    requestTimeoutMs: 5_000,
    ...(yield* TestCurve).client()
  })
})

const storeThenRetrieve = Effect.gen(function*() {
  const a = yield* adapter(1)
  const b = yield* adapter(2)
  const poolA = yield* a.register
  yield* b.register
  assert.isTrue(yield* a.store({ requestId: "ra", tokenIds: tokens, start: 0, end: 150 }, (i) => chunkContent(7, i)))
  const s = yield* scheduler
  const hit = yield* s.lookup("rb", tokens)
  assert.strictEqual(hit, 128)
  const got = yield* b.retrieve({ requestId: "rb", tokenIds: tokens, start: 0, end: hit })
  yield* s.endSession("rb")
  assert.isTrue(got.ok)
  assert.strictEqual(got.chunks.length, 4)
  got.chunks.forEach((c, i) => assert.deepStrictEqual(c, chunkContent(7, i), `chunk ${i}`))
  const l1 = yield* L1Store
  assert.deepStrictEqual([l1.stats().objects, l1.stats().reservedObjects, l1.stats().lockedObjects], [4, 0, 0])
  // A second store of the same prefix sends nothing to copy: every chunk is cached.
  let asked = 0
  assert.isTrue(yield* a.store({ requestId: "ra2", tokenIds: tokens, start: 0, end: 150 }, (i) => (asked++, chunkContent(7, i))))
  assert.strictEqual(asked, 0)
  return { poolA, transportA: yield* a.transport }
})

describe.each(CURVE_MODES)("engine-driven data path (CURVE $curve)", ({ curve }) => {
  const fx = curveFixture(curve)

  /** A server with `transport`, or its default one (shm, inline with CURVE). */
  const env = (transport?: "shm" | "inline") =>
    testServer({
      curve: fx,
      config: { chunkSize: CHUNK, l1SizeGb: (64 * CHUNK_BYTES) / 2 ** 30, ...(transport === undefined ? {} : { engineDrivenTransport: transport }) }
    })
  /** The REGISTER answer of the default transport. */
  const defaultPool = Effect.map(L1Store, (l1) => curve ? { shm_name: "", pool_size: 0 } : { shm_name: l1.pool!.shmName, pool_size: l1.pool!.sizeBytes })

  describe("engine-driven store and retrieve", () => {
    // With CURVE a server with the shm transport does not start (ServerConfig.test.ts, test/e2e/tenantPool.test.ts).
    it.live.skipIf(curve)("shared-memory slots: worker A stores, worker B retrieves every byte through the pool", () =>
      Effect.gen(function*() {
        const { poolA, transportA } = yield* storeThenRetrieve
        const l1 = yield* L1Store
        assert.deepStrictEqual(poolA, { shm_name: l1.pool!.shmName, pool_size: l1.pool!.sizeBytes })
        assert.strictEqual(transportA, "shm")
        const client = yield* MqClient
        assert.deepStrictEqual(yield* client.request(PingRegistered, [makeInstanceId(1n), ["kv_cache", "engine_driven"]]), ["kv_cache"])
        const ed = yield* EngineDrivenTransfer
        assert.deepStrictEqual(yield* ed.status(), {
          engine_driven: { transport: "shm", pool: l1.pool!.shmName, contexts: 2, pending_stores: 0, pending_retrieves: 0 }
        })
      }).pipe(Effect.scoped, Effect.provide(env("shm"))))

    it.live("inline bytes: the same, with the bytes in COMMIT_STORE and PREPARE_RETRIEVE", () =>
      Effect.gen(function*() {
        const { poolA, transportA } = yield* storeThenRetrieve
        assert.deepStrictEqual(poolA, { shm_name: "", pool_size: 0 })
        assert.strictEqual(transportA, "inline")
      }).pipe(Effect.scoped, Effect.provide(env("inline"))))

    it.live("unregistering (the adapter's shutdown) leaves no context", () =>
      Effect.gen(function*() {
        yield* Effect.scoped(Effect.gen(function*() {
          const a = yield* adapter(3)
          yield* a.register
          assert.strictEqual(yield* (yield* EngineDrivenTransfer).target.trackedInstanceCount(), 1)
        }))
        assert.strictEqual(yield* (yield* EngineDrivenTransfer).target.trackedInstanceCount(), 0)
      }).pipe(Effect.scoped, Effect.provide(env())))

    it.live("a transfer answered not_registered re-registers the adapter with the same id; the next store works", () =>
      Effect.gen(function*() {
        const client = yield* MqClient
        const a = yield* adapter(4, { heartbeatIntervalMs: 60_000 })
        yield* a.register
        // Let the heartbeat's first ping (at start) finish, so only the transfer notices the loss.
        yield* Effect.sleep("300 millis")
        yield* client.request(UnregisterKvCacheEngineDrivenContext, [makeInstanceId(4n)])
        const error = yield* Effect.flip(a.store({ requestId: "x", tokenIds: tokens, start: 0, end: 64 }, (i) => chunkContent(1, i)))
        assert.instanceOf(error, NotRegistered)
        assert.strictEqual(yield* a.reregistrations, 1)
        assert.isTrue(yield* (yield* EngineDrivenTransfer).target.holdsInstance(makeInstanceId(4n)))
        assert.isTrue(yield* a.store({ requestId: "x", tokenIds: tokens, start: 0, end: 64 }, (i) => chunkContent(1, i)))
      }).pipe(Effect.scoped, Effect.provide(env())))
  })

  describe("wire failure rows", () => {
    const key: CacheKey = {
      model_name: "edm",
      world_size: 1,
      worker_id: 0,
      token_ids: tokens,
      start: 0,
      end: 64,
      request_id: "w",
      cache_salt: ""
    }
    const payload = (over: Record<string, unknown> = {}) => ({
      instance_id: makeInstanceId(9n),
      model_name: "edm",
      world_size: 1,
      block_size: 16,
      num_layers: LAYERS,
      hidden_dim_size: HIDDEN,
      dtype_str: "bfloat16" as const,
      use_mla: false,
      ...over
    })

    it.live("an unknown dtype or a zero size is bad_request naming the field; a block size that does not divide the chunk is invalid_argument", () =>
      Effect.gen(function*() {
        const server = yield* MqServer
        const raw = yield* rawDealer(server.endpoint, fx.client().curve)
        const send = (uid: number, body: Record<string, unknown>) =>
          Effect.gen(function*() {
            yield* raw.send([pack(uid), pack(14), pack(body)])
            const reply = decodeReplyHeader((yield* raw.receive(2_000))!)
            return reply?._tag === "Error" ? reply.error : undefined
          })
        const dtype = yield* send(1, { ...payload(), instance_id: 9, dtype_str: "float13" })
        assert.instanceOf(dtype, BadRequest)
        assert.include(dtype!.message, "register_kv_cache_engine_driven_context: payload 0 (context)")
        assert.include(dtype!.message, "dtype_str")
        const zero = yield* send(2, { ...payload(), instance_id: 9, block_size: 0 })
        assert.instanceOf(zero, BadRequest)
        assert.include(zero!.message, "block_size")
        const client = yield* MqClient
        const indivisible = yield* Effect.flip(client.request(RegisterKvCacheEngineDrivenContext, [payload({ block_size: 48 })]))
        assert.instanceOf(indivisible, InvalidArgument)
        assert.include(indivisible.message, "block_size: 48 tokens must divide the server's chunk size (32 tokens)")
        const mla = yield* client.request(RegisterKvCacheEngineDrivenContext, [payload({ use_mla: true })])
        assert.deepStrictEqual(mla, yield* defaultPool)
        const changed = yield* Effect.flip(client.request(RegisterKvCacheEngineDrivenContext, [payload()]))
        assert.instanceOf(changed, InvalidArgument)
      }).pipe(Effect.scoped, Effect.provide(env())))

    it.live("PREPARE/COMMIT for an id the server does not hold are not_registered; a commit nobody prepared is false", () =>
      Effect.gen(function*() {
        const client = yield* MqClient
        const e = yield* Effect.flip(client.request(PrepareStore, [key, makeInstanceId(77n)]))
        assert.instanceOf(e, NotRegistered)
        yield* client.request(RegisterKvCacheEngineDrivenContext, [payload()])
        assert.isFalse(yield* client.request(CommitStore, [key, makeInstanceId(9n), new Uint8Array(0)]))
      }).pipe(Effect.scoped, Effect.provide(env())))
  })
})
