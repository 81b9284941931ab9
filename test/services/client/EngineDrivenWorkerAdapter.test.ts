/**
 * The engine-driven worker adapter against a scripted fake MQ client and
 * TestClock (the inline transport, so no pool is mapped): what it registers,
 * its heartbeat and re-registration, degraded mode, the inline byte layout
 * of COMMIT_STORE and PREPARE_RETRIEVE, and shutdown order. Then against
 * the server's engine-driven module in process (both transports): a local
 * failure after PREPARE_STORE aborts it.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect, Exit, Layer, Scope } from "effect"
import { TestClock } from "effect/testing"
import { NativeMemoryLive } from "../../../src/layers/NativeMemory.ts"
import { makeInstanceId } from "../../../src/schema/InstanceId.ts"
import type { Op, PayloadOf, ResponseOf } from "../../../src/schema/Op.ts"
import { InvalidArgument } from "../../../src/schema/WireError.ts"
import {
  type EngineDrivenWorkerAdapterSettings,
  makeEngineDrivenWorkerAdapterWith
} from "../../../src/services/client/EngineDrivenWorkerAdapter.ts"
import type { MqClientShape, RequestError } from "../../../src/services/client/MqClient.ts"
import { EngineDrivenTransfer } from "../../../src/services/server/EngineDrivenTransfer.ts"
import { L1Store } from "../../../src/services/server/L1Store.ts"
import { LayoutRegistry } from "../../../src/services/server/LayoutRegistry.ts"
import { Lookup } from "../../../src/services/server/Lookup.ts"
import { ServerConfig } from "../../../src/services/server/ServerConfig.ts"
import { type FakeMqClient, makeFakeMqClient, reply } from "../../support/FakeMqClient.ts"

const ID = makeInstanceId(4242n)
/** [2, 1 layer, 256 tokens, 4] uint8. */
const CHUNK_BYTES = 2 * 1 * 256 * 4

const settings = (extra: Partial<EngineDrivenWorkerAdapterSettings> = {}): EngineDrivenWorkerAdapterSettings => ({
  modelName: "m",
  worldSize: 1,
  kvRank: 0,
  blockSizeTokens: 16,
  numLayers: 1,
  hiddenDimSize: 4,
  dtype: "uint8",
  instanceId: ID,
  ...extra
})

/** A fake server answering with the inline transport. */
const inlineClient = (): FakeMqClient => {
  const client = makeFakeMqClient()
  client.answer("register_kv_cache_engine_driven_context", reply.ok({ shm_name: "", pool_size: 0 }))
  client.answer("commit_store", reply.ok(true))
  client.answer("commit_retrieve", reply.ok(true))
  return client
}

const chunk = (c: number) => new Uint8Array(CHUNK_BYTES).fill(c + 1)
const request = { requestId: "q", tokenIds: Array.from({ length: 1024 }, (_, i) => i), start: 0, end: 1024 }

const timeline = (client: FakeMqClient, ...only: ReadonlyArray<string>) =>
  client.sent.filter((s) => only.length === 0 || only.includes(s.op)).map((s) => `${s.op}@${s.atMs}`)

describe("engine-driven worker adapter", () => {
  it.effect("registers its context, then pings PING_REGISTERED [id, [engine_driven]] every interval", () =>
    Effect.gen(function*() {
      const client = inlineClient()
      const adapter = yield* makeEngineDrivenWorkerAdapterWith(client, settings())
      assert.isFalse(yield* adapter.heartbeatRunning)
      assert.deepStrictEqual(yield* adapter.register, { shm_name: "", pool_size: 0 })
      assert.strictEqual(yield* adapter.transport, "inline")
      yield* TestClock.adjust("20 seconds")
      assert.deepStrictEqual(timeline(client), [
        "get_chunk_size@0",
        "register_kv_cache_engine_driven_context@0",
        "ping_registered@0",
        "ping_registered@10000",
        "ping_registered@20000"
      ])
      assert.deepStrictEqual(client.sent[1]?.payload, [{
        instance_id: ID,
        model_name: "m",
        world_size: 1,
        block_size: 16,
        num_layers: 1,
        hidden_dim_size: 4,
        dtype_str: "uint8",
        use_mla: false
      }])
      assert.deepStrictEqual(client.sent[2]?.payload, [ID, ["engine_driven"]])
      assert.deepStrictEqual(adapter.layout.objectShape, [2, 1, 256, 4])
    }).pipe(Effect.provide(NativeMemoryLive)))

  it.effect("a block size that does not divide the server's chunk size is refused at construction", () =>
    Effect.gen(function*() {
      const error = yield* Effect.flip(makeEngineDrivenWorkerAdapterWith(inlineClient(), settings({ blockSizeTokens: 48 })))
      assert.instanceOf(error, InvalidArgument)
      assert.include(error.message, "block_size: 48 tokens must divide the server's chunk size (256 tokens)")
    }).pipe(Effect.provide(NativeMemoryLive)))

  it.effect("the server reporting engine_driven missing gets a re-register at once, with the same id", () =>
    Effect.gen(function*() {
      const client = inlineClient()
      const adapter = yield* makeEngineDrivenWorkerAdapterWith(client, settings())
      yield* adapter.register
      yield* TestClock.adjust("0 millis") // the first ping, at start
      client.once("ping_registered", reply.ok(["engine_driven"]))
      yield* TestClock.adjust("10 seconds")
      assert.deepStrictEqual(timeline(client, "register_kv_cache_engine_driven_context", "ping_registered"), [
        "register_kv_cache_engine_driven_context@0",
        "ping_registered@0",
        "ping_registered@10000",
        "register_kv_cache_engine_driven_context@10000"
      ])
      assert.strictEqual(yield* adapter.reregistrations, 1)
      assert.isTrue(yield* adapter.isHealthy)
    }).pipe(Effect.provide(NativeMemoryLive)))

  it.effect("degraded mode: a store answers false and a retrieve not ok, without sending anything", () =>
    Effect.gen(function*() {
      const client = inlineClient()
      const adapter = yield* makeEngineDrivenWorkerAdapterWith(client, settings({ heartbeatTimeoutMs: 1_000 }))
      yield* adapter.register
      client.answer("ping_registered", reply.timeout)
      yield* TestClock.adjust("11 seconds")
      assert.isFalse(yield* adapter.isHealthy)
      const before = client.sent.length
      assert.isFalse(yield* adapter.store(request, chunk))
      assert.deepStrictEqual(yield* adapter.retrieve(request), { ok: false, chunks: [] })
      assert.strictEqual(client.sent.length, before)
    }).pipe(Effect.provide(NativeMemoryLive)))

  it.effect("inline: COMMIT_STORE carries the wanted chunks concatenated in chunk_indices order; PREPARE_RETRIEVE's data is split into chunks", () =>
    Effect.gen(function*() {
      const client = inlineClient()
      const adapter = yield* makeEngineDrivenWorkerAdapterWith(client, settings())
      yield* adapter.register
      const slot = { offset: 0, length: CHUNK_BYTES, shape: [2, 1, 256, 4], dtype: "uint8" }
      client.answer("prepare_store", reply.ok({ context: { slots: [slot, slot], chunk_indices: [1, 3] } }))
      const asked: Array<number> = []
      assert.isTrue(yield* adapter.store(request, (i) => (asked.push(i), chunk(i))))
      assert.deepStrictEqual(asked, [1, 3])
      const commit = client.sent.find((s) => s.op === "commit_store")!
      assert.deepStrictEqual(new Uint8Array(commit.payload[2] as Uint8Array), new Uint8Array([...chunk(1), ...chunk(3)]))
      client.answer("prepare_retrieve", reply.ok({
        success: true,
        data: new Uint8Array([0, 1, 2, 3].flatMap((c) => [...chunk(c)])),
        context: { slots: [], chunk_indices: [0, 1, 2, 3] }
      }))
      const got = yield* adapter.retrieve(request)
      assert.isTrue(got.ok)
      assert.deepStrictEqual(got.chunks, [0, 1, 2, 3].map(chunk))
      assert.deepStrictEqual(timeline(client, "prepare_retrieve", "commit_retrieve"), ["prepare_retrieve@0", "commit_retrieve@0"])
      // A chunk of the wrong length is refused before anything is committed: the one COMMIT_STORE after the
      // first is the abort, a one-byte cpu_data (issue 18).
      const wrong = yield* Effect.flip(adapter.store(request, () => new Uint8Array(3)))
      assert.instanceOf(wrong, InvalidArgument)
      assert.strictEqual(client.ops("commit_store").length, 2)
      assert.deepStrictEqual(new Uint8Array(client.sent.filter((s) => s.op === "commit_store")[1]!.payload[2] as Uint8Array), new Uint8Array(1))
    }).pipe(Effect.provide(NativeMemoryLive)))

  it.effect("shutdown stops the heartbeat, then unregisters the context; nothing is sent after", () =>
    Effect.gen(function*() {
      const client = inlineClient()
      const scope = yield* Scope.make()
      const adapter = yield* makeEngineDrivenWorkerAdapterWith(client, settings()).pipe(Scope.provide(scope))
      yield* adapter.register
      yield* TestClock.adjust("5 seconds")
      yield* Scope.close(scope, Exit.void)
      yield* TestClock.adjust("60 seconds")
      assert.deepStrictEqual(timeline(client).slice(-2), ["ping_registered@0", "unregister_kv_cache_engine_driven_context@5000"])
      assert.deepStrictEqual(client.sent.at(-1)?.payload, [ID])
      assert.deepStrictEqual((yield* adapter.events).map((e) => e._tag), ["Registered", "HeartbeatStarted", "HeartbeatStopped", "Unregistered"])
    }).pipe(Effect.provide(NativeMemoryLive)))
})

/** The server's engine-driven module over a real 32-object L1 pool of 256-token chunks. */
const serverModules = (transport: "shm" | "inline") =>
  EngineDrivenTransfer.layer.pipe(
    Layer.provideMerge(Lookup.layer),
    Layer.provideMerge(Layer.mergeAll(L1Store.layer, LayoutRegistry.layer).pipe(Layer.provideMerge(NativeMemoryLive))),
    Layer.provideMerge(ServerConfig.layerTest({ chunkSize: 256, l1SizeGb: (32 * CHUNK_BYTES) / 2 ** 30, engineDrivenTransport: transport }))
  )

/**
 * A client whose requests run the module's own handler rows in process (no
 * sockets); the session's other ops answer as a current server does. Records
 * the op names and payloads sent.
 */
const inProcessClient = (ed: EngineDrivenTransfer["Service"]) => {
  const sent: Array<{ readonly op: string; readonly payload: ReadonlyArray<unknown> }> = []
  const ctx = { routingId: new Uint8Array([1]), peer: "01", skipBinding: false }
  const client: MqClientShape = {
    endpoint: "in-process://server",
    pendingCount: () => 0,
    request: <O extends Op>(op: O, payload: PayloadOf<O>) =>
      Effect.suspend(() => {
        sent.push({ op: op.name, payload: payload as ReadonlyArray<unknown> })
        const handler = ed.module.rows.find((r) => r.op.name === op.name)
        const answer = handler !== undefined
          ? handler.handle(payload as ReadonlyArray<unknown>, ctx)
          : Effect.succeed(op.name === "get_chunk_size" ? 256 : op.name === "ping_registered" ? [] : undefined)
        return answer as Effect.Effect<ResponseOf<O>, RequestError>
      })
  }
  return { client, sent }
}

describe("engine-driven worker adapter against the server module (issue 18)", () => {
  for (const transport of ["shm", "inline"] as const) {
    it.effect(`${transport}: a local failure after PREPARE_STORE sends the abort, and the server's reservations are gone at once`, () =>
      Effect.gen(function*() {
        const ed = yield* EngineDrivenTransfer
        const l1 = yield* L1Store
        const { client, sent } = inProcessClient(ed)
        const adapter = yield* makeEngineDrivenWorkerAdapterWith(client, settings())
        yield* adapter.register
        assert.strictEqual(yield* adapter.transport, transport)
        const state = Effect.map(ed.status(), (s) => {
          const block = s["engine_driven"] as { pending_stores: number }
          return [block.pending_stores, l1.stats().reservedObjects, l1.stats().objects]
        })
        // A chunk of the wrong length (chunk 2), after the server reserved all four.
        const wrong = yield* Effect.flip(adapter.store(request, (i) => (i === 2 ? new Uint8Array(7) : chunk(i))))
        assert.instanceOf(wrong, InvalidArgument)
        assert.strictEqual(wrong.message, "store: chunk 2 has 7 bytes; the layout [2, 1, 256, 4] uint8 takes 2048")
        assert.deepStrictEqual(yield* state, [0, 0, 0])
        assert.deepStrictEqual(sent.filter((s) => s.op.endsWith("_store")).map((s) => [s.op, (s.payload[2] as Uint8Array | undefined)?.length]), [
          ["prepare_store", undefined],
          ["commit_store", 1]
        ])
        // A chunk callback that throws is a local failure too.
        const died = yield* Effect.exit(adapter.store(request, () => {
          throw new Error("the engine lost its KV cache")
        }))
        assert.isTrue(Exit.isFailure(died))
        assert.deepStrictEqual(sent.filter((s) => s.op === "commit_store").map((s) => (s.payload[2] as Uint8Array).length), [1, 1])
        assert.deepStrictEqual(yield* state, [0, 0, 0])
        // Nothing was published, so the next store reserves and publishes all four chunks.
        assert.isTrue(yield* adapter.store(request, chunk))
        assert.deepStrictEqual(yield* state, [0, 0, 4])
      }).pipe(Effect.provide(serverModules(transport))))
  }
})
