/**
 * The HTTP frontend (DESIGN §7; upstream `http_server.py`):
 *   GET /                 the live status page (StatusPage.ts, issue 17): HTML polling /api/status every second
 *   GET /api/healthcheck  200 {"status":"healthy"} while the server runs
 *   GET /livez            200 {"status":"live",…} or 503 "not_live": the process answers and its
 *                         event loop is not stalled past a bound (services/server/Readiness.ts)
 *   GET /readyz           200 {"status":"ready",…} or 503 "not_ready": MQ bound, L1 allocated, the
 *                         reaper scanned within two periods, the fd socket listens when configured;
 *                         the L2 breaker reported, never fatal (issue 27 item 3)
 *   GET /api/status       version, endpoint, chunk size, pools, uptime, readiness (+ module blocks)
 *   GET /api/l1/chunks    ?model=M: the chunks L1 holds (L1Listing.ts, issue 28 item 6), the KV index audit's
 *                         truth; with tenancy on only behind --http-token-file (403 without one)
 *   GET /metrics          Prometheus text: every declared series from the start, at 0 until it moves
 *                         (services/metrics/Series.ts, issue 25 item 6)
 * Bound to `--http-host`/`--http-port` (port 0 picks a free one; the bound
 * address is logged). Its connections are bounded (HttpConnectionGuard.ts,
 * issue 24 item 11): `--max-http-connections` at once, each closed when it
 * sends no complete request head within `--http-idle-timeout-seconds`;
 * every such close counted by reason and logged at most once per reason per
 * 10 s.
 */
import { NodeHttpServer } from "@effect/platform-node"
import { Clock, Context, Effect, Layer, Option } from "effect"
import { HttpRouter, HttpServer, HttpServerRequest, HttpServerResponse } from "effect/http"
import { PrometheusMetrics } from "effect/observability"
import { bearerCheck, readTokenFile } from "../services/auth/BearerToken.ts"
import { MqServer, RECEIVE_HIGH_WATER_MARK, SEND_HIGH_WATER_MARK } from "../services/server/MqServer.ts"
import { BACKED_UP_BURST, BACKED_UP_MESSAGES_PER_SECOND } from "../services/server/internal/ReceiveBrake.ts"
import { MAX_INBOUND_BYTES_PER_PEER, MAX_INBOUND_MESSAGES_PER_PEER } from "../services/server/internal/PeerQueues.ts"
import { type ProbeReport, Readiness } from "../services/server/Readiness.ts"
import { L1Store } from "../services/server/L1Store.ts"
import { listingRefusal, listL1Chunks } from "../services/server/L1Listing.ts"
import { PROTOCOL_VERSION, VERSION } from "../version.ts"
import { ServerConfig, type ServerConfigInput } from "../services/server/ServerConfig.ts"
import { byLabel, existFromStart } from "../services/metrics/Series.ts"
import { httpConnectionsClosedTotal } from "../services/server/ServerMetrics.ts"
import { makeWindowedWarnings } from "../services/server/internal/WindowedWarnings.ts"
import { type GuardedHttpServer, HTTP_CLOSE_REASONS, type HttpCloseReason, makeGuardedHttpServer, MAX_HEADER_BYTES } from "./HttpConnectionGuard.ts"
import { STATUS_PAGE_CSP, STATUS_PAGE_HTML } from "./StatusPage.ts"

/** Extra blocks merged into `/api/status` by modules (liveness, native memory, instances …). */
export class StatusBlocks extends Context.Service<StatusBlocks, ReadonlyArray<Effect.Effect<Record<string, unknown>>>>()(
  "mpcache/layers/StatusBlocks"
) {
  static readonly layerEmpty = Layer.succeed(this, [])
}

/** What each close reason means, for the log (`--max-http-connections` N, `--http-idle-timeout-seconds` S). */
const closeText = (reason: HttpCloseReason, cap: number, idleSeconds: number): string => {
  switch (reason) {
    case "connection_cap":
      return `refused a connection: all ${cap} (--max-http-connections) are open with a request in flight`
    case "evicted_idle":
      return `closed the oldest connection waiting for a request to admit a new one: ${cap} (--max-http-connections) were open`
    case "no_request":
      return `closed a connection that sent nothing within ${idleSeconds} s (--http-idle-timeout-seconds) of connecting`
    case "slow_request":
      return `closed a connection whose request did not arrive whole within ${idleSeconds} s (--http-idle-timeout-seconds): slow headers (408)`
    case "header_too_large":
      return `refused a request whose head is over ${MAX_HEADER_BYTES} bytes (431)`
    case "bad_request":
      return "closed a connection that sent a malformed request (400)"
    case "inactive":
      return `closed a connection silent for ${2 * idleSeconds} s`
    case "keep_alive_idle":
      return `closed a keep-alive connection idle for ${idleSeconds} s`
  }
}

/** `mpcache_http_connections_closed_total`, one handle per reason, each at 0 from the start. */
const closedBy = byLabel(httpConnectionsClosedTotal, "reason", HTTP_CLOSE_REASONS)

/**
 * The HTTP frontend's `http.Server` with its connections bounded (HttpConnectionGuard.ts), each close counted in
 * `mpcache_http_connections_closed_total{reason}` and logged, one WARNING per reason per 10 s (keep-alive idle
 * closes are routine: counted, not logged).
 */
export class HttpConnections extends Context.Service<HttpConnections, GuardedHttpServer>()("mpcache/layers/HttpConnections") {
  static readonly layer = Layer.effect(
    this,
    Effect.gen(function*() {
      const config = yield* ServerConfig
      const services = yield* Effect.context<never>()
      const cap = config.descriptors.httpConnections
      const idleSeconds = config.httpIdleTimeoutSeconds
      const warnings = yield* makeWindowedWarnings<HttpCloseReason>({
        windowMs: 10_000,
        first: (reason) => `HTTP frontend ${closeText(reason, cap, idleSeconds)}`,
        more: (reason, count, windowMs) =>
          `HTTP frontend: ${count} more connection(s) in the last ${windowMs / 1000} s: ${closeText(reason, cap, idleSeconds)}`
      })
      return makeGuardedHttpServer({
        maxConnections: cap,
        idleTimeoutMs: idleSeconds * 1000,
        onClose: (reason) => {
          closedBy[reason].updateUnsafe(1, services)
          if (reason !== "keep_alive_idle") warnings.record(reason)
        }
      })
    })
  )
  /**
   * For tests: the real guarded server (not listening: the test listens on
   * an ephemeral port) over `ServerConfig.layerTest(overrides)`.
   */
  static readonly layerTest = (overrides: Partial<ServerConfigInput> = {}) =>
    this.layer.pipe(Layer.provide(ServerConfig.layerTest(overrides)))
}

/** Builds the `/api/status` document. */
export const statusDocument = Effect.gen(function*() {
  const config = yield* ServerConfig
  const server = yield* MqServer
  const http = (yield* HttpConnections).stats()
  const blocks = yield* StatusBlocks
  const readiness = yield* (yield* Readiness).readiness()
  const startedAtMs = yield* StartedAt
  const now = yield* Clock.currentTimeMillis
  const stats = server.stats()
  const doc: Record<string, unknown> = {
    is_healthy: true,
    version: VERSION,
    protocol_version: PROTOCOL_VERSION,
    endpoint: server.endpoint,
    chunk_size: config.chunkSizeTokens,
    l1_size_gb: config.l1SizeGb,
    uptime_seconds: Math.max(0, (now - startedAtMs) / 1000),
    connected_peers: stats.connectedPeers,
    dropped_messages: stats.droppedMessages,
    ...(stats.connections === undefined ? {} : {
      zmq_connections: { open: stats.connections.connections, max: stats.connections.max, refused: stats.connections.refused }
    }),
    routing_ids: {
      refused_chosen: stats.routingIds.refused.chosen,
      refused_ahead: stats.routingIds.refused.ahead,
      verifying: stats.routingIds.verifying
    },
    undeliverable_replies: stats.undeliverableReplies,
    refused_replies: stats.refusedReplies,
    send_queue: {
      max_queued_reply_bytes_per_peer: config.maxQueuedReplyBytesPerPeer,
      high_water_mark: SEND_HIGH_WATER_MARK,
      refused: stats.outbox.refused,
      drain_probes: stats.outbox.drainProbes,
      queued_bytes: stats.outbox.queuedBytes,
      waiting_peers: stats.outbox.waitingPeers,
      peers: stats.outbox.peers
    },
    inbound: {
      max_messages_per_peer: MAX_INBOUND_MESSAGES_PER_PEER,
      max_bytes_per_peer: MAX_INBOUND_BYTES_PER_PEER,
      queued: stats.inbound.queued,
      queued_bytes: stats.inbound.queuedBytes,
      receive_high_water_mark: RECEIVE_HIGH_WATER_MARK,
      peers: stats.inbound.peers,
      shed_requests: stats.inbound.shed,
      brake: {
        messages_per_second: BACKED_UP_MESSAGES_PER_SECOND,
        burst: BACKED_UP_BURST,
        braked_messages: stats.inbound.brake.charged,
        pauses: stats.inbound.brake.pauses,
        paused_ms: stats.inbound.brake.pausedMs
      }
    },
    pools: {
      sync: stats.pools.sync,
      normal: stats.pools.normal,
      affinity: stats.pools.affinity
    },
    http: {
      max_connections: config.descriptors.httpConnections,
      idle_timeout_seconds: config.httpIdleTimeoutSeconds,
      open_connections: http.openConnections,
      closed: http.closed
    },
    ops: server.table,
    readiness
  }
  for (const block of blocks) Object.assign(doc, yield* block)
  return doc
})

/** When the server started (Clock millis), for uptime. */
export class StartedAt extends Context.Service<StartedAt, number>()("mpcache/layers/StartedAt") {
  static readonly layer = Layer.effect(this, Clock.currentTimeMillis)
}

const jsonBigInt = (value: unknown): HttpServerResponse.HttpServerResponse =>
  HttpServerResponse.text(
    JSON.stringify(value, (_k, v: unknown) => typeof v === "bigint" ? v.toString(10) : v),
    { contentType: "application/json" }
  )

/** The status page: self-contained, and its CSP forbids anything but itself and same-origin fetches. */
const statusPage = HttpServerResponse.text(STATUS_PAGE_HTML, {
  contentType: "text/html; charset=utf-8",
  headers: { "content-security-policy": STATUS_PAGE_CSP, "cache-control": "no-store" }
})

/** A probe's report as JSON: 200 when every check passes, else 503. */
const probeResponse = (ok: string) => (report: ProbeReport): HttpServerResponse.HttpServerResponse =>
  HttpServerResponse.jsonUnsafe(report, { status: report.status === ok ? 200 : 503, headers: { "cache-control": "no-store" } })

/** `GET /api/l1/chunks?model=M` (L1Listing.ts): 403 under tenancy without the token, 404 in a server without L1. */
const l1Chunks = Effect.gen(function*() {
  const config = yield* ServerConfig
  const refused = listingRefusal(config.curve !== undefined, config.httpTokenFile)
  if (refused !== undefined) return HttpServerResponse.text(refused, { status: 403 })
  const l1 = yield* Effect.serviceOption(L1Store)
  if (Option.isNone(l1)) return HttpServerResponse.text("not found: this server has no L1", { status: 404 })
  const request = yield* HttpServerRequest.HttpServerRequest
  const model = new URL(request.url, "http://localhost").searchParams.get("model") ?? undefined
  return HttpServerResponse.jsonUnsafe(listL1Chunks(l1.value, model), { headers: { "cache-control": "no-store" } })
})

/** The probe paths: answered without the bearer token (docs/security.md "Probes"). */
export const PROBE_PATHS: ReadonlySet<string> = new Set(["/livez", "/readyz"])

const Routes = Layer.mergeAll(
  HttpRouter.add("GET", "/", statusPage),
  HttpRouter.add("GET", "/api/healthcheck", HttpServerResponse.jsonUnsafe({ status: "healthy" })),
  HttpRouter.add("GET", "/livez", Effect.flatMap(Effect.service(Readiness), (r) => Effect.map(r.liveness(), probeResponse("live")))),
  HttpRouter.add("GET", "/readyz", Effect.flatMap(Effect.service(Readiness), (r) => Effect.map(r.readiness(), probeResponse("ready")))),
  HttpRouter.add("GET", "/api/status", statusDocument.pipe(Effect.map(jsonBigInt))),
  HttpRouter.add("GET", "/api/l1/chunks", l1Chunks),
  PrometheusMetrics.layerHttp({ path: "/metrics" })
)

export { HttpTokenInvalid } from "../services/auth/BearerToken.ts"

/**
 * The bearer-token guard (docs/security.md): with `--http-token-file`,
 * every request but the probes' (`PROBE_PATHS`: kubelet cannot take the
 * token from a Secret) needs `Authorization: Bearer <token>`, else 401. The
 * comparison runs in constant time (`bearerCheck`, BearerToken.ts).
 */
const bearerGuard = (path: string) =>
  Layer.unwrap(
    Effect.gen(function*() {
      const token = yield* readTokenFile(path)
      const authorized = bearerCheck(token)
      return HttpRouter.middleware(
        (httpEffect) =>
          Effect.flatMap(HttpServerRequest.HttpServerRequest, (request) =>
            PROBE_PATHS.has(request.url.split("?")[0]!) || authorized(request.headers["authorization"])
              ? httpEffect
              : Effect.succeed(
                HttpServerResponse.text("unauthorized: this frontend needs Authorization: Bearer <token>", {
                  status: 401,
                  headers: { "www-authenticate": "Bearer" }
                })
              )),
        { global: true }
      )
    })
  )

const LogAddress = Layer.effectDiscard(
  Effect.gen(function*() {
    const server = yield* HttpServer.HttpServer
    yield* Effect.logInfo(`HTTP frontend listening on ${HttpServer.formatAddress(server.address)}`)
  })
)

/**
 * Serves the routes on `--http-host:--http-port` for the life of the layer.
 * Fails with the platform's `ServeError` when the port is taken.
 */
export const HttpLive = Layer.unwrap(
  Effect.gen(function*() {
    const config = yield* ServerConfig
    // Before the first scrape can arrive: every declared series at 0 (issue 25 item 6).
    yield* existFromStart
    const routes = config.httpTokenFile === undefined ? Routes : Layer.mergeAll(Routes, bearerGuard(config.httpTokenFile))
    const { server } = yield* HttpConnections
    return HttpRouter.serve(routes, { disableLogger: true, disableListenLog: true }).pipe(
      Layer.merge(LogAddress),
      Layer.provide(NodeHttpServer.layer(() => server, { port: config.httpPort, host: config.httpHost }))
    )
  })
).pipe(Layer.provideMerge(HttpConnections.layer))
