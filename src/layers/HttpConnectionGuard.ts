/**
 * The HTTP frontend's connections, bounded (issue 24 item 11). Threat: any local user opening thousands of TCP
 * connections to the HTTP port and sending nothing, so that the server's descriptors run out and new ZeroMQ clients,
 * REGISTERs and HTTP requests fail with EMFILE (22,000 idle connections took all 20,000 descriptors, silently).
 *
 * - A cap on concurrent connections (`--max-http-connections`, a share of the descriptor budget that leaves the
 *   others theirs). A connection past it takes the place of the oldest one waiting for a request (connected, or
 *   idle between requests: nginx's reuse of idle connections), which is closed (`evicted_idle`); when every
 *   connection has a request in flight, the new one is closed at once (`connection_cap`). Either way the accepted
 *   descriptor is closed right away: at most cap + 1 are held.
 * - A connection must send a complete request head within `--http-idle-timeout-seconds` of connecting, or of its
 *   last response on keep-alive (Node's `headersTimeout`, enforced from the connection's start: node's parser
 *   records `last_message_start_` at accept "to protect from a DoS attack where an attacker establishes the
 *   connection without sending any data"), checked every quarter of it: `no_request` when it sent nothing,
 *   `slow_request` when it sent part (a slowloris trickle); 408 then close. The whole request (a body) gets twice
 *   that (`requestTimeout`). Keep-alive connections idle that long are closed (`keepAliveTimeout`, routine,
 *   counted as `keep_alive_idle`, not logged); any socket silent for twice that — an upgraded one Node no longer
 *   parses, a response the client stopped reading — is closed (`inactive`).
 * - A request head over {@link MAX_HEADER_BYTES} is refused with 431 (`header_too_large`); other parse errors with
 *   400 (`bad_request`).
 *
 * Each close for one of these reasons is told to `onClose` (counted by reason, logged rate-limited by the caller).
 * At shutdown the connections waiting for a request are closed with the server (see `closeIdleConnections`).
 * Node's own answers are kept: the 408/431/400 head is written as Node writes it when nobody listens for
 * `clientError` (node lib/_http_server.js `socketOnError`), then the socket is destroyed.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http"
import type { Socket } from "node:net"

/** Why the frontend closed or refused a connection. */
export type HttpCloseReason =
  | "connection_cap"
  | "evicted_idle"
  | "no_request"
  | "slow_request"
  | "header_too_large"
  | "bad_request"
  | "inactive"
  | "keep_alive_idle"

/** The reasons, in the order status lists them. */
export const HTTP_CLOSE_REASONS: ReadonlyArray<HttpCloseReason> = [
  "connection_cap",
  "evicted_idle",
  "no_request",
  "slow_request",
  "header_too_large",
  "bad_request",
  "inactive",
  "keep_alive_idle"
]

/** Bytes a request head may take (Node's default, set explicitly: an upgrade of Node must not raise it). */
export const MAX_HEADER_BYTES = 16_384

/** Headers a request may carry. */
const MAX_HEADERS = 100

export interface HttpConnectionGuardOptions {
  /** Concurrent connections (`--max-http-connections`). */
  readonly maxConnections: number
  /** `--http-idle-timeout-seconds`, in ms. */
  readonly idleTimeoutMs: number
  /** A connection was closed or refused for `reason` (called once per connection). */
  readonly onClose: (reason: HttpCloseReason) => void
}

export interface HttpConnectionStats {
  readonly openConnections: number
  readonly closed: Readonly<Record<HttpCloseReason, number>>
}

export interface GuardedHttpServer {
  readonly server: Server
  readonly stats: () => HttpConnectionStats
}

const responses: Partial<Record<HttpCloseReason, string>> = {
  no_request: "HTTP/1.1 408 Request Timeout\r\nConnection: close\r\n\r\n",
  slow_request: "HTTP/1.1 408 Request Timeout\r\nConnection: close\r\n\r\n",
  header_too_large: "HTTP/1.1 431 Request Header Fields Too Large\r\nConnection: close\r\n\r\n",
  bad_request: "HTTP/1.1 400 Bad Request\r\nConnection: close\r\n\r\n"
}

interface Tracked {
  /** Requests on it whose response has not closed. */
  inFlight: number
  /** Requests it has sent so far. */
  served: number
  upgraded: boolean
  closedFor: HttpCloseReason | undefined
}

/** An `http.Server` with the bounds of the module comment; listen on it as on any other. */
export const makeGuardedHttpServer = (options: HttpConnectionGuardOptions): GuardedHttpServer => {
  const idle = Math.max(1, Math.round(options.idleTimeoutMs))
  const server = createServer({
    maxHeaderSize: MAX_HEADER_BYTES,
    headersTimeout: idle,
    requestTimeout: 2 * idle,
    keepAliveTimeout: idle,
    connectionsCheckingInterval: Math.max(25, Math.min(1_000, Math.floor(idle / 4)))
  })
  server.maxHeadersCount = MAX_HEADERS
  // Socket inactivity; Node also re-arms it after each keep-alive wait.
  server.timeout = 2 * idle
  const tracked = new Map<Socket, Tracked>()
  // Connections waiting for a request, oldest first (a Set keeps insertion order).
  const waiting = new Set<Socket>()
  const closed = Object.fromEntries(HTTP_CLOSE_REASONS.map((r) => [r, 0])) as Record<HttpCloseReason, number>

  const close = (socket: Socket, reason: HttpCloseReason, response?: string): void => {
    const t = tracked.get(socket)
    if (t !== undefined) {
      if (t.closedFor !== undefined) return
      t.closedFor = reason
    }
    closed[reason]++
    options.onClose(reason)
    if (response !== undefined && socket.writable) socket.write(response)
    socket.destroy()
  }

  server.on("connection", (socket: Socket) => {
    const t: Tracked = { inFlight: 0, served: 0, upgraded: false, closedFor: undefined }
    tracked.set(socket, t)
    waiting.add(socket)
    socket.once("close", () => {
      tracked.delete(socket)
      waiting.delete(socket)
    })
    socket.on("timeout", () => close(socket, t.upgraded || t.inFlight > 0 || t.served === 0 ? "inactive" : "keep_alive_idle"))
    if (tracked.size <= options.maxConnections) return
    const oldest = waiting.values().next().value
    if (oldest !== undefined && oldest !== socket) close(oldest, "evicted_idle")
    else close(socket, "connection_cap")
  })

  const onRequest = (request: IncomingMessage, response: ServerResponse): void => {
    const socket = request.socket
    const t = tracked.get(socket)
    if (t === undefined) return
    t.inFlight++
    t.served++
    waiting.delete(socket)
    response.once("close", () => {
      t.inFlight--
      // Back among the waiting, as the newest: keep-alive idle.
      if (t.inFlight === 0 && !socket.destroyed) waiting.add(socket)
    })
  }
  server.on("request", onRequest)
  server.on("checkContinue", onRequest)
  server.on("upgrade", (_request: IncomingMessage, socket: Socket) => {
    const t = tracked.get(socket)
    if (t !== undefined) t.upgraded = true
  })

  server.on("clientError", (error: NodeJS.ErrnoException, socket: Socket) => {
    const reason: HttpCloseReason = error.code === "ERR_HTTP_REQUEST_TIMEOUT"
      ? (socket.bytesRead === 0 ? "no_request" : "slow_request")
      : error.code === "HPE_HEADER_OVERFLOW"
      ? "header_too_large"
      : "bad_request"
    // As Node answers when nobody listens: a head only if no response of this connection has started.
    const current = (socket as Socket & { readonly _httpMessage?: { readonly headersSent?: boolean } })._httpMessage
    close(socket, reason, current?.headersSent === true ? undefined : responses[reason])
  })

  // Shutdown: server.close() closes the connections Node deems idle (node ≥ 19), which leaves out those that never
  // sent a byte (Node's parser tracks them as active from accept); they go too, instead of delaying the exit.
  const closeIdleConnections = server.closeIdleConnections.bind(server)
  server.closeIdleConnections = () => {
    closeIdleConnections()
    for (const socket of [...waiting]) socket.destroy()
  }

  return {
    server,
    stats: () => ({ openConnections: tracked.size, closed: { ...closed } })
  }
}
