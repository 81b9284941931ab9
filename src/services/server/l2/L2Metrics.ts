/**
 * Metrics of the L2 tier (issue 15 item 7), on /metrics with the rest:
 * hits, misses, corrupt and unauthenticated values, dropped writes, bytes in and out, command
 * latencies and breaker transitions.
 */
import { Metric } from "effect"

const counter = (name: string, description: string) => Metric.counter(name, { description, incremental: true })

/** Chunks a LOOKUP found in L2 past the L1 prefix (per rank). */
export const l2HitsTotal = counter("mpcache_l2_hits_total", "Chunks LOOKUP found in L2 past the L1 prefix (per rank)")
/** Chunks a LOOKUP asked L2 for and did not find (the first miss ends the prefix; per rank). */
export const l2MissesTotal = counter("mpcache_l2_misses_total", "Chunks LOOKUP asked L2 for and did not find, or could not get (per rank)")
/** Values refused on read (bad header, length or checksum) and deleted; `reason` says which check. */
export const l2CorruptTotal = counter("mpcache_l2_corrupt_values_total", "L2 values refused on read and deleted")
/**
 * Values a server with `--l2-secret-file` refused and deleted for want of a valid MAC (issue 24 item 14);
 * `reason`: no_mac (written without a secret, or planted), bad_mac (forged, or another secret's).
 */
export const l2UnauthenticatedTotal = counter(
  "mpcache_l2_unauthenticated_values_total",
  "L2 values refused on read and deleted because they carry no valid MAC (--l2-secret-file)"
)
/** Writes not sent; `reason`: inflight (past --l2-max-inflight-bytes), open (breaker open). */
export const l2DroppedWritesTotal = counter("mpcache_l2_dropped_writes_total", "L1 objects not written through to L2")
/** Writes that failed or timed out. */
export const l2FailedWritesTotal = counter("mpcache_l2_failed_writes_total", "L2 writes that failed or timed out")
/** Value bytes written to L2 (headers included). */
export const l2BytesOutTotal = counter("mpcache_l2_bytes_out_total", "Bytes of values written to L2")
/** Value bytes read from L2 (headers included). */
export const l2BytesInTotal = counter("mpcache_l2_bytes_in_total", "Bytes of values read from L2")
/** Breaker state changes; `to`: open, probing, ok. */
export const l2BreakerTransitionsTotal = counter("mpcache_l2_breaker_transitions_total", "L2 circuit breaker state changes")
/** Bytes of L2 writes in flight. */
export const l2InflightBytes = Metric.gauge("mpcache_l2_inflight_bytes", { description: "Bytes of L2 writes in flight" })

/** Latency of one L2 command (`op`: GET, SET, EXISTS — EXISTS is one LOOKUP's batch), seconds. */
export const l2CommandSeconds = Metric.histogram("mpcache_l2_command_seconds", {
  description: "Latency of L2 commands (EXISTS: one LOOKUP's batch)",
  boundaries: [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5]
})
