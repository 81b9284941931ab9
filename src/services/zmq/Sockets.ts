/**
 * ZeroMQ sockets as a service (DESIGN §2): the MQ server and the MQ client
 * ask this tag for their ROUTER and DEALER, and `src/layers/Zmq.ts`
 * provides it — raw socket options and `acquireRelease` live there, so no
 * service imports `src/layers`. Shared by server and client; holds no state.
 */
import { Context, Schema } from "effect"
import type { Effect, Scope } from "effect"
import type * as zmq from "zeromq"

/** A ZeroMQ call failed. `op` names the call (bind, connect, send, receive). */
export class ZmqError extends Schema.TaggedError<ZmqError>()("ZmqError", {
  op: Schema.String,
  endpoint: Schema.String,
  cause: Schema.Defect()
}) {
  override get message(): string {
    const c = this.cause
    return `zeromq ${this.op} on ${this.endpoint} failed: ${c instanceof Error ? c.message : String(c)}`
  }
}

/** Options of the server's ROUTER. */
export interface RouterOptions {
  /** Messages queued per peer before replies to it are dropped (and counted). */
  readonly sendHighWaterMark: number
  /** Milliseconds close() waits to flush the last replies at shutdown. */
  readonly lingerMs: number
}

/** Options of a client DEALER. */
export interface DealerOptions {
  /** Milliseconds to wait for a TCP connect before retrying (LMCache #4670: never the OS SYN timeout). */
  readonly connectTimeoutMs: number
  /** First reconnect delay in milliseconds. */
  readonly reconnectIntervalMs: number
  /** Reconnect delay cap in milliseconds. */
  readonly reconnectMaxIntervalMs: number
  /** Milliseconds close() may wait to flush unsent requests, so a process with an unreachable server still exits. */
  readonly lingerMs: number
}

/**
 * Opens ZeroMQ sockets for the life of the caller's Scope.
 *
 * - `bindRouter(endpoint, options)`: a ROUTER with connect/disconnect
 *   notifications on (ZMQ_ROUTER_NOTIFY, DESIGN §5), mandatory routing and a
 *   zero send timeout (an undeliverable reply fails at once). Fails with
 *   `ZmqError` (op "bind") when the endpoint is taken or invalid.
 * - `connectDealer(endpoint, options)`: a DEALER whose routing id the ROUTER
 *   assigns. Fails with `ZmqError` (op "connect") on a malformed endpoint;
 *   an unreachable server is not an error (ZeroMQ reconnects by itself).
 *
 * Closing the Scope closes the socket with its linger.
 * Provided by `ZmqSocketsLive` in `src/layers/Zmq.ts`.
 */
export class ZmqSockets extends Context.Service<ZmqSockets, {
  readonly bindRouter: (endpoint: string, options: RouterOptions) => Effect.Effect<zmq.Router, ZmqError, Scope.Scope>
  readonly connectDealer: (endpoint: string, options: DealerOptions) => Effect.Effect<zmq.Dealer, ZmqError, Scope.Scope>
}>()("mpcache/services/zmq/ZmqSockets") {}
