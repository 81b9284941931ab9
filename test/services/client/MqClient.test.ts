/**
 * The MQ client on its own (MqClient.ts, DESIGN §3, §6): a real DEALER
 * talking to a bare ZeroMQ ROUTER that plays the server frame by frame, so
 * each test decides exactly what the "server" answers and when. What the
 * client does against the real server (1,000 concurrent requests, an
 * unreachable endpoint, a restart, a payload of the wrong length) is in
 * test/integration/MqServer.test.ts; CURVE HELLO in test/integration/Tenants.test.ts.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect, Exit, Fiber, Scope } from "effect"
import { TestClock } from "effect/testing"
import * as zmq from "zeromq"
import { ZmqSocketsLive } from "../../../src/layers/Zmq.ts"
import { decodeHeaderInt, encodeErrorReply, encodeReply, pack } from "../../../src/schema/Frame.ts"
import { GetChunkSize, Noop, Ping } from "../../../src/schema/Op.ts"
import { BadRequest, InvalidArgument } from "../../../src/schema/WireError.ts"
import { ClientClosed, makeMqClient, RequestTimeout } from "../../../src/services/client/MqClient.ts"
import { captureLogs, type CapturedLog } from "../../support/FakeMqClient.ts"

/** One request as the bare server read it: the DEALER's routing id, then the request's frames. */
interface Received {
  readonly peer: Buffer
  readonly frames: ReadonlyArray<Buffer>
}

/** A bare ROUTER on an ephemeral loopback port for the life of the Scope: reads requests, sends whatever a test builds. */
const bareServer = Effect.gen(function*() {
  const router = yield* Effect.acquireRelease(
    Effect.promise(async () => {
      const r = new zmq.Router({ linger: 0 })
      await r.bind("tcp://127.0.0.1:*")
      return r
    }),
    (r) => Effect.sync(() => r.close())
  )
  return {
    endpoint: router.lastEndpoint!,
    next: Effect.map(Effect.promise(() => router.receive()), ([peer, ...frames]): Received => ({ peer: peer!, frames })),
    send: (peer: Buffer, frames: ReadonlyArray<Uint8Array>) => Effect.promise(() => router.send([peer, ...frames]))
  }
})

/** The server and a client of it, both in the test's Scope. */
const pair = (requestTimeoutMs = 60_000) =>
  Effect.gen(function*() {
    const server = yield* bareServer
    const client = yield* makeMqClient({ endpoint: server.endpoint, requestTimeoutMs, lingerMs: 0 })
    return { server, client }
  })

/** The success reply to `req` for `op`, echoing its uid and op frames. */
const okReply = <O extends typeof GetChunkSize | typeof Noop | typeof Ping>(op: O, req: Received, value: unknown) =>
  Effect.orDie(encodeReply(op, req.frames[0]!, req.frames[1]!, value as never))

describe("replies", () => {
  it.live("replies are matched to requests by uid, not by order: the later request answered first gets its own value", () =>
    Effect.gen(function*() {
      const { server, client } = yield* pair()
      const first = yield* Effect.forkChild(client.request(GetChunkSize, []))
      const a = yield* server.next
      const second = yield* Effect.forkChild(client.request(GetChunkSize, []))
      const b = yield* server.next
      assert.deepStrictEqual([a, b].map((r) => [decodeHeaderInt(r.frames[0]!), decodeHeaderInt(r.frames[1]!), r.frames.length]), [
        [0, GetChunkSize.id, 2],
        [1, GetChunkSize.id, 2]
      ])
      assert.strictEqual(client.pendingCount(), 2)
      yield* server.send(b.peer, yield* okReply(GetChunkSize, b, 512))
      assert.strictEqual(yield* Fiber.join(second), 512)
      yield* server.send(a.peer, yield* okReply(GetChunkSize, a, 256))
      assert.strictEqual(yield* Fiber.join(first), 256)
      assert.strictEqual(client.pendingCount(), 0)
    }).pipe(Effect.scoped, Effect.provide(ZmqSocketsLive)))

  it.live("an error reply fails the request with the tagged wire error, detail included", () =>
    Effect.gen(function*() {
      const { server, client } = yield* pair()
      const fiber = yield* Effect.forkChild(client.request(Ping, [null]))
      const req = yield* server.next
      const error = new InvalidArgument({ message: "ping: no such thing", op: "ping", field: "instance_id", expected: "a registered id" })
      yield* server.send(req.peer, encodeErrorReply(req.frames[0]!, req.frames[1]!, error))
      assert.deepStrictEqual(yield* Fiber.await(fiber), Exit.fail(error))
      assert.strictEqual(client.pendingCount(), 0)
    }).pipe(Effect.scoped, Effect.provide(ZmqSocketsLive)))

  it.live("a reply naming another op fails with BadRequest saying the versions differ", () =>
    Effect.gen(function*() {
      const { server, client } = yield* pair()
      const fiber = yield* Effect.forkChild(client.request(GetChunkSize, []))
      const req = yield* server.next
      yield* server.send(req.peer, [req.frames[0]!, pack(Ping.id), pack(true)])
      assert.deepStrictEqual(
        yield* Fiber.await(fiber),
        Exit.fail(new BadRequest({ message: `get_chunk_size: the reply names op ${Ping.id}, expected ${GetChunkSize.id}; the client and server versions differ` }))
      )
    }).pipe(Effect.scoped, Effect.provide(ZmqSocketsLive)))

  it.live("the server's probe (a lone empty frame) is skipped silently, a reply that does not decode is dropped with a WARNING; the real reply after both is delivered", () => {
    const logs: Array<CapturedLog> = []
    return Effect.gen(function*() {
      const { server, client } = yield* pair()
      const fiber = yield* Effect.forkChild(client.request(Noop, []))
      const req = yield* server.next
      yield* server.send(req.peer, [Buffer.alloc(0)])
      yield* server.send(req.peer, [Buffer.from("not a reply")])
      yield* server.send(req.peer, yield* okReply(Noop, req, "OK"))
      assert.strictEqual(yield* Fiber.join(fiber), "OK")
      assert.deepStrictEqual(logs.filter((l) => l.level === "Warn").map((l) => l.text), [
        `dropped a reply from ${server.endpoint} that does not decode (1 frames)`
      ])
    }).pipe(Effect.scoped, Effect.provide(ZmqSocketsLive), Effect.provide(captureLogs(logs)))
  })
})

describe("timeouts and close", () => {
  it.effect("no reply: RequestTimeout at exactly the request's timeout on the Clock, not 1 ms before; the late reply is ignored and the next request gets its own", () =>
    Effect.gen(function*() {
      const { server, client } = yield* pair()
      const fiber = yield* Effect.forkChild(client.request(GetChunkSize, [], { timeoutMs: 1_000 }))
      const late = yield* server.next
      yield* TestClock.adjust("999 millis")
      assert.isUndefined(fiber.pollUnsafe())
      yield* TestClock.adjust("1 millis")
      assert.deepStrictEqual(
        yield* Fiber.await(fiber),
        Exit.fail(new RequestTimeout({ op: "get_chunk_size", endpoint: server.endpoint, timeoutMs: 1_000 }))
      )
      assert.strictEqual(client.pendingCount(), 0)
      yield* server.send(late.peer, yield* okReply(GetChunkSize, late, 1))
      const next = yield* Effect.forkChild(client.request(GetChunkSize, []))
      const req = yield* server.next
      assert.strictEqual(decodeHeaderInt(req.frames[0]!), 1)
      yield* server.send(req.peer, yield* okReply(GetChunkSize, req, 2))
      assert.strictEqual(yield* Fiber.join(next), 2)
    }).pipe(Effect.scoped, Effect.provide(ZmqSocketsLive)))

  it.live("closing the client while a request waits for its reply fails it at once with ClientClosed naming the op", () =>
    Effect.gen(function*() {
      const server = yield* bareServer
      const scope = yield* Scope.make()
      const client = yield* makeMqClient({ endpoint: server.endpoint, lingerMs: 0 }).pipe(Scope.provide(scope))
      const fiber = yield* Effect.forkChild(client.request(Noop, []))
      yield* server.next
      assert.strictEqual(client.pendingCount(), 1)
      yield* Scope.close(scope, Exit.void)
      assert.deepStrictEqual(yield* Fiber.await(fiber), Exit.fail(new ClientClosed({ op: "noop", endpoint: server.endpoint })))
      assert.strictEqual(client.pendingCount(), 0)
    }).pipe(Effect.scoped, Effect.provide(ZmqSocketsLive)))
})
