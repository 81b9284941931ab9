/**
 * The readable summary `mpcache status` prints by default (issue 17; `--json`
 * prints the raw `/api/status` document instead): a server line, the
 * liveness windows, an L1 line, the reaps count, then one table row per
 * instance. Pure: a decoded StatusDocument in, lines out.
 *
 *   mpcache 0.1.0 (protocol 1) · ipc:///tmp/mpcache.sock · up 1h 2m 3s · 2 peers
 *   readiness ready · mq_bound, l1_pool, reaper, fd_socket, l2 ok
 *   (not ready: "readiness not ready · 1 of 5 checks failing", then one line per failing check:
 *   "  reaper: last scan ended 75.000 s ago, more than two scan periods (…)")
 *   liveness  reaper on · reap timeout 120 s · registration grace 3600 s · disconnect grace 2 s · 2 tracked
 *   L1        8.0 KiB of 1.0 GiB (0.0%) · 1 objects · 0 evictions · hit ratio 50.0% (1 of 2 chunks) · L2 off
 *   (with --l2-url: "· L2 ok", then
 *   L2        redis://127.0.0.1:6379 · ok · 0 B in flight (0 writes) · 4 written · 0 dropped · 4 hit chunks · 0 corrupt · authenticated (0 refused))
 *   events    on · 4 / 32768 records · seq 1 … 4 · 4 stored, 0 removed · 0 dropped · 0 lost answers · 4 chunks held · PUB off
 *   (with --kv-events-endpoint: "· PUB tcp://127.0.0.1:5557 · 1 subscriber(s) · 3 batches · 0 replays served")
 *   reaps     1 recent · last: 2352963943 disconnect after 2.0 s silent (window 2 s)
 *
 *   INSTANCE ID          KIND      TENANT  MODEL  STATE    LAST SEEN  FLAGS
 *   1350143476463376293  kv_cache  —       m      active   0.1 s      ping,transfer
 */
import type { StatusDocument } from "../schema/Status.ts"

/** `n` bytes in binary units, one decimal (`8.0 KiB`); plain bytes below 1 KiB. */
export const formatBytes = (n: number): string => {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"]
  let v = n
  let i = 0
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024
    i++
  }
  return i === 0 ? `${v} B` : `${v.toFixed(1)} ${units[i]}`
}

/** Whole seconds as `1d 2h 3m 4s`, leading zero units left out. */
export const formatUptime = (seconds: number): string => {
  const s = Math.floor(seconds)
  const d = Math.floor(s / 86400)
  const h = Math.floor((s % 86400) / 3600)
  const m = Math.floor((s % 3600) / 60)
  const parts = [d > 0 ? `${d}d` : "", d + h > 0 ? `${h}h` : "", d + h + m > 0 ? `${m}m` : "", `${s % 60}s`]
  return parts.filter((p) => p !== "").join(" ")
}

/** Left-aligned columns, two spaces apart; the first row is the header. */
const table = (rows: ReadonlyArray<ReadonlyArray<string>>): Array<string> => {
  const widths = rows[0]!.map((_, c) => Math.max(...rows.map((r) => [...r[c]!].length)))
  return rows.map((r) => r.map((cell, c) => (c === r.length - 1 ? cell : cell.padEnd(widths[c]!))).join("  ").trimEnd())
}

/** The L2 line (issue 15): store, state, writes in flight, counts, whether values are authenticated (issue 24 item 14), the last error. */
const l2Line = (l2: NonNullable<StatusDocument["l2"]>): string =>
  `L2        ${l2.url}${l2.connected ? "" : " (not connected)"} · ${l2.state} · ${formatBytes(l2.inflight_bytes)} in flight (${l2.queue_depth} writes) · ${l2.writes} written · ` +
  `${l2.dropped_writes} dropped · ${l2.hit_chunks} hit chunks · ${l2.corrupt_values} corrupt · ` +
  (l2.authenticated ? `authenticated (${l2.unauthenticated_values} refused)` : "not authenticated") +
  (l2.last_error === null ? "" : ` · last error: ${l2.last_error}`)

/** The KV events line (issue 28 item 7): on/off, the log's depth and range, what it recorded, the PUB. */
const eventsLine = (ev: StatusDocument["kv_events"]): string => {
  if (!ev.enabled) return "events    off (--kv-event-log-size 0)"
  const pub = ev.publisher
  return `events    on · ${ev.depth} / ${ev.capacity} records · seq ${ev.newest_seq === 0 ? "— (empty)" : `${ev.oldest_seq} … ${ev.newest_seq}`} · ` +
    `${ev.records.stored} stored, ${ev.records.removed} removed · ${ev.dropped} dropped · ${ev.lost_answers} lost answers · ${ev.held_chunks} chunks held · ` +
    (pub === null
      ? "PUB off"
      : `PUB ${pub.endpoint} · ${pub.subscribers} subscriber(s) · ${pub.batches_published} batches · ` +
        (pub.replay_endpoint === null ? "no replay" : `${pub.replays_served} replays served`))
}

/** The readiness line (issue 27 item 3), then one indented line per failing check. */
export const readinessLines = (r: StatusDocument["readiness"]): Array<string> => {
  const failing = r.checks.filter((c) => !c.ok)
  return failing.length === 0
    ? [`readiness ready · ${r.checks.map((c) => c.name).join(", ")} ok`]
    : [
      `readiness not ready · ${failing.length} of ${r.checks.length} checks failing`,
      ...failing.map((c) => `  ${c.name}: ${c.detail}`)
    ]
}

/** The summary, one string of lines (no trailing newline). */
export const formatStatus = (doc: StatusDocument): string => {
  const w = doc.worker_liveness
  const l1 = doc.l1
  const lk = doc.lookup
  const used = l1.capacity_bytes > 0 ? ` (${((100 * l1.used_bytes) / l1.capacity_bytes).toFixed(1)}%)` : ""
  const hit = lk.looked_up_chunks > 0
    ? `${((100 * lk.hit_chunks) / lk.looked_up_chunks).toFixed(1)}% (${lk.hit_chunks} of ${lk.looked_up_chunks} chunks)`
    : "— (no lookups yet)"
  const last = doc.recent_reaps[doc.recent_reaps.length - 1]
  const lines = [
    `mpcache ${doc.version} (protocol ${doc.protocol_version}) · ${doc.endpoint} · up ${formatUptime(doc.uptime_seconds)} · ${doc.connected_peers} peers`,
    ...readinessLines(doc.readiness),
    `liveness  reaper ${w.enabled ? "on" : "off"} · reap timeout ${w.reap_timeout_seconds} s · registration grace ${w.registration_grace_seconds} s · disconnect grace ${w.disconnect_grace_seconds} s · ${w.tracked_instances} tracked`,
    `L1        ${formatBytes(l1.used_bytes)} of ${formatBytes(l1.capacity_bytes)}${used} · ${l1.objects} objects · ${l1.evictions} evictions · hit ratio ${hit} · L2 ${doc.l2?.state ?? "off"}`,
    // With tenancy, one line per salt group (issue 27 item 2).
    ...(l1.tenants ?? []).map((g) =>
      `  tenant ${g.salt_group}: ${formatBytes(g.bytes)} of its share ${formatBytes(g.share_bytes)} (weight ${g.weight}) · ${g.evictions} evictions`
    ),
    ...(doc.l2 === null ? [] : [l2Line(doc.l2)]),
    eventsLine(doc.kv_events),
    `reaps     ${doc.recent_reaps.length} recent` +
    (last === undefined
      ? ""
      : ` · last: ${last.instance_id} ${last.reason} after ${last.silent_seconds.toFixed(1)} s silent (window ${last.window_seconds} s)`),
    ""
  ]
  if (doc.instances.length === 0) {
    lines.push("no registered instances")
  } else {
    const rows = doc.instances.map((i) => {
      const flags = [i.has_liveness_signal ? "ping" : "", i.has_transfer_activity ? "transfer" : ""].filter((f) => f !== "")
      const tenant = i["tenant"]
      const model = i["model_name"]
      return [
        i.instance_id,
        i.kind,
        typeof tenant === "string" && tenant !== "" ? tenant : "—",
        typeof model === "string" ? model : "—",
        i.state,
        `${i.last_seen_age_seconds.toFixed(1)} s`,
        flags.length > 0 ? flags.join(",") : "—"
      ]
    })
    lines.push(...table([["INSTANCE ID", "KIND", "TENANT", "MODEL", "STATE", "LAST SEEN", "FLAGS"], ...rows]))
  }
  return lines.join("\n")
}
