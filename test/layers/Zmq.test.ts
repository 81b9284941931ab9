/**
 * The bound ROUTER's receive high-water mark (src/layers/Zmq.ts `bindRouter`, issue 27 item 1), the attack itself
 * on real sockets: a peer that sends as fast as it can while the server reads nothing. With the ROUTER's RCVHWM
 * unbounded (0, as it was), libzmq's I/O thread read everything the peer sent into the server's memory (22 MB/s
 * under a flood while the receive loop waited) and the peer never had to wait; with it bounded the peer's own sends
 * stop once the server holds that many of its messages, so it waits in its own buffers, asleep.
 */
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import * as zmq from "zeromq"
import { ZmqSocketsLive } from "../../src/layers/Zmq.ts"
import { RECEIVE_HIGH_WATER_MARK } from "../../src/services/server/MqServer.ts"
import { DEFAULT_RECEIVE_HIGH_WATER_MARK, ZmqSockets } from "../../src/services/zmq/Sockets.ts"

/** Bytes a message: large enough that the kernel's socket buffers hold only a few of them. */
const MESSAGE_BYTES = 8 * 1024
/** How long a send may wait for room before the path counts as full (a bound on a hang, not a timing). */
const FULL_AFTER_MS = 1_000
/**
 * What the path holds besides the ROUTER's pipe: the DEALER's own pipe (SNDHWM 1), its 16 KiB socket buffer and
 * the message each end's engine has in hand.
 */
const PATH_SLACK = 8

/** Sends `attempts` messages of MESSAGE_BYTES from a DEALER to `endpoint` that nobody reads; how many were taken. */
const sendUntilFull = (endpoint: string, attempts: number) =>
  Effect.acquireUseRelease(
    Effect.sync(() => {
      const d = new zmq.Dealer({ linger: 0, sendHighWaterMark: 1, sendBufferSize: 16 * 1024, sendTimeout: FULL_AFTER_MS })
      d.connect(endpoint)
      return d
    }),
    (d) =>
      Effect.promise(async () => {
        const payload = Buffer.alloc(MESSAGE_BYTES, 7)
        let taken = 0
        for (; taken < attempts; taken++) {
          try {
            await d.send(payload)
          } catch {
            break // EAGAIN after FULL_AFTER_MS: nothing took it
          }
        }
        return taken
      }),
    (d) => Effect.sync(() => d.close())
  )

describe("bindRouter's receive high-water mark", () => {
  it.live("a peer sending to a server that reads nothing is held in its own send once the ROUTER holds its mark", () =>
    Effect.scoped(Effect.gen(function*() {
      const dir = yield* Effect.acquireRelease(
        Effect.sync(() => mkdtempSync(join(tmpdir(), "mpcache-rcvhwm-"))),
        (d) => Effect.sync(() => rmSync(d, { recursive: true, force: true }))
      )
      const sockets = yield* ZmqSockets
      const mark = 100
      const bound = yield* sockets.bindRouter(`ipc://${join(dir, "router")}`, { sendHighWaterMark: 1_000, lingerMs: 0, receiveHighWaterMark: mark })
      // Ten times the mark attempted: unbounded, all of them went in.
      const taken = yield* sendUntilFull(bound.socket.lastEndpoint!, 10 * mark)
      assert.isAtLeast(taken, mark)
      assert.isAtMost(taken, mark + PATH_SLACK)
    }).pipe(Effect.provide(ZmqSocketsLive))), 30_000)

  it("the MQ server's ROUTER holds libzmq's default of 1,000 messages per peer; a ROUTER is never unbounded", () => {
    assert.strictEqual(RECEIVE_HIGH_WATER_MARK, 1_000)
    assert.strictEqual(DEFAULT_RECEIVE_HIGH_WATER_MARK, 1_000)
  })
})
