/**
 * Prometheus metrics of the MQ server (DESIGN §7: requests and latency by op,
 * errors by code). Names follow STYLE's `mpcache_…_total/_seconds`.
 * Per-op metric handles are built once per op, not per request. Every series
 * with known labels exists from the start (Series.ts, issue 25 item 6): each
 * op of the table, each wire error code, each refusal reason, at 0.
 */
import { Metric } from "effect"
import { OPS } from "../../schema/Op.ts"
import { ErrorCode } from "../../schema/WireError.ts"
import { byLabel, fromStart } from "../metrics/Series.ts"
import { REFUSAL_REASONS, type RefusalReason } from "./internal/ReplyRefusal.ts"

/** The `op` label's values: every op of the table (DESIGN §3.1). */
const OP_LABELS = { op: OPS.map((o) => o.name) }

/** Latency buckets in seconds: 50 µs … ~13 s. */
const LATENCY_BOUNDARIES = Metric.exponentialBoundaries({ start: 0.00005, factor: 2, count: 19 })

export const requestsTotal = fromStart(
  Metric.counter("mpcache_requests_total", {
    description: "Requests handled, by op",
    incremental: true
  }),
  OP_LABELS
)

export const requestDurationSeconds = fromStart(
  Metric.histogram("mpcache_request_duration_seconds", {
    description: "Time from receipt to reply, by op",
    boundaries: LATENCY_BOUNDARIES
  }),
  OP_LABELS
)

const errorsTotal = Metric.counter("mpcache_errors_total", {
  description: "Error replies sent, by code",
  incremental: true
})

export const droppedMessagesTotal = fromStart(Metric.counter("mpcache_dropped_messages_total", {
  description: "Messages dropped because they cannot be attributed (fewer than 2 frames, a uid or op that is not a non-negative int)",
  incremental: true
}))

export const undeliverableRepliesTotal = fromStart(Metric.counter("mpcache_undeliverable_replies_total", {
  description: "Replies the ROUTER could not deliver (peer gone or over its high-water mark)",
  incremental: true
}))

export const shedRequestsTotal = fromStart(Metric.counter("mpcache_shed_requests_total", {
  description: "Requests shed without being handled because their peer already had as many waiting as it may (issue 27 item 1: one peer cannot starve the others); answered overloaded unless the peer's replies back up",
  incremental: true
}))

export const brakedMessagesTotal = fromStart(Metric.counter("mpcache_braked_messages_total", {
  description: "Messages the receive loop took from peers whose replies back up (issue 27 item 1): at most 5,000 a second for all such peers together, past which the loop waits (internal/ReceiveBrake.ts)",
  incremental: true
}))

export const receiveBrakeSecondsTotal = fromStart(Metric.counter("mpcache_receive_brake_seconds_total", {
  description: "Seconds the receive loop waited because peers whose replies back up had had their share (issue 27 item 1)",
  incremental: true
}))

/** Labelled by reason: PeerAdmission.ts declares the reasons (`byLabel`). */
export const routingIdRefusalsTotal = Metric.counter("mpcache_routing_id_refusals_total", {
  description: "Peers refused for their routing id (issue 24 item 1), by reason: chosen (set by the peer itself) or ahead (claiming an id the ROUTER had not generated yet: kicked)",
  incremental: true
})

export const connectionsRefusedTotal = Metric.counter("mpcache_connections_refused_total", {
  description: "Connections a listener closed at once instead of serving (issue 24 item 11), by listener (zmq, http, fd_socket) and reason",
  incremental: true
})

const refusedRepliesTotal = Metric.counter("mpcache_refused_replies_total", {
  description:
    "Replies refused (answered overloaded instead) for the bytes queued to their peer (--max-queued-reply-bytes-per-peer), by reason: reply_too_large, outbox_full, not_drained, not_served (a stalled peer's request, not served)",
  incremental: true
})

/** Labelled by reason: src/layers/Http.ts declares the reasons (`byLabel`, HttpConnectionGuard.ts's list). */
export const httpConnectionsClosedTotal = Metric.counter("mpcache_http_connections_closed_total", {
  description:
    "HTTP connections the frontend closed or refused, by reason: connection_cap, evicted_idle, no_request, slow_request, header_too_large, bad_request, inactive, keep_alive_idle",
  incremental: true
})

export const connectedPeers = fromStart(Metric.gauge("mpcache_connected_peers", {
  description: "Client connections (routing ids) currently connected to the ROUTER"
}))

/** Per-op handles. */
export interface OpMetrics {
  readonly requests: Metric.Metric<number, unknown>
  readonly latency: Metric.Metric<number, unknown>
}

export const opMetrics = (opName: string): OpMetrics => ({
  requests: Metric.withAttributes(requestsTotal, { op: opName }),
  latency: Metric.withAttributes(requestDurationSeconds, { op: opName })
})

/** Counter handles, one per error code. */
export const errorMetric = byLabel(errorsTotal, "code", ErrorCode.literals)

/** Counter handles, one per reason a reply was refused (internal/ReplyRefusal.ts). */
export const refusedReplyMetric: Readonly<Record<RefusalReason, Metric.Metric<number, unknown>>> = byLabel(
  refusedRepliesTotal,
  "reason",
  REFUSAL_REASONS
)
