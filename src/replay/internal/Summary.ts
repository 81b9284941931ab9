/**
 * The replay's summary from its tally: hit ratios overall and by tier, the
 * perfect-LRU references, per-server shares, latencies, churn, reaps and
 * leaks.
 *
 * @internal
 */
import { redactUrl } from "../L2Split.ts"
import { perfectLruCumulative } from "../LruSim.ts"
import type { ReplayOptions } from "../ReplayOptions.ts"
import type { ReplaySummary } from "../ReplaySummary.ts"
import type { Samples } from "../Stats.ts"
import type { TraceIssue, TraceRequest } from "../Trace.ts"
import type { Node } from "./Fleet.ts"
import type { Tally } from "./Tally.ts"

const round = (x: number, digits = 3) => Math.round(x * 10 ** digits) / 10 ** digits

/** What the summary is built from besides the tally. */
export interface SummaryInputs {
  readonly options: ReplayOptions
  /** The usable slice of the trace, and all of it before `--max-input-tokens`. */
  readonly requests: ReadonlyArray<TraceRequest>
  readonly sliceLength: number
  readonly issues: ReadonlyArray<TraceIssue>
  readonly nodes: ReadonlyArray<Node>
  readonly chunk: number
  readonly capacityChunks: number
  /** Per server, L2 hit chunks over the run. */
  readonly l2Hits: ReadonlyArray<number>
  readonly durationSeconds: number
  readonly reaped: Record<string, number>
  readonly leaked: number
  readonly openMappings: number
  readonly router: ReplaySummary["router"]
}

/** The summary, and the cumulative perfect-LRU steps of one server's capacity (the timeline's reference). */
export const summarize = (t: Tally, i: SummaryInputs): { readonly summary: ReplaySummary; readonly lruSteps: ReturnType<typeof perfectLruCumulative> } => {
  const o = i.options
  const { capacityChunks, chunk, nodes, requests } = i
  const lruSteps = perfectLruCumulative(requests, chunk, capacityChunks)
  const [lruLookedUp, lruHits] = lruSteps[lruSteps.length - 1] ?? [0, 0]
  const lru = { hitRatio: lruLookedUp === 0 ? 0 : lruHits / lruLookedUp }
  const combinedSteps = nodes.length === 1 ? lruSteps : perfectLruCumulative(requests, chunk, nodes.length * capacityChunks)
  const [combinedLookedUp, combinedHits] = combinedSteps[combinedSteps.length - 1] ?? [0, 0]
  const l2Total = i.l2Hits.reduce((a, b) => a + b, 0)
  const ratio = (n: number) => round(t.lookedUp === 0 ? 0 : n / t.lookedUp, 4)
  const q = (s: Samples) => ({ p50: round(s.quantile(0.5)), p99: round(s.quantile(0.99)), mean: round(s.mean()) })
  const lat = t.lat
  const summary: ReplaySummary = {
    trace: o.tracePath,
    requests: requests.length,
    failed_requests: t.failed,
    failures: t.failures,
    retried_requests: t.retried,
    workers: o.workers,
    servers: nodes.length,
    router: i.router,
    l2_url: o.l2Url === undefined ? null : redactUrl(o.l2Url),
    transfer_mode: o.transferMode,
    model: o.model.name,
    chunk_size: chunk,
    chunks: {
      looked_up: t.lookedUp,
      hit: t.hit,
      stored: t.stored,
      retrieved: t.retrieved,
      retrieve_not_sent: t.retrieveNotSent,
      retrieve_failed: t.retrieveFailed
    },
    hit_ratio: ratio(t.hit),
    hits_by_tier: { l1: t.hit - l2Total, l2: l2Total },
    hit_ratio_l1: ratio(t.hit - l2Total),
    hit_ratio_l2: ratio(l2Total),
    perfect_lru_hit_ratio: round(lru.hitRatio, 4),
    perfect_lru_combined_hit_ratio: round(combinedLookedUp === 0 ? 0 : combinedHits / combinedLookedUp, 4),
    per_server: nodes.map((n, k) => ({ requests: n.requests, looked_up: n.lookedUp, hit: n.hit, l2_hit: i.l2Hits[k]! })),
    l1_capacity_chunks: capacityChunks,
    gb_stored: round(t.bytesStored / 1e9, 4),
    gb_retrieved: round(t.bytesRetrieved / 1e9, 4),
    duration_seconds: round(i.durationSeconds, 2),
    requests_per_second: round(requests.length / Math.max(i.durationSeconds, 1e-9), 2),
    latency_ms: { lookup: q(lat.lookup), retrieve: q(lat.retrieve), compute: q(lat.compute), store: q(lat.store), request: q(lat.request) },
    churn: { killed: t.killed, paused: t.paused, replaced: t.replaced },
    reaped: i.reaped,
    leaked_contexts: i.leaked,
    open_mappings_after_shutdown: i.openMappings,
    data_mismatches: t.mismatches.reduce((n, m) => n + m.chunks.length, 0),
    mismatch_details: t.mismatches,
    trace_issues: i.issues,
    skipped_long_requests: { count: i.sliceLength - requests.length, max_input_tokens: o.maxInputTokens ?? null }
  }
  return { summary, lruSteps }
}
