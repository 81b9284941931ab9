/**
 * The HTTP frontend's connection bounds (src/layers/HttpConnectionGuard.ts, issue 24 item 11) on a real
 * `http.Server` on loopback with real TCP clients: which connection a new one displaces, the refusal when every
 * connection is busy, keep-alive connections rejoining the waiting ones, the reason of every close, and a shutdown
 * that does not wait for connections that never sent a byte. Waits are for events (a close, a response).
 */
import { type IncomingMessage, type ServerResponse } from "node:http"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { connectRawTcp, type RawTcpConnection, within } from "../support/RawTcp.ts"
import { type GuardedHttpServer, type HttpCloseReason, makeGuardedHttpServer } from "../../src/layers/HttpConnectionGuard.ts"

/**
 * A guarded server with `handler` on an ephemeral port, and its closes in order; closed with the scope. `held`
 * requests (path /hold) are answered only when the test says so.
 */
const serve = (maxConnections: number, idleTimeoutMs: number) =>
  Effect.gen(function*() {
    const closes: Array<HttpCloseReason> = []
    // Held responses by the client's port.
    const held = new Map<number, ServerResponse>()
    const guard: GuardedHttpServer = makeGuardedHttpServer({ maxConnections, idleTimeoutMs, onClose: (r) => void closes.push(r) })
    guard.server.on("request", (request: IncomingMessage, response: ServerResponse) => {
      if (request.url === "/hold") held.set(request.socket.remotePort!, response)
      else response.end("ok")
    })
    const port = yield* Effect.acquireRelease(
      Effect.promise(() => new Promise<number>((resolve) => guard.server.listen(0, "127.0.0.1", () => resolve((guard.server.address() as { port: number }).port)))),
      () =>
        Effect.promise(() =>
          new Promise<void>((resolve) => {
            for (const response of held.values()) response.end()
            guard.server.close(() => resolve())
          })
        )
    )
    const client = (): Effect.Effect<RawTcpConnection> => connectRawTcp(port)
    /** Resolves once the server has `n` connections (its own view). */
    const connections = (n: number) =>
      Effect.promise(async () => {
        while (guard.stats().openConnections !== n) await new Promise((resolve) => setImmediate(resolve))
      })
    return { guard, closes, held, client, connections }
  })

const request = (c: RawTcpConnection, path: string) => c.socket.write(`GET ${path} HTTP/1.1\r\nHost: x\r\n\r\n`)

/** Resolves once `c` has received `text`. */
const receivedText = (c: RawTcpConnection, text: string) =>
  Effect.promise(async () => {
    while (!c.received().includes(text)) await new Promise((resolve) => setImmediate(resolve))
  })

describe("HttpConnectionGuard", () => {
  it.live("past the cap, the oldest connection waiting for a request is closed; one with a request in flight never is", () =>
    Effect.scoped(Effect.gen(function*() {
      const s = yield* serve(3, 60_000)
      const a = yield* s.client()
      request(a, "/hold")
      const b = yield* s.client()
      const c = yield* s.client()
      yield* s.connections(3)
      yield* Effect.promise(async () => {
        while (s.held.size !== 1) await new Promise((resolve) => setImmediate(resolve))
      })
      // A holds a request; B is the oldest waiting: D takes its place.
      const d = yield* s.client()
      yield* within(b.closed, 10_000, "B closed")
      assert.deepStrictEqual(s.closes, ["evicted_idle"])
      assert.isFalse(a.socket.destroyed)
      // Every connection busy: a new one is refused at once.
      request(c, "/hold")
      request(d, "/hold")
      yield* Effect.promise(async () => {
        while (s.held.size !== 3) await new Promise((resolve) => setImmediate(resolve))
      })
      const e = yield* s.client()
      yield* within(e.closed, 10_000, "E closed")
      assert.deepStrictEqual(s.closes, ["evicted_idle", "connection_cap"])
      assert.deepStrictEqual(s.guard.stats().closed.connection_cap, 1)
      // Answered, A is waiting again, now the newest of the waiting: C's answer makes C the oldest … then A.
      s.held.get(a.socket.localPort!)!.end("done")
      yield* receivedText(a, "done")
      s.held.get(c.socket.localPort!)!.end("done")
      yield* receivedText(c, "done")
      const f = yield* s.client()
      yield* within(a.closed, 10_000, "A (oldest waiting) closed")
      assert.deepStrictEqual(s.closes, ["evicted_idle", "connection_cap", "evicted_idle"])
      assert.isFalse(c.socket.destroyed || d.socket.destroyed || f.socket.destroyed)
    })), 30_000)

  it.live("each close is told with its reason: nothing sent, a slow head, a head over 16 KiB, a malformed request, keep-alive idle", () =>
    Effect.scoped(Effect.gen(function*() {
      const s = yield* serve(16, 300)
      const silent = yield* s.client()
      const slow = yield* s.client()
      slow.socket.write("GET / HTTP/1.1\r\nHost: x\r\n")
      const large = yield* s.client()
      large.socket.write(`GET / HTTP/1.1\r\nHost: x\r\nX-Big: ${"b".repeat(17_000)}\r\n\r\n`)
      const malformed = yield* s.client()
      malformed.socket.write("NOT HTTP AT ALL\r\n\r\n")
      const kept = yield* s.client()
      request(kept, "/")
      yield* within(Promise.all([silent, slow, large, malformed, kept].map((c) => c.closed)), 15_000, "every connection closed")
      assert.deepStrictEqual(
        [silent, slow, large, malformed].map((c) => c.received().split("\r\n")[0]),
        ["HTTP/1.1 408 Request Timeout", "HTTP/1.1 408 Request Timeout", "HTTP/1.1 431 Request Header Fields Too Large", "HTTP/1.1 400 Bad Request"]
      )
      assert.match(kept.received(), /^HTTP\/1\.1 200 OK\r\n[\s\S]*ok$/)
      assert.deepStrictEqual([...s.closes].sort(), ["bad_request", "header_too_large", "keep_alive_idle", "no_request", "slow_request"])
      const { closed } = s.guard.stats()
      assert.deepStrictEqual(
        [closed.no_request, closed.slow_request, closed.header_too_large, closed.bad_request, closed.keep_alive_idle, closed.evicted_idle, closed.connection_cap],
        [1, 1, 1, 1, 1, 0, 0]
      )
    })), 30_000)

  it.live("closing the server does not wait for connections that never sent a byte", () =>
    Effect.gen(function*() {
      const closes: Array<HttpCloseReason> = []
      const guard = makeGuardedHttpServer({ maxConnections: 8, idleTimeoutMs: 120_000, onClose: (r) => void closes.push(r) })
      const port = yield* Effect.promise(() => new Promise<number>((resolve) => guard.server.listen(0, "127.0.0.1", () => resolve((guard.server.address() as { port: number }).port))))
      const { closed } = yield* connectRawTcp(port)
      yield* Effect.promise(async () => {
        while (guard.stats().openConnections !== 1) await new Promise((resolve) => setImmediate(resolve))
      })
      // Without the guard, close() would wait for the 120 s head timeout.
      yield* within(new Promise<void>((resolve) => guard.server.close(() => resolve())), 10_000, "server closed")
      yield* within(closed, 10_000, "client saw the close")
      assert.deepStrictEqual(closes, [])
    }), 30_000)
})
