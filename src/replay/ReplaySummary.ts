/**
 * What `mpcache replay` reports: the summary (its `--json` document) and the
 * run (summary and timeline, the data of `--report`). Built by
 * internal/Summary.ts from the run's tally.
 */
import type { TransferMode } from "./Messages.ts"
import type { ReplayTimeline } from "./Timeline.ts"
import type { TraceIssue } from "./Trace.ts"

/** How requests were spread over the servers (`--router`, issue 28 item 6). */
export type ReplayRouterPolicy = "round-robin" | "kv-aware"

/** The index audit of one server: the KV-aware router's view of its L1 against its actual L1 keys, after the run. */
export interface ReplayAudit {
  /** 1-based, in start order. */
  readonly server: number
  /** Chunks L1 holds (`GET /api/l1/chunks`). */
  readonly l1_chunks: number
  /** Chunks the router believes it holds. */
  readonly router_chunks: number
  /** In L1, not in the router's view. */
  readonly missing: number
  /** In the router's view, not in L1. */
  readonly extra: number
}

/** Everything `mpcache replay` reports (the `--json` document). */
export interface ReplaySummary {
  readonly trace: string
  readonly requests: number
  readonly failed_requests: number
  /** Why requests failed (first 20). */
  readonly failures: ReadonlyArray<{ readonly request: number; readonly message: string }>
  readonly retried_requests: number
  /** Workers per server. */
  readonly workers: number
  /** Servers the requests were spread over (issue 15 §8). */
  readonly servers: number
  /**
   * The routing policy (`--router`): round-robin of each conversation's turns, or kv-aware (each request to the
   * server whose KV event stream says it holds the longest prefix); with kv-aware, the index audit per server
   * (null with round-robin) and how often a server was restarted in the run (`--restart-server-every-requests`).
   */
  readonly router: {
    readonly policy: ReplayRouterPolicy
    readonly audit: ReadonlyArray<ReplayAudit> | null
    readonly server_restarts: number
  }
  /** The L2 every server shared, password removed; null: none. */
  readonly l2_url: string | null
  readonly transfer_mode: TransferMode
  readonly model: string
  readonly chunk_size: number
  /**
   * Chunk counts. Of the `hit` chunks, `retrieved` came back; `retrieve_not_sent` were not asked for because the
   * worker was in degraded mode (its heartbeat had failed: it recomputes rather than wait, DESIGN §6), and
   * `retrieve_failed` were asked for and did not come (a failed or refused RETRIEVE). hit = retrieved +
   * retrieve_not_sent + retrieve_failed for the requests that finished.
   */
  readonly chunks: {
    readonly looked_up: number
    readonly hit: number
    readonly stored: number
    readonly retrieved: number
    readonly retrieve_not_sent: number
    readonly retrieve_failed: number
  }
  readonly hit_ratio: number
  /**
   * Hit chunks by tier: `l2` is what the servers' LOOKUPs found in L2 past their L1 prefix (the delta of
   * `mpcache_l2_hits_total` over the run, summed over servers), `l1` the rest of `chunks.hit`.
   */
  readonly hits_by_tier: { readonly l1: number; readonly l2: number }
  /** `hits_by_tier` / `chunks.looked_up`. */
  readonly hit_ratio_l1: number
  readonly hit_ratio_l2: number
  /** A perfect LRU of one server's L1 capacity over the whole trace. */
  readonly perfect_lru_hit_ratio: number
  /** A perfect LRU of the servers' combined capacity (`servers` × `l1_capacity_chunks`) over the whole trace. */
  readonly perfect_lru_combined_hit_ratio: number
  /** Per server, in start order: its share of the requests and of the hits. */
  readonly per_server: ReadonlyArray<{
    readonly requests: number
    readonly looked_up: number
    readonly hit: number
    readonly l2_hit: number
  }>
  /** One server's L1 capacity. */
  readonly l1_capacity_chunks: number
  readonly gb_stored: number
  readonly gb_retrieved: number
  readonly duration_seconds: number
  readonly requests_per_second: number
  /** Per stage of a request (ms): median, 99th percentile and mean (the means tell where a request's time goes). */
  readonly latency_ms: Record<
    "lookup" | "retrieve" | "compute" | "store" | "request",
    { readonly p50: number; readonly p99: number; readonly mean: number }
  >
  readonly churn: { readonly killed: number; readonly paused: number; readonly replaced: number }
  readonly reaped: Record<string, number>
  readonly leaked_contexts: number
  readonly open_mappings_after_shutdown: number
  readonly data_mismatches: number
  readonly mismatch_details: ReadonlyArray<{ readonly request: number; readonly line: number; readonly chunks: ReadonlyArray<number> }>
  readonly trace_issues: ReadonlyArray<TraceIssue>
  /** Requests of the slice skipped because they are longer than `--max-input-tokens`. */
  readonly skipped_long_requests: { readonly count: number; readonly max_input_tokens: number | null }
}

/** A finished replay: the summary, and what happened over time (the data of `--report`, Timeline.ts). */
export interface ReplayRun {
  readonly summary: ReplaySummary
  readonly timeline: ReplayTimeline
}
