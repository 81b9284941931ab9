/**
 * The MQ server alone (src/services/server/MqServer.ts) through its `layerTest`: a handler table of test modules
 * on real ZeroMQ sockets, a raw DEALER as the peer. The pooled path answers a handler's value, its wire error and
 * its defect; an op the table does not serve gets `unknown_op`; the peer's connect and its own lone empty frame
 * (probed, then dropped) show in `stats`. The whole assembly's behaviour is test/integration/MqServer.test.ts's.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect, Exit, Layer, Scope } from "effect"
import { decodeReplyHeader, encodeRequest } from "../../../src/schema/Frame.ts"
import { makeInstanceId } from "../../../src/schema/InstanceId.ts"
import { Noop, Ping, QueryPrefetchStatus, Store } from "../../../src/schema/Op.ts"
import { row, type ServerModule } from "../../../src/services/server/Handler.ts"
import { MqServer } from "../../../src/services/server/MqServer.ts"
import { ZmqSocketsLive } from "../../../src/layers/Zmq.ts"
import { rawCall, type RawDealer, rawDealer } from "../../support/RawDealer.ts"
import { InvalidArgument } from "../../../src/schema/WireError.ts"
import { failingStoreRow, storeKey } from "../../support/FailingStore.ts"

const testModule: ServerModule = {
  name: "test",
  rows: [
    row(QueryPrefetchStatus, "NORMAL", ([requestId]) => Effect.succeed(requestId.length)),
    failingStoreRow
  ]
}

const key = storeKey

/** STORE of `model` sent as the client encodes it; the reply's header. */
const store = (raw: RawDealer, uid: number, model: string) =>
  Effect.gen(function*() {
    const frames = encodeRequest(Store, uid, [key(model), makeInstanceId(1n), [[0]], new Uint8Array(0)])
    assert.isTrue(Exit.isSuccess(frames))
    if (Exit.isSuccess(frames)) yield* raw.send(frames.value)
    const reply = yield* raw.receive(30_000)
    assert.isDefined(reply, "no reply within 30 s")
    return decodeReplyHeader(reply!)!
  })

/** Real time: waits on the sockets (bounded generously). */
const until = (holds: () => boolean) =>
  Effect.gen(function*() {
    for (let i = 0; i < 1_000 && !holds(); i++) yield* Effect.sleep("10 millis")
    assert.isTrue(holds(), "timed out waiting on the server")
  })

const served = Effect.provide(MqServer.layerTest([testModule]).pipe(Layer.provide(ZmqSocketsLive)))

describe("MqServer", () => {
  it.live("layerTest serves its modules' table: a value, a wire error, a defect answered internal, an unserved op unknown_op", () =>
    Effect.gen(function*() {
      const server = yield* MqServer
      assert.deepStrictEqual(
        server.table.map((r) => [r.id, r.pool, r.module]),
        [[QueryPrefetchStatus.id, "NORMAL", "test"], [Store.id, "AFFINITY", "test"]].sort((a, b) => Number(a[0]) - Number(b[0]))
      )
      const raw = yield* rawDealer(server.endpoint)
      const value = yield* rawCall(raw, 1, QueryPrefetchStatus, ["abc"])
      assert.strictEqual(value._tag, "Ok")
      const wire = yield* store(raw, 2, "m")
      assert.deepStrictEqual(wire._tag === "Error" ? [wire.error.code, wire.error.message] : [], ["invalid_argument", "store: model m has no registered layout"])
      const defect = yield* store(raw, 3, "die")
      assert.deepStrictEqual(defect._tag === "Error" ? [defect.error.code, defect.error.message] : [], ["internal", "store: internal error: boom"])
      const unserved = yield* rawCall(raw, 4, Noop, [])
      assert.deepStrictEqual(unserved._tag === "Error" ? [unserved.error.code, unserved.error.message] : [], ["unknown_op", `op ${Noop.name} (${Noop.id}) is not served by this server`])
      const stats = server.stats()
      assert.deepStrictEqual([stats.connectedPeers, stats.droppedMessages, stats.undeliverableReplies, stats.refusedReplies], [1, 0, 0, 0])
    }).pipe(served))

  it.live("a connected peer's own lone empty frame is probed, found alive and dropped; the peer stays connected and served", () =>
    Effect.gen(function*() {
      const server = yield* MqServer
      const raw = yield* rawDealer(server.endpoint)
      assert.strictEqual((yield* rawCall(raw, 1, QueryPrefetchStatus, ["a"]))._tag, "Ok")
      yield* raw.send([Buffer.alloc(0)])
      yield* until(() => server.stats().droppedMessages === 1)
      assert.strictEqual(server.stats().connectedPeers, 1)
      // The peer received the five probes (lone empty frames, which clients ignore).
      for (let i = 0; i < 5; i++) assert.deepStrictEqual(yield* raw.receive(30_000), [Buffer.alloc(0)])
      assert.strictEqual((yield* rawCall(raw, 2, QueryPrefetchStatus, ["b"]))._tag, "Ok")
    }).pipe(served))

  it.live("its connection events: a connect, a successful request naming an instance binds, an error reply binds nothing, a disconnect", () => {
    const events: Array<string> = []
    const named: ServerModule = {
      name: "named",
      rows: [row(Ping, "NORMAL", ([id]) => (id === null || id === makeInstanceId(7n) ? Effect.fail(new InvalidArgument({ message: "ping: refused" })) : Effect.succeed(true as const)))]
    }
    return Effect.gen(function*() {
      const server = yield* MqServer
      const connection = yield* Scope.make()
      const raw = yield* rawDealer(server.endpoint).pipe(Scope.provide(connection))
      assert.strictEqual((yield* rawCall(raw, 1, Ping, [makeInstanceId(7n)]))._tag, "Error")
      assert.strictEqual((yield* rawCall(raw, 2, Ping, [makeInstanceId(5n)]))._tag, "Ok")
      const peer = events[0]!.slice("connected ".length)
      assert.deepStrictEqual(events, [`connected ${peer}`, `instance ${peer} 5`])
      yield* Scope.close(connection, Exit.void)
      yield* until(() => events.length === 3)
      assert.deepStrictEqual(events, [`connected ${peer}`, `instance ${peer} 5`, `disconnected ${peer}`])
    }).pipe(Effect.provide(MqServer.layerTest([named], {}, events).pipe(Layer.provide(ZmqSocketsLive))))
  })
})
