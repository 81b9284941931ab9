/**
 * Prometheus metrics of the MQ server (DESIGN §7: requests and latency by op,
 * errors by code). Names follow STYLE's `mpcache_…_total/_seconds`.
 * Per-op metric handles are built once per op, not per request.
 */
import { Metric } from "effect"
import type { ErrorCode } from "../../schema/WireError.ts"

/** Latency buckets in seconds: 50 µs … ~13 s. */
const LATENCY_BOUNDARIES = Metric.exponentialBoundaries({ start: 0.00005, factor: 2, count: 19 })

export const requestsTotal = Metric.counter("mpcache_requests_total", {
  description: "Requests handled, by op",
  incremental: true
})

export const requestDurationSeconds = Metric.histogram("mpcache_request_duration_seconds", {
  description: "Time from receipt to reply, by op",
  boundaries: LATENCY_BOUNDARIES
})

export const errorsTotal = Metric.counter("mpcache_errors_total", {
  description: "Error replies sent, by code",
  incremental: true
})

export const droppedMessagesTotal = Metric.counter("mpcache_dropped_messages_total", {
  description: "Messages dropped because they cannot be attributed (fewer than 2 frames, a uid or op that is not a non-negative int)",
  incremental: true
})

export const undeliverableRepliesTotal = Metric.counter("mpcache_undeliverable_replies_total", {
  description: "Replies the ROUTER could not deliver (peer gone or over its high-water mark)",
  incremental: true
})

export const routingIdRefusalsTotal = Metric.counter("mpcache_routing_id_refusals_total", {
  description: "Peers refused for their routing id (issue 24 item 1), by reason: chosen (set by the peer itself) or ahead (claiming an id the ROUTER had not generated yet: kicked)",
  incremental: true
})

export const connectionsRefusedTotal = Metric.counter("mpcache_connections_refused_total", {
  description: "Connections a listener closed at once instead of serving (issue 24 item 11), by listener (zmq, http, fd_socket) and reason",
  incremental: true
})

export const refusedRepliesTotal = Metric.counter("mpcache_refused_replies_total", {
  description:
    "Replies refused (answered overloaded instead) for the bytes queued to their peer (--max-queued-reply-bytes-per-peer), by reason: reply_too_large, outbox_full, not_drained, not_served (a stalled peer's request, not served)",
  incremental: true
})

export const httpConnectionsClosedTotal = Metric.counter("mpcache_http_connections_closed_total", {
  description:
    "HTTP connections the frontend closed or refused, by reason: connection_cap, evicted_idle, no_request, slow_request, header_too_large, bad_request, inactive, keep_alive_idle",
  incremental: true
})

export const connectedPeers = Metric.gauge("mpcache_connected_peers", {
  description: "Client connections (routing ids) currently connected to the ROUTER"
})

/** Per-op handles. */
export interface OpMetrics {
  readonly requests: Metric.Metric<number, unknown>
  readonly latency: Metric.Metric<number, unknown>
}

export const opMetrics = (opName: string): OpMetrics => ({
  requests: Metric.withAttributes(requestsTotal, { op: opName }),
  latency: Metric.withAttributes(requestDurationSeconds, { op: opName })
})

/** Handles of `metric` with its one attribute `key` set, one per value, each built once (not per update). */
const byAttribute = <V extends string>(metric: Metric.Metric<number, unknown>, key: string) => {
  const handles = new Map<V, Metric.Metric<number, unknown>>()
  return (value: V): Metric.Metric<number, unknown> => {
    let m = handles.get(value)
    if (m === undefined) {
      m = Metric.withAttributes(metric, { [key]: value })
      handles.set(value, m)
    }
    return m
  }
}

/** Counter handle for one error code. */
export const errorMetric = byAttribute<ErrorCode>(errorsTotal, "code")

/** Counter handle for one reason a reply was refused (internal/ReplyOutbox.ts). */
export const refusedReplyMetric = byAttribute<string>(refusedRepliesTotal, "reason")

/** Counter handle for one reason the HTTP frontend closed a connection (src/layers/HttpConnectionGuard.ts). */
export const httpConnectionsClosedMetric = byAttribute<string>(httpConnectionsClosedTotal, "reason")
