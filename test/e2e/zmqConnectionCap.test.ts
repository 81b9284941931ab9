/**
 * Issue 24 item 11, the ZeroMQ listener: a local user opening idle connections (no byte sent) to the ZeroMQ
 * endpoint of a real `mpcache serve`. Past `--max-zmq-connections` the newest are shut down at once (counted in
 * status and /metrics); a client connected before keeps being served, the HTTP frontend answers, and once the
 * handshake interval has closed the idle ones a new client gets in.
 */
import { connect, type Socket } from "node:net"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { randomUUID } from "node:crypto"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { decodeReplyHeader, encodeRequest } from "../../src/schema/Frame.ts"
import { Ping } from "../../src/schema/Op.ts"
import { startCli } from "../support/Cli.ts"
import { eventually, getText, statusOf } from "../support/LiveFleet.ts"
import { rawDealer } from "../support/RawDealer.ts"

const CAP = 16
const ATTACKERS = 60

const pingOnce = (d: { send: (f: ReadonlyArray<Uint8Array>) => Effect.Effect<void>; receive: (ms: number) => Effect.Effect<Array<Buffer> | undefined> }, uid: number, timeoutMs: number) =>
  Effect.gen(function*() {
    yield* d.send(yield* Effect.orDie(encodeRequest(Ping, uid, [null])))
    const r = yield* d.receive(timeoutMs)
    const h = r === undefined ? undefined : decodeReplyHeader(r)
    return h?._tag === "Ok" && h.uid === uid
  })

const transports = [
  { name: "tcp", endpoint: () => "tcp://127.0.0.1:*", connectTo: (endpoint: string) => ({ host: "127.0.0.1", port: Number(/:(\d+)$/.exec(endpoint)![1]) }) },
  { name: "ipc", endpoint: () => `ipc://${join(tmpdir(), `mpcache-cap-${randomUUID()}.sock`)}`, connectTo: (endpoint: string) => ({ path: endpoint.slice("ipc://".length) }) }
] as const

describe.each(transports)("idle connections to the ZeroMQ endpoint ($name)", ({ endpoint, connectTo }) => {
  it.live(`past --max-zmq-connections ${CAP} the newest are shut down; the server keeps serving its clients and HTTP`, () =>
    Effect.scoped(Effect.gen(function*() {
      const server = yield* startCli(["serve", "--endpoint", endpoint(), "--http-port", "0", "--no-l1-prefault", "--l1-size-gb", "0.0625", "--max-zmq-connections", String(CAP)])
      const [, httpPort] = yield* server.waitForStderr(/HTTP frontend listening on http:\/\/127\.0\.0\.1:(\d+)/)
      const [, bound] = yield* server.waitForStderr(/MQ server listening on (\S+)/)
      const port = Number(httpPort)
      // A client connected before the attack.
      const client = yield* rawDealer(bound!)
      assert.isTrue(yield* pingOnce(client, 1, 10_000))

      // The attack: idle connections that never send a byte.
      const closed = { count: 0 }
      const sockets = yield* Effect.acquireRelease(
        Effect.sync(() =>
          Array.from({ length: ATTACKERS }, () => {
            const s: Socket = connect(connectTo(bound!))
            s.on("error", () => undefined)
            // Read (and drop) whatever comes, so the end of the stream is seen.
            s.resume()
            s.on("close", () => void closed.count++)
            return s
          })
        ),
        (all) => Effect.sync(() => all.forEach((s) => s.destroy()))
      )
      const expectedRefused = ATTACKERS + 1 - CAP
      for (let i = 0; i < 400 && closed.count < expectedRefused; i++) yield* Effect.sleep("25 millis")
      assert.strictEqual(closed.count, expectedRefused)

      // Still serving: the client from before, the HTTP frontend.
      assert.isTrue(yield* pingOnce(client, 2, 10_000))
      // The server counts a connection's end when its monitor event arrives, a moment after the peer saw it closed.
      const status = yield* eventually(statusOf(port), (s) => s.zmq_connections?.open === CAP, 30_000)
      assert.deepStrictEqual(status.zmq_connections, { open: CAP, max: CAP, refused: expectedRefused })
      const metrics = yield* getText(`http://127.0.0.1:${port}/metrics`)
      assert.match(metrics, new RegExp(`mpcache_connections_refused_total\\{listener="zmq",reason="cap"\\} ${expectedRefused}\\b`))
      assert.match(server.stderr(), new RegExp(`zmq: \\d+ connection\\(s\\) closed at once: \\d+ were open, the cap is ${CAP} \\(--max-zmq-connections\\)`))

      // The idle ones left are closed by the handshake interval; a new client then gets in on its own reconnects.
      for (let i = 0; i < 1200 && closed.count < ATTACKERS; i++) yield* Effect.sleep("25 millis")
      assert.strictEqual(closed.count, ATTACKERS)
      const late = yield* rawDealer(bound!)
      assert.isTrue(yield* pingOnce(late, 3, 20_000))
      assert.strictEqual(sockets.length, ATTACKERS)
    })), 120_000)
})
