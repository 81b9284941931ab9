/**
 * ZeroMQ sockets as a service (DESIGN §2): the MQ server and the MQ client
 * ask this tag for their ROUTER and DEALER, and `src/layers/Zmq.ts`
 * provides it — raw socket options and `acquireRelease` live there, so no
 * service imports `src/layers`. Shared by server and client; holds no state.
 */
import { statSync } from "node:fs"
import { dirname } from "node:path"
import { inspect } from "node:util"
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
    // A cause that is no Error (zeromq.js may reject with a plain object) is shown as inspect shows it.
    return `zeromq ${this.op} on ${this.endpoint} failed: ${c instanceof Error ? c.message : inspect(c)}`
  }
}

/**
 * Why an `ipc://` endpoint's directory is unsafe, or undefined: a directory
 * anyone may write without the sticky bit lets another user replace the
 * socket file (and so sit between the server and its clients). A sticky one
 * such as /tmp does not: nobody else can remove or rename our file there.
 */
export const unsafeIpcDirectory = (endpoint: string): string | undefined => {
  if (!endpoint.startsWith("ipc://")) return undefined
  const dir = dirname(endpoint.slice("ipc://".length))
  let mode: number
  try {
    mode = statSync(dir).mode
  } catch (e) {
    return `the directory ${dir} of the ipc socket cannot be read: ${e instanceof Error ? e.message : String(e)}`
  }
  return (mode & 0o002) !== 0 && (mode & 0o1000) === 0
    ? `the directory ${dir} of the ipc socket is world-writable without the sticky bit (anyone could replace the socket file); use a directory only the server's user (and group) may write`
    : undefined
}

/**
 * Why a client's handshake failed (counted in `mpcache_auth_failures_total{reason}`):
 * `mechanism`: it did not speak CURVE (ZMTP mechanism mismatch); `auth`: the
 * ZAP handler refused it; `protocol`: another handshake error (a bad key, a
 * malformed greeting).
 */
export type HandshakeFailureReason = "mechanism" | "auth" | "protocol"

/**
 * A failed handshake as a socket's monitor reports it; `address` is the
 * endpoint (a ROUTER's bound one: libzmq names no peer there).
 */
export interface HandshakeFailure {
  readonly reason: HandshakeFailureReason
  readonly address: string
  /** libzmq's error code, e.g. ERR_ZMTP_MECHANISM_MISMATCH; "" when none. */
  readonly code: string
  /** The ZAP status code a refused client was sent (RFC 27: 300, 400, 500); only with reason `auth`, on the client side. */
  readonly status?: number
}

/** CURVE on a ROUTER: its secret key (Z85) and the ZAP domain its handshakes are checked in. */
export interface RouterCurve {
  readonly secretKey: string
  readonly zapDomain: string
}

/** Options of the server's ROUTER. */
export interface RouterOptions {
  /** Messages queued per peer before replies to it are dropped (and counted). */
  readonly sendHighWaterMark: number
  /**
   * ZMQ_RCVHWM: messages the ROUTER's pipe from one peer holds before libzmq stops reading that peer's connection
   * (its sends then wait: back-pressure reaches the sender). Default {@link DEFAULT_RECEIVE_HIGH_WATER_MARK}.
   * Never 0 (unbounded): a peer sending faster than the server reads would grow the server's native memory without
   * limit (issue 27 item 1: 22 MB/s under a flood while the receive loop was braked).
   */
  readonly receiveHighWaterMark?: number
  /** Milliseconds close() waits to flush the last replies at shutdown. */
  readonly lingerMs: number
  /**
   * CURVE server mode with ZAP enforced (ZMQ_ZAP_ENFORCE_DOMAIN: no ZAP
   * handler means no handshake succeeds). Absent: the NULL mechanism.
   */
  readonly curve?: RouterCurve
  /**
   * Mode of an `ipc://` socket file, set right after bind (the bind itself
   * runs under a 0177 umask, so the file is never more open). Default 0o600.
   */
  readonly ipcMode?: number
  /** Group (gid) the `ipc://` socket file is chowned to (with `ipcMode` 0o660). */
  readonly ipcGroupId?: number
  /** Told of every failed client handshake (the ROUTER's monitor events). */
  readonly onHandshakeFailure?: (failure: HandshakeFailure) => Effect.Effect<void>
  /** Told of every connection the ROUTER's listener accepts and of every accepted connection's end (its monitor events). */
  readonly onConnectionEvent?: (event: "accepted" | "ended") => Effect.Effect<void>
}

/** libzmq's own default ZMQ_RCVHWM: what a bound ROUTER holds per peer unless told otherwise. */
export const DEFAULT_RECEIVE_HIGH_WATER_MARK = 1_000

/**
 * One ZAP/1.0 request (RFC 27) as libzmq sends it to the handler at
 * `inproc://zeromq.zap.01`. `address` is the peer's IP address only (no
 * port; empty for ipc), `identity` the server socket's own routing id, so
 * neither tells one connection from another of the same host.
 */
export interface ZapRequest {
  readonly version: string
  readonly requestId: Buffer
  readonly domain: string
  readonly address: string
  readonly identity: Buffer
  /** "NULL", "PLAIN" or "CURVE". */
  readonly mechanism: string
  /** CURVE: one frame, the client's 32-byte public key. */
  readonly credentials: ReadonlyArray<Buffer>
}

/** The ZAP reply: "200" accepts the handshake; "400" refuses it (the client gets nothing). */
export interface ZapReply {
  readonly statusCode: "200" | "400" | "500"
  readonly statusText: string
  /** ZAP user id (libzmq attaches it to messages; zeromq.js does not expose it). */
  readonly userId: string
}

/**
 * The server's bound ROUTER with the controls its routing-id guard needs (issue 24 item 1;
 * src/services/zmq/RoutingIds.ts). libzmq 4.3 generates a peer's routing id as a zero byte and a
 * 32-bit counter when the peer sets none, and aborts the process when the id it generates is already held — by a
 * peer that chose it. The server therefore learns where the counter stands (a probe: an in-process DEALER whose
 * id the ROUTER generates) and removes a peer that chose an id the counter has not reached yet (a kick).
 */
export interface BoundRouter {
  readonly socket: zmq.Router
  /** The first routing id this ROUTER generated (a probe's, before any peer could connect): its 32-bit counter, as a number. */
  readonly firstGeneratedId: number
  /**
   * Connects an in-process DEALER (no routing id of its own: the ROUTER generates one) and sends `[marker]` on it;
   * the ROUTER's receive then yields `[generated id, marker]`. Close the handle once that message has arrived.
   */
  readonly openProbe: (marker: Buffer) => { readonly close: () => void }
  /**
   * Takes `routingId` away from the peer that holds it: for one command-processing step the ROUTER hands routing
   * ids over (ZMQ_ROUTER_HANDOVER), an in-process DEALER claims the id (the holder's pipe is terminated), then the
   * handover is off again and that DEALER closes, freeing the id. The kicked peer's connection gets no more service.
   */
  readonly kick: (routingId: Buffer) => void
}

/** Options of a bound PUB (the KV event stream, issue 28 item 4). */
export interface PublisherOptions {
  /** Messages queued per subscriber; past it libzmq drops that subscriber's messages (PUB never blocks). */
  readonly sendHighWaterMark: number
  /** CURVE server mode with ZAP enforced in `curve.zapDomain`; absent: the NULL mechanism. */
  readonly curve?: RouterCurve
  /** Told of every connection the PUB's listener accepts and of every accepted connection's end. */
  readonly onConnectionEvent?: (event: "accepted" | "ended") => Effect.Effect<void>
}

/** A client's CURVE keys, Z85: the server's public key and the client's own pair. */
export interface DealerCurve {
  readonly serverPublicKey: string
  readonly secretKey: string
  readonly publicKey: string
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
  /** CURVE client mode; absent: the NULL mechanism. */
  readonly curve?: DealerCurve
  /**
   * Told of every handshake's outcome (the DEALER's monitor events, watched
   * from before the connect): a `HandshakeFailure`, or undefined when one
   * succeeded. Lets a client say why the server does not answer.
   */
  readonly onHandshake?: (failure: HandshakeFailure | undefined) => Effect.Effect<void>
}

/**
 * Opens ZeroMQ sockets for the life of the caller's Scope.
 *
 * - `bindRouter(endpoint, options)`: a ROUTER with connect/disconnect
 *   notifications on (ZMQ_ROUTER_NOTIFY, DESIGN §5), mandatory routing and a
 *   zero send timeout (an undeliverable reply fails at once), its generated
 *   routing ids unpredictable and probed ({@link BoundRouter}). Fails with
 *   `ZmqError` (op "bind") when the endpoint is taken or invalid.
 * - `connectDealer(endpoint, options)`: a DEALER whose routing id the ROUTER
 *   assigns. Fails with `ZmqError` (op "connect") on a malformed endpoint;
 *   an unreachable server is not an error (ZeroMQ reconnects by itself).
 * - `sendWithin(dealer, frames, timeoutMs)`: one send that waits at most
 *   `timeoutMs` (> 0) for a connection to queue on: true when sent, false
 *   when none came in time. A DEALER whose handshake was refused has no
 *   connection at all, and libzmq does not retry it, so an unbounded send
 *   would never return (issue 14). The send itself cannot be interrupted
 *   (zeromq.js: a pending send left behind makes the next one EBUSY), so
 *   this bound is what ends it. Fails with `ZmqError` (op "send") on any
 *   other refusal, e.g. a closed socket.
 *
 * - `bindPublisher(endpoint, options)`: a PUB (linger 0, an ipc socket file
 *   0600) that drops a subscriber's messages past its high-water mark and
 *   never blocks the sender. Fails with `ZmqError` (op "bind") when the
 *   endpoint is taken or invalid, or its ipc directory is unsafe.
 * - `serveZap(authenticate)`: binds the ZAP handler socket at
 *   `inproc://zeromq.zap.01` in the default context (do it before the
 *   ROUTER binds) and answers each request with `authenticate`'s reply.
 *   One per process: a second fails with `ZmqError` (op "bind").
 *
 * Closing the Scope closes the socket with its linger.
 * Provided by `ZmqSocketsLive` in `src/layers/Zmq.ts`.
 */
export class ZmqSockets extends Context.Service<ZmqSockets, {
  readonly bindRouter: (endpoint: string, options: RouterOptions) => Effect.Effect<BoundRouter, ZmqError, Scope.Scope>
  readonly connectDealer: (endpoint: string, options: DealerOptions) => Effect.Effect<zmq.Dealer, ZmqError, Scope.Scope>
  readonly sendWithin: (dealer: zmq.Dealer, frames: ReadonlyArray<Buffer>, timeoutMs: number) => Effect.Effect<boolean, ZmqError>
  readonly bindPublisher: (endpoint: string, options: PublisherOptions) => Effect.Effect<zmq.Publisher, ZmqError, Scope.Scope>
  readonly serveZap: (authenticate: (request: ZapRequest) => Effect.Effect<ZapReply>) => Effect.Effect<void, ZmqError, Scope.Scope>
}>()("mpcache/services/zmq/ZmqSockets") {}
