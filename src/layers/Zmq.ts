/**
 * ZeroMQ sockets as scoped resources (DESIGN §2: sockets are acquired with
 * acquireRelease inside Layers). Raw socket options live here and nowhere
 * else; see shared/zeromq-notes.md for the measured behaviour behind each.
 */
import { rmSync } from "node:fs"
import { Effect, Layer, Scope } from "effect"
import * as zmq from "zeromq"
import { type DealerOptions, type RouterOptions, ZmqError, ZmqSockets } from "../services/zmq/Sockets.ts"

/** libzmq's ZMQ_ROUTER_NOTIFY (draft option 97): 1 = connect, 2 = disconnect. */
const ZMQ_ROUTER_NOTIFY = 97

/** Turns on connect/disconnect notifications; zeromq.js keeps the setter protected, so one narrow cast here. */
const setRouterNotify = (router: zmq.Router): void => {
  ;(router as unknown as { setInt32Option(option: number, value: number): void }).setInt32Option(ZMQ_ROUTER_NOTIFY, 3)
}

/**
 * Binds a ROUTER to `endpoint` for the life of the current Scope. Replies are
 * `mandatory` with a zero send timeout, so a reply to a vanished peer or one
 * over its high-water mark fails at once (counted, logged at DEBUG) instead
 * of blocking the one send path. ZMTP heartbeats stay off (DESIGN §5).
 *
 * Fails with `ZmqError` (op "bind") when the endpoint is taken or invalid.
 */
export const bindRouter = (
  endpoint: string,
  options: RouterOptions
): Effect.Effect<zmq.Router, ZmqError, Scope.Scope> =>
  Effect.acquireRelease(
    Effect.tryPromise({
      try: async () => {
        const router = new zmq.Router({
          linger: options.lingerMs,
          mandatory: true,
          sendTimeout: 0,
          sendHighWaterMark: options.sendHighWaterMark,
          receiveHighWaterMark: 0
        })
        setRouterNotify(router)
        try {
          await router.bind(endpoint)
        } catch (e) {
          router.close()
          throw e
        }
        return router
      },
      catch: (cause) => new ZmqError({ op: "bind", endpoint, cause })
    }),
    (router) =>
      Effect.sync(() => {
        router.close()
        // libzmq may leave the socket file of an ipc endpoint behind when the process exits right after close.
        if (endpoint.startsWith("ipc://")) rmSync(endpoint.slice("ipc://".length), { force: true })
      })
  )

/**
 * Connects a DEALER to `endpoint` for the life of the current Scope. The
 * ROUTER assigns the routing id (zeromq-notes: never set it ourselves).
 * Fails with `ZmqError` (op "connect") on a malformed endpoint; an
 * unreachable server is not an error here (ZeroMQ reconnects by itself).
 */
export const connectDealer = (
  endpoint: string,
  options: DealerOptions
): Effect.Effect<zmq.Dealer, ZmqError, Scope.Scope> =>
  Effect.acquireRelease(
    Effect.try({
      try: () => {
        const dealer = new zmq.Dealer({
          linger: options.lingerMs,
          connectTimeout: options.connectTimeoutMs,
          reconnectInterval: options.reconnectIntervalMs,
          reconnectMaxInterval: options.reconnectMaxIntervalMs,
          sendHighWaterMark: 0,
          receiveHighWaterMark: 0
        })
        try {
          dealer.connect(endpoint)
        } catch (e) {
          dealer.close()
          throw e
        }
        return dealer
      },
      catch: (cause) => new ZmqError({ op: "connect", endpoint, cause })
    }),
    (dealer) => Effect.sync(() => dealer.close())
  )

/** The `ZmqSockets` service over the two acquirers above. */
export const ZmqSocketsLive: Layer.Layer<ZmqSockets> = Layer.succeed(ZmqSockets, ZmqSockets.of({ bindRouter, connectDealer }))
