/**
 * Issue 24 item 11 (HTTP), performed against a child `mpcache serve --max-http-connections 8`: a local user opens
 * more idle TCP connections to the HTTP port than the cap and sends nothing; idle connections outlive the idle
 * timeout; a slowloris trickles a request head; another sends a 20 KiB header. The server closes the oldest idle
 * connections as soon as the cap is passed, the others once the idle timeout passes, cuts the slow head (408) and the
 * large one (431), counts every close by reason in /api/status and /metrics and logs it once per reason — while a
 * ZeroMQ PING and an HTTP /api/healthcheck from other clients are answered. Every wait is for the event itself (a
 * socket's close, a reply); deadlines only bound a hang.
 */
import { Agent, get } from "node:http"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { Ping } from "../../src/schema/Op.ts"
import { makeMqClient } from "../../src/services/client/MqClient.ts"
import { ZmqSocketsLive } from "../../src/layers/Zmq.ts"
import { decodeStatusDocument } from "../../src/schema/Status.ts"
import { getText, ipcEndpoint, startServer, statusOf } from "../support/LiveFleet.ts"
import { rawTcpConnection, type RawTcpConnection, within } from "../support/RawTcp.ts"

const CAP = 8
const flags = (idleSeconds: number) => [
  "--no-l1-prefault",
  "--l1-size-gb",
  "0.0625",
  "--max-http-connections",
  String(CAP),
  "--http-idle-timeout-seconds",
  String(idleSeconds)
]

/** GET `path` through `agent` (default: a connection of its own, closed after the reply): status and body. */
const getOnce = (port: number, path: string, agent: Agent | false = false) =>
  Effect.promise(() =>
    new Promise<readonly [number, string]>((resolve, reject) => {
      get({ host: "127.0.0.1", port, path, agent }, (res) => {
        let body = ""
        res.on("data", (d: Buffer) => (body += d.toString()))
        res.on("end", () => resolve([res.statusCode ?? 0, body]))
      }).on("error", reject)
    })
  )

const pingOverZeroMq = (endpoint: string) =>
  Effect.gen(function*() {
    const client = yield* makeMqClient({ endpoint, requestTimeoutMs: 10_000, lingerMs: 0 })
    return yield* client.request(Ping, [null])
  }).pipe(Effect.scoped)

const metricOf = (text: string, reason: string) =>
  Number(new RegExp(`^mpcache_http_connections_closed_total\\{reason="${reason}"\\} (\\d+)`, "m").exec(text)?.[1] ?? "0")

describe("HTTP connections that hold descriptors (issue 24 item 11)", () => {
  it.live("idle connections past the cap: the oldest are closed at once; ZeroMQ PING and /api/healthcheck are served throughout", () =>
    Effect.scoped(Effect.gen(function*() {
      const endpoint = ipcEndpoint()
      // An idle timeout longer than the test: here only the cap closes connections.
      const { server, httpPort } = yield* startServer(endpoint, flags(120))
      // 12 idle connections, opened one after another: the 9th to 12th each take the place of the oldest.
      const idle: Array<RawTcpConnection> = []
      for (let i = 0; i < CAP + 4; i++) idle.push(yield* rawTcpConnection(httpPort))
      yield* within(Promise.all(idle.slice(0, 4).map((c) => c.closed)), 20_000, "the 4 oldest idle connections closed")
      const stillOpen = () => idle.map((c) => !c.socket.destroyed && c.socket.readyState === "open")
      assert.deepStrictEqual(stillOpen(), [false, false, false, false, ...Array(CAP).fill(true)])
      // The cap is full of idle connections: ZeroMQ is not affected, and an HTTP client is served (it takes an idle
      // one's place). It keeps its one connection for the status request after it.
      assert.isTrue(yield* pingOverZeroMq(endpoint))
      const client = new Agent({ keepAlive: true, maxSockets: 1 })
      yield* Effect.addFinalizer(() => Effect.sync(() => client.destroy()))
      assert.deepStrictEqual(yield* getOnce(httpPort, "/api/healthcheck", client), [200, `{"status":"healthy"}`])
      yield* within(idle[4]!.closed, 20_000, "the oldest remaining idle connection closed for the healthcheck")
      assert.deepStrictEqual(stillOpen(), [...Array(5).fill(false), ...Array(CAP - 1).fill(true)])
      // Closed without a word: they never asked for anything.
      assert.deepStrictEqual(idle.map((c) => c.received()), Array(CAP + 4).fill(""))
      const [code, body] = yield* getOnce(httpPort, "/api/status", client)
      assert.strictEqual(code, 200)
      const status = yield* Effect.orDie(decodeStatusDocument(JSON.parse(body)))
      assert.deepStrictEqual([status.http.max_connections, status.http.idle_timeout_seconds], [CAP, 120])
      assert.deepStrictEqual(
        [status.http.open_connections, status.http.closed.evicted_idle, status.http.closed.no_request, status.http.closed.connection_cap],
        [CAP, 5, 0, 0]
      )
      const metrics = yield* getText(`http://127.0.0.1:${httpPort}/metrics`)
      assert.isAtLeast(metricOf(metrics, "evicted_idle"), 5)
      // Told once (the rest of its 10 s window is one more line at the window's end).
      const lines = server.stderr().split("\n").filter((l) => /HTTP frontend closed the oldest connection waiting for a request to admit a new one: 8 \(--max-http-connections\) were open/.test(l))
      assert.strictEqual(lines.length, 1)
      assert.isTrue(yield* pingOverZeroMq(endpoint))
    }).pipe(Effect.provide(ZmqSocketsLive))), 90_000)

  it.live("idle connections are closed once the idle timeout passes (408), having sent nothing; counted and told once", () =>
    Effect.scoped(Effect.gen(function*() {
      const endpoint = ipcEndpoint()
      const { server, httpPort } = yield* startServer(endpoint, flags(1))
      const idle: Array<RawTcpConnection> = []
      for (let i = 0; i < 4; i++) idle.push(yield* rawTcpConnection(httpPort))
      yield* within(Promise.all(idle.map((c) => c.closed)), 20_000, "every idle connection closed")
      assert.deepStrictEqual(idle.map((c) => c.received()), Array(4).fill("HTTP/1.1 408 Request Timeout\r\nConnection: close\r\n\r\n"))
      const status = yield* statusOf(httpPort)
      assert.deepStrictEqual([status.http.closed.no_request, status.http.closed.evicted_idle], [4, 0])
      assert.strictEqual(metricOf(yield* getText(`http://127.0.0.1:${httpPort}/metrics`), "no_request"), 4)
      const lines = server.stderr().split("\n").filter((l) => /HTTP frontend closed a connection that sent nothing within 1 s \(--http-idle-timeout-seconds\) of connecting/.test(l))
      assert.strictEqual(lines.length, 1)
      assert.isTrue(yield* pingOverZeroMq(endpoint))
    }).pipe(Effect.provide(ZmqSocketsLive))), 90_000)

  it.live("a slowloris head is cut with 408 and a 20 KiB header refused with 431, each counted; others are served meanwhile", () =>
    Effect.scoped(Effect.gen(function*() {
      const endpoint = ipcEndpoint()
      const { httpPort } = yield* startServer(endpoint, flags(1))
      const slow = yield* rawTcpConnection(httpPort)
      const head = "GET /api/healthcheck HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "
      let sent = 0
      // One byte every 100 ms: the connection is never silent, but its head never completes.
      const trickle = setInterval(() => {
        if (!slow.socket.destroyed) slow.socket.write(sent < head.length ? head[sent++]! : "a")
      }, 100)
      yield* Effect.addFinalizer(() => Effect.sync(() => clearInterval(trickle)))
      const big = yield* rawTcpConnection(httpPort)
      big.socket.write(`GET /api/healthcheck HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: ${"b".repeat(20 * 1024)}\r\n\r\n`)
      yield* within(big.closed, 20_000, "the large header's connection closed")
      assert.strictEqual(big.received(), "HTTP/1.1 431 Request Header Fields Too Large\r\nConnection: close\r\n\r\n")
      assert.isTrue(yield* pingOverZeroMq(endpoint))
      assert.deepStrictEqual(yield* getOnce(httpPort, "/api/healthcheck"), [200, `{"status":"healthy"}`])
      yield* within(slow.closed, 20_000, "the slowloris connection closed")
      assert.isAbove(sent, 0)
      assert.strictEqual(slow.received(), "HTTP/1.1 408 Request Timeout\r\nConnection: close\r\n\r\n")
      const status = yield* statusOf(httpPort)
      assert.deepStrictEqual([status.http.closed.slow_request, status.http.closed.header_too_large], [1, 1])
      const metrics = yield* getText(`http://127.0.0.1:${httpPort}/metrics`)
      assert.deepStrictEqual([metricOf(metrics, "slow_request"), metricOf(metrics, "header_too_large")], [1, 1])
    }).pipe(Effect.provide(ZmqSocketsLive))), 90_000)
})
