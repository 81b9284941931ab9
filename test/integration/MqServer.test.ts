/**
 * The MQ server and client over real ZeroMQ sockets on loopback: management
 * ops, error replies, malformed input, and reply matching under load; the
 * whole suite with CURVE off and on (issue 14).
 */
import { assert, describe, it } from "@effect/vitest"
import { Context, Deferred, Effect, Exit, Layer, Random, Schedule, Scope } from "effect"
import { decodeReplyHeader, encodeRequest, pack } from "../../src/schema/Frame.ts"
import { makeInstanceId, MAX_INSTANCE_ID } from "../../src/schema/InstanceId.ts"
import { Clear, GetChunkSize, Noop, Ping, PrepareStore, QueryPrefetchStatus, Store } from "../../src/schema/Op.ts"
import { BadRequest, InvalidArgument, UnknownOp } from "../../src/schema/WireError.ts"
import { row, type ServerModule } from "../../src/services/server/Handler.ts"
import { makeMqClient, MqClient, RequestTimeout } from "../../src/services/client/MqClient.ts"
import { MqServer } from "../../src/services/server/MqServer.ts"
import { rawDealer } from "../support/RawDealer.ts"
import { quietPort } from "../support/QuietPort.ts"
import { captureLogs, type CapturedLog } from "../support/FakeMqClient.ts"
import { CURVE_MODES, curveFixture } from "../support/CurveMode.ts"
import { bareServer, testServer } from "../support/TestServer.ts"
import { ZmqSocketsLive } from "../../src/layers/Zmq.ts"
import { failingStoreRow, storeKey } from "../support/FailingStore.ts"

/**
 * A test module: QUERY_PREFETCH_STATUS answers the request id as a number after a random delay
 * (with CURVE on, the id it sees is namespaced `group|id` by the tenant guard: the number follows the last `|`).
 */
const echoModule: ServerModule = {
  name: "echo",
  rows: [
    row(QueryPrefetchStatus, "NORMAL", ([requestId]) =>
      Random.nextIntBetween(0, 5).pipe(
        Effect.flatMap((ms) => Effect.sleep(`${ms} millis`)),
        Effect.as(Number(requestId.slice(requestId.lastIndexOf("|") + 1)))
      ))
  ]
}

/** A test module whose handler fails with a wire error, or dies. */
const failingModule: ServerModule = {
  name: "failing",
  rows: [
    failingStoreRow
  ]
}

const key = storeKey

describe.each(CURVE_MODES)("MQ server and client over real sockets (CURVE $curve)", ({ curve }) => {
  const fx = curveFixture(curve)

  describe("management ops over real sockets", () => {
    it.live("NOOP answers OK", () =>
      Effect.gen(function*() {
        const client = yield* MqClient
        assert.strictEqual(yield* client.request(Noop, []), "OK")
      }).pipe(Effect.provide(testServer({ curve: fx }))))

    it.live("PING with an id and with nil answers true", () =>
      Effect.gen(function*() {
        const client = yield* MqClient
        assert.strictEqual(yield* client.request(Ping, [makeInstanceId(42n)]), true)
        assert.strictEqual(yield* client.request(Ping, [makeInstanceId(MAX_INSTANCE_ID)]), true)
        assert.strictEqual(yield* client.request(Ping, [null]), true)
      }).pipe(Effect.provide(testServer({ curve: fx }))))

    it.live("GET_CHUNK_SIZE answers the configured chunk size", () =>
      Effect.gen(function*() {
        const client = yield* MqClient
        assert.strictEqual(yield* client.request(GetChunkSize, []), 128)
      }).pipe(Effect.provide(testServer({ curve: fx, config: { chunkSize: 128 } }))))

    it.live("CLEAR answers with no response frame", () =>
      Effect.gen(function*() {
        const client = yield* MqClient
        assert.strictEqual(yield* client.request(Clear, [true]), undefined)
        assert.strictEqual(yield* client.request(Clear, [false]), undefined)
      }).pipe(Effect.provide(testServer({ curve: fx }))))
  })

  describe("error replies", () => {
    it.live("a wrong payload count gets bad_request naming the op, expected and actual, well under a second", () =>
      Effect.gen(function*() {
        const server = yield* MqServer
        const raw = yield* rawDealer(server.endpoint, fx.client().curve)
        yield* raw.send([pack(7), pack(22)])
        const reply = yield* raw.receive(1_000)
        assert.isDefined(reply)
        assert.deepStrictEqual(decodeReplyHeader(reply!), {
          _tag: "Error",
          uid: 7,
          opId: 22,
          error: new BadRequest({ message: "ping: expected 1 payload frame(s) (instance_id), got 0" })
        })
      }).pipe(Effect.provide(testServer({ curve: fx }))))

    it.live("a payload that does not decode gets bad_request naming the field", () =>
      Effect.gen(function*() {
        const server = yield* MqServer
        const raw = yield* rawDealer(server.endpoint, fx.client().curve)
        yield* raw.send([pack(8), pack(22), pack(-5)])
        const reply = yield* raw.receive(1_000)
        assert.deepStrictEqual(decodeReplyHeader(reply!), {
          _tag: "Error",
          uid: 8,
          opId: 22,
          error: new BadRequest({
            message: "ping: payload 0 (instance_id): Expected a value between 0n and 9223372036854775807n; actual: -5"
          })
        })
      }).pipe(Effect.provide(testServer({ curve: fx }))))

    it.live("an unknown op gets unknown_op", () =>
      Effect.gen(function*() {
        const server = yield* MqServer
        const raw = yield* rawDealer(server.endpoint, fx.client().curve)
        yield* raw.send([pack(1), pack(99)])
        const reply = decodeReplyHeader((yield* raw.receive(1_000))!)
        assert.strictEqual(reply?._tag, "Error")
        if (reply?._tag !== "Error") return
        assert.instanceOf(reply.error, UnknownOp)
        assert.include(reply.error.message, "unknown op 99")
      }).pipe(Effect.provide(testServer({ curve: fx }))))

    it.live("a protocol op this server does not serve gets unknown_op naming it", () =>
      Effect.gen(function*() {
        const client = yield* MqClient
        const exit = yield* Effect.exit(client.request(PrepareStore, [key("m"), makeInstanceId(1n)]))
        assert.deepStrictEqual(exit, Exit.fail(new UnknownOp({ message: "op prepare_store (16) is not served by this server" })))
      }).pipe(Effect.provide(bareServer({ curve: fx, modules: [] }))))

    it.live("a handler's wire error reaches the client as that tagged error; a defect as internal", () =>
      Effect.gen(function*() {
        const client = yield* MqClient
        const cb = (model: string) => client.request(Store, [key(model), makeInstanceId(1n), [[0]], new Uint8Array(0)])
        const failed = yield* Effect.exit(cb("m"))
        assert.deepStrictEqual(
          failed,
          Exit.fail(new InvalidArgument({ message: "store: model m has no registered layout" }))
        )
        const died = yield* Effect.flip(cb("die"))
        assert.strictEqual(died._tag, "Internal")
        assert.strictEqual(died.message, "store: internal error: boom")
        assert.strictEqual(yield* client.request(Noop, []), "OK")
      }).pipe(Effect.provide(bareServer({ curve: fx, modules: [failingModule] }))))
  })

  describe("malformed input never stops the server", () => {
    it.live("a 1-frame message, garbage bytes and a non-int op frame are dropped; the next PING is answered", () =>
      Effect.gen(function*() {
        const server = yield* MqServer
        const client = yield* MqClient
        const raw = yield* rawDealer(server.endpoint, fx.client().curve)
        yield* raw.send([pack(1)])
        yield* raw.send([Buffer.from([0xc1, 0xff, 0x00]), Buffer.from("garbage")])
        yield* raw.send([pack(2), pack("ping"), pack(null)])
        yield* raw.send([pack(-3), pack(22), pack(null)])
        yield* raw.send([Buffer.alloc(0), Buffer.alloc(0), Buffer.alloc(0)])
        assert.strictEqual(yield* raw.receive(300), undefined)
        assert.strictEqual(yield* client.request(Ping, [null]), true)
        yield* raw.send([pack(4), pack(22), pack(null)])
        const reply = yield* raw.receive(1_000)
        assert.deepStrictEqual(decodeReplyHeader(reply!), { _tag: "Ok", uid: 4, opId: 22, body: [pack(true)] })
        assert.strictEqual(server.stats().droppedMessages, 5)
      }).pipe(Effect.provide(testServer({ curve: fx }))))
  })

  describe("client", () => {
    it.live("1,000 concurrent requests from one client: every reply matched to its request", () =>
      Effect.gen(function*() {
        const client = yield* MqClient
        const ids = Array.from({ length: 1_000 }, (_, i) => i)
        const answers = yield* Effect.forEach(
          ids,
          (i) => client.request(QueryPrefetchStatus, [String(i)]),
          { concurrency: "unbounded" }
        )
        assert.deepStrictEqual(answers, ids)
        assert.strictEqual(client.pendingCount(), 0)
      }).pipe(Effect.provide(bareServer({ curve: fx, modules: [echoModule], config: { maxCpuWorkers: 8 } }))))

    it.live("a request to an unreachable server times out with an error naming the op and the endpoint", () =>
      Effect.scoped(Effect.gen(function*() {
        const client = yield* makeMqClient({ endpoint: "tcp://127.0.0.1:1", requestTimeoutMs: 200, lingerMs: 0, ...fx.client() })
        const exit = yield* Effect.exit(client.request(Noop, []))
        assert.deepStrictEqual(exit, Exit.fail(new RequestTimeout({ op: "noop", endpoint: "tcp://127.0.0.1:1", timeoutMs: 200 })))
        assert.strictEqual(
          (exit as Exit.Failure<never, RequestTimeout>).cause.reasons.length,
          1
        )
        assert.strictEqual(
          new RequestTimeout({ op: "noop", endpoint: "tcp://127.0.0.1:1", timeoutMs: 200 }).message,
          "noop to tcp://127.0.0.1:1: no reply within 200 ms: the server did not answer (is it running?)"
        )
        assert.strictEqual(client.pendingCount(), 0)
      }).pipe(Effect.provide(ZmqSocketsLive))))

    it.live("a server restarted on the same endpoint is reachable again within seconds", () =>
      Effect.scoped(Effect.gen(function*() {
        // A port below the ephemeral range: no file running beside this one can take it while it is free.
        const endpoint = `tcp://127.0.0.1:${yield* Effect.promise(quietPort)}`
        const first = yield* Scope.make()
        const server = yield* Layer.buildWithScope(testServer({ curve: fx, config: { endpoint } }), first)
        assert.strictEqual(Context.get(server, MqServer).endpoint, endpoint)
        yield* Scope.close(first, Exit.void)
        const client = yield* makeMqClient({ endpoint, requestTimeoutMs: 500, lingerMs: 0, ...fx.client() })
        const down = yield* Effect.exit(client.request(Noop, []))
        assert.isTrue(Exit.isFailure(down))
        // libzmq closes the first listener on its I/O thread after the scope closed: the new server binds once the
        // port is free again (each try in a scope of its own, so a failed one leaves nothing bound), as a restarted
        // process would.
        const second = yield* Scope.make()
        yield* Effect.addFinalizer(() => Scope.close(second, Exit.void))
        yield* Effect.gen(function*() {
          const attempt = yield* Scope.make()
          yield* Layer.buildWithScope(testServer({ curve: fx, config: { endpoint } }), attempt).pipe(
            Effect.tapError(() => Scope.close(attempt, Exit.void))
          )
          yield* Scope.addFinalizer(second, Scope.close(attempt, Exit.void))
        }).pipe(Effect.retry({ schedule: Schedule.spaced("50 millis"), times: 200, while: (e) => /EADDRINUSE|in use/i.test(String(e.cause)) }))
        // Tries of 500 ms, at most 40 (20 s, a bound on a hang): far below the OS SYN timeout of about 2 minutes
        // that a client without a connect timeout waits out (LMCache #4670).
        const up = yield* client.request(Noop, []).pipe(
          Effect.retry({ times: 40, while: (e) => e._tag === "RequestTimeout" })
        )
        assert.strictEqual(up, "OK")
      })).pipe(Effect.provide(ZmqSocketsLive)))

    it.live("a payload of the wrong length fails before sending, saying the versions differ", () =>
      Effect.gen(function*() {
        const client = yield* MqClient
        const error = yield* Effect.flip(client.request(Ping, [] as never))
        assert.deepStrictEqual(
          error,
          new BadRequest({
            message: "ping: this client sends 0 payload frame(s) but the protocol defines 1 (instance_id); the client and server versions differ"
          })
        )
      }).pipe(Effect.provide(testServer({ curve: fx }))))
  })

  describe("undeliverable replies", () => {
    /** Real time: for waiting on the sockets. */
    const until = (holds: () => boolean) =>
      Effect.gen(function*() {
        for (let i = 0; i < 500 && !holds(); i++) yield* Effect.sleep("10 millis")
        assert.isTrue(holds(), "timed out waiting on the server")
      })

    it.live("replies to a peer that is gone are counted and told in one WARNING naming the peer, the count and the errno", () => {
      const logs: Array<CapturedLog> = []
      const gate = Deferred.makeUnsafe<void>()
      const heldModule: ServerModule = {
        name: "held",
        rows: [row(QueryPrefetchStatus, "NORMAL", () => Deferred.await(gate).pipe(Effect.as(1)))]
      }
      return Effect.gen(function*() {
        const serverScope = yield* Scope.make()
        const env = yield* Layer.buildWithScope(bareServer({ curve: fx, modules: [heldModule] }), serverScope)
        const server = Context.get(env, MqServer)
        const dealerScope = yield* Scope.make()
        const raw = yield* Scope.provide(dealerScope)(rawDealer(server.endpoint, fx.client().curve))
        for (const uid of [1, 2, 3]) {
          const frames = encodeRequest(QueryPrefetchStatus, uid, [`r${uid}`])
          assert.isTrue(Exit.isSuccess(frames))
          if (Exit.isSuccess(frames)) yield* raw.send(frames.value)
        }
        // The raw dealer and the assembly's own client are connected; then only the client.
        yield* until(() => server.stats().connectedPeers === 2 && server.stats().pools.normal.queued === 0)
        yield* Scope.close(dealerScope, Exit.void)
        yield* until(() => server.stats().connectedPeers === 1)
        yield* Deferred.succeed(gate, undefined)
        yield* until(() => server.stats().undeliverableReplies === 3)
        yield* Scope.close(serverScope, Exit.void)
        const told = logs.filter((l) => l.text.includes("could not be delivered"))
        assert.deepStrictEqual(told.map((l) => l.level), ["Warn"])
        assert.match(
          told[0]!.text,
          /^3 replies to peer [0-9a-f]+ could not be delivered \(EHOSTUNREACH: the peer is gone or its pipe is full\) in the last 5 s$/
        )
      }).pipe(Effect.provide(captureLogs(logs)))
    })
  })
})
