/** The human-readable replay summary (the README shows a real sample). */
import type { ReplaySummary } from "./Driver.ts"

const pct = (x: number) => `${(100 * x).toFixed(2)}%`

/** The index audit summed over the servers (kv-aware routing), or undefined without one. */
const auditTotals = (s: ReplaySummary) =>
  s.router.audit === null ? undefined : s.router.audit.reduce(
    (t, a) => ({ missing: t.missing + a.missing, extra: t.extra + a.extra, l1Chunks: t.l1Chunks + a.l1_chunks }),
    { missing: 0, extra: 0, l1Chunks: 0 }
  )

/** The figures that must be 0 (with kv-aware routing the index audit's too); the exit status is 1 when any is not. */
export const mustBeZero = (s: ReplaySummary) => {
  const audit = auditTotals(s)
  return {
    leaked_contexts: s.leaked_contexts,
    open_mappings_after_shutdown: s.open_mappings_after_shutdown,
    data_mismatches: s.data_mismatches,
    ...(audit === undefined ? {} : { index_audit_missing: audit.missing, index_audit_extra: audit.extra })
  }
}

/** The routing line: the policy and, with kv-aware, the index audit summed over the servers (issue 28 item 6). */
export const routerLine = (s: ReplaySummary): string => {
  const r = s.router
  const restarts = r.server_restarts === 0 ? "" : ` · ${r.server_restarts} server restart(s)`
  const audit = auditTotals(s)
  if (audit === undefined) return `${r.policy}: each conversation's turns in turn over the servers${restarts}`
  return `${r.policy}: each request to the server whose KV event stream holds its longest prefix${restarts} · index audit ` +
    `${audit.l1Chunks} chunks in L1, ${audit.missing} missing, ${audit.extra} extra`
}

/** The runs of one trace under each `--router` policy side by side, beside the perfect LRU of the combined capacity. */
export const policyComparison = (runs: ReadonlyArray<ReplaySummary>): Array<string> => [
  `routers (same trace, same servers' capacity; perfect LRU of the combined capacity ${pct(runs[0]!.perfect_lru_combined_hit_ratio)}):`,
  ...runs.map((s) => {
    const audit = auditTotals(s)
    return `  ${s.router.policy.padEnd(12)} hit ratio ${pct(s.hit_ratio)} (L1 ${pct(s.hit_ratio_l1)} · L2 ${pct(s.hit_ratio_l2)})` +
      (audit === undefined ? "" : ` · audit ${audit.missing} missing, ${audit.extra} extra`)
  })
]

export const formatSummary = (s: ReplaySummary): string => {
  const l = s.latency_ms
  const ok = (n: number) => (n === 0 ? "0 ✓" : `${n} ✗`)
  const lines = [
    `mpcache replay — ${s.trace}`,
    `  requests          ${s.requests} (${s.failed_requests} failed, ${s.retried_requests} retried on another worker) in ${s.duration_seconds} s = ${s.requests_per_second} req/s`,
    `  workers           ${s.workers} · killed ${s.churn.killed} · paused ${s.churn.paused} · replaced ${s.churn.replaced}`,
    `  model             ${s.model}, chunk ${s.chunk_size} tokens, L1 ${s.l1_capacity_chunks} chunks, ${s.transfer_mode} transfers`,
    `  chunks            looked up ${s.chunks.looked_up} · hit ${s.chunks.hit} · stored ${s.chunks.stored} · retrieved ${s.chunks.retrieved}${
      s.chunks.retrieve_not_sent + s.chunks.retrieve_failed > 0
        ? ` (not retrieved: ${s.chunks.retrieve_not_sent} in degraded mode, ${s.chunks.retrieve_failed} failed)`
        : ""
    }`,
    `  hit ratio         ${pct(s.hit_ratio)} (a perfect LRU of the same capacity: ${pct(s.perfect_lru_hit_ratio)})`,
    ...(s.servers > 1 || s.l2_url !== null
      ? [
        `  servers           ${s.servers} · L2 ${s.l2_url ?? "none"}`,
        `  router            ${routerLine(s)}`,
        `  hits by tier      L1 ${pct(s.hit_ratio_l1)} · L2 ${pct(s.hit_ratio_l2)} (a perfect LRU of the ${s.servers} servers' combined capacity: ${pct(s.perfect_lru_combined_hit_ratio)})`,
        ...s.per_server.map((p, i) =>
          `    server ${i + 1}        ${p.requests} requests · looked up ${p.looked_up} · hit ${p.hit} (L2 ${p.l2_hit}) = ${pct(p.looked_up === 0 ? 0 : p.hit / p.looked_up)}`
        )
      ]
      : []),
    `  moved             ${s.gb_stored} GB stored · ${s.gb_retrieved} GB retrieved`,
    `  latency ms p50/p99 lookup ${l.lookup.p50}/${l.lookup.p99} · retrieve ${l.retrieve.p50}/${l.retrieve.p99} · store ${l.store.p50}/${l.store.p99} · compute ${l.compute.p50}/${l.compute.p99} · request ${l.request.p50}/${l.request.p99}`,
    `  mean ms           lookup ${l.lookup.mean} · retrieve ${l.retrieve.mean} · store ${l.store.mean} · compute ${l.compute.mean} · request ${l.request.mean}`,
    `  reaped            timeout ${s.reaped["timeout"] ?? 0} · grace ${s.reaped["grace"] ?? 0} · disconnect ${s.reaped["disconnect"] ?? 0}`,
    `  leaked contexts   ${ok(s.leaked_contexts)}`,
    `  open mappings     ${ok(s.open_mappings_after_shutdown)} (after the last worker unregistered)`,
    `  data mismatches   ${ok(s.data_mismatches)}`,
    ...(s.router.audit === null ? [] : s.router.audit.map((a) =>
      `  index audit ${String(a.server).padEnd(5)} L1 ${a.l1_chunks} chunks · router ${a.router_chunks} · missing ${ok(a.missing)} · extra ${ok(a.extra)}`
    ))
  ]
  for (const f of s.failures) lines.push(`    failed: request ${f.request}: ${f.message}`)
  for (const m of s.mismatch_details.slice(0, 20)) {
    lines.push(`    mismatch: request ${m.request} (trace line ${m.line}) chunks ${m.chunks.join(", ")}`)
  }
  if (s.skipped_long_requests.count > 0) {
    lines.push(`  skipped           ${s.skipped_long_requests.count} request(s) longer than --max-input-tokens ${s.skipped_long_requests.max_input_tokens}`)
  }
  if (s.trace_issues.length > 0) {
    lines.push(`  trace issues      ${s.trace_issues.length} malformed line(s) skipped`)
    for (const i of s.trace_issues.slice(0, 10)) lines.push(`    line ${i.line}: ${i.message}`)
  }
  return lines.join("\n")
}
