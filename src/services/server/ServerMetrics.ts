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

export const refusedRepliesTotal = Metric.counter("mpcache_refused_replies_total", {
  description:
    "Replies refused (answered overloaded instead) for the bytes queued to their peer (--max-queued-reply-bytes-per-peer), by reason: reply_too_large, outbox_full, not_drained",
  incremental: true
})

const refusedHandles = new Map<string, Metric.Metric<number, unknown>>()

/** Counter handle for one refusal reason (internal/ReplyOutbox.ts). */
export const refusedReplyMetric = (reason: string): Metric.Metric<number, unknown> => {
  let m = refusedHandles.get(reason)
  if (m === undefined) {
    m = Metric.withAttributes(refusedRepliesTotal, { reason })
    refusedHandles.set(reason, m)
  }
  return m
}

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

const errorHandles = new Map<string, Metric.Metric<number, unknown>>()

/** Counter handle for one error code. */
export const errorMetric = (code: ErrorCode): Metric.Metric<number, unknown> => {
  let m = errorHandles.get(code)
  if (m === undefined) {
    m = Metric.withAttributes(errorsTotal, { code })
    errorHandles.set(code, m)
  }
  return m
}
