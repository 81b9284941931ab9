/**
 * The live status page served at `GET /` by the HTTP frontend (issue 17;
 * DESIGN §7): one self-contained HTML document — inline CSS and script, no
 * CDN, fonts or external requests, so it works on an air-gapped node — that
 * fetches `/api/status` every second (no reload) and renders:
 *
 *   - the server: version, protocol, endpoint, uptime, liveness windows, peers;
 *   - one row per instance: decimal id, kind, tenant ("—" until tenants
 *     exist), state startup | active | suspect (coloured), seconds since
 *     last seen, flags (ping / transfer latched), the bytes of its worker's
 *     memory the server maps and in how many mappings (`mapped_bytes`,
 *     `mappings`; "—" where a module reports none);
 *   - the last 50 reaps, newest first: time, id, reason, seconds silent, window;
 *     every time on the page (the reaps, "updated …") in one format, local
 *     date and time, with the zone named in the header;
 *   - L1 use (bytes used / capacity, objects, evictions) and the hit ratio;
 *     with tenancy, L1 by salt group (`#l1-tenants`: bytes, share, weight, evictions)
 *   - readiness (`#server-readiness`): /readyz's verdict, and each failing check with why
 *     since start (`lookup.hit_chunks / lookup.looked_up_chunks`), and the
 *     L2 state ("off" while the server's `l2` block is null) and, with L2 on,
 *     its store (url, bytes and writes in flight, counts, last error);
 *   - KV events (`#kv-events-*`, issue 28 item 7): on or off, the log's depth,
 *     capacity, oldest and newest sequence numbers and incarnation, what it
 *     recorded, dropped and answered `lost`, and the PUB's subscribers,
 *     batches and replays served ("off" without `--kv-events-endpoint`).
 *
 * A TypeScript module exporting the page as a string, so the library build
 * (tsconfig.build.json → dist/) carries it with no asset to copy.
 *
 * Stable hooks for tests and scrapers: `#instances tbody tr[data-instance-id]`
 * with `td.state[data-state]`, `#reaps tbody tr[data-instance-id][data-reason]`,
 * `#server-*`, `#l1-*`, `#l2-state`, `body[data-polls]` (successful polls)
 * and `#poll-status[data-ok]`. The script builds every cell with
 * `textContent` (never HTML from the document).
 */

/** `Content-Security-Policy` of the page: nothing but itself and same-origin `fetch`. */
export const STATUS_PAGE_CSP =
  "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'"

/** The page (UTF-8 HTML). */
export const STATUS_PAGE_HTML = `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>mpcache status</title>
<style>
  :root { --bg:#f6f7f9; --fg:#1d232b; --muted:#66707c; --card:#fff; --line:#e1e4e8;
          --startup:#b7791f; --active:#2f855a; --suspect:#c53030; --accent:#2b6cb0; }
  * { box-sizing: border-box; }
  body { margin:0; font: 14px/1.4 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; background:var(--bg); color:var(--fg); }
  header { display:flex; align-items:baseline; gap:1rem; padding:.8rem 1.2rem; background:#1d232b; color:#fff; }
  header h1 { font-size:1.1rem; margin:0; }
  header .muted { color:#aab3bf; }
  #poll-status { margin-left:auto; font-size:.85rem; }
  #poll-status[data-ok="false"] { color:#feb2b2; font-weight:600; }
  main { padding:1rem 1.2rem; display:grid; gap:1rem; grid-template-columns: repeat(auto-fit, minmax(420px, 1fr)); }
  section { background:var(--card); border:1px solid var(--line); border-radius:6px; padding:.8rem 1rem; }
  section.wide { grid-column: 1 / -1; }
  h2 { font-size:.95rem; margin:0 0 .6rem; text-transform:uppercase; letter-spacing:.04em; color:var(--muted); }
  dl { display:grid; grid-template-columns:max-content 1fr; gap:.2rem .8rem; margin:0; }
  dt { color:var(--muted); }
  dd { margin:0; font-variant-numeric: tabular-nums; overflow-wrap: anywhere; }
  table { width:100%; border-collapse:collapse; font-variant-numeric: tabular-nums; }
  th, td { text-align:left; padding:.3rem .5rem; border-bottom:1px solid var(--line); white-space:nowrap; }
  th { color:var(--muted); font-weight:600; font-size:.8rem; }
  td.num, th.num { text-align:right; }
  td.empty { color:var(--muted); font-style:italic; }
  .state { font-weight:600; }
  .state::before { content:""; display:inline-block; width:.6rem; height:.6rem; border-radius:50%; margin-right:.4rem; background:currentColor; }
  .state[data-state="startup"] { color:var(--startup); }
  .state[data-state="active"] { color:var(--active); }
  .state[data-state="suspect"] { color:var(--suspect); }
  tr[data-state="suspect"] { background:#fff5f5; }
  .reason { font-weight:600; }
  .bar { height:.5rem; background:var(--line); border-radius:3px; overflow:hidden; margin-top:.3rem; }
  .bar > div { height:100%; background:var(--accent); width:0; }
  .off { color:var(--muted); }
  #server-readiness[data-status="not_ready"] { color:var(--suspect); font-weight:600; }
  #l2-state.open, #l2-state.probing { color:var(--suspect); font-weight:600; }
</style>
</head>
<body data-polls="0">
<header>
  <h1>mpcache</h1>
  <span class="muted" id="server-version">…</span>
  <span id="poll-status" data-ok="false">connecting…</span>
  <span class="muted">times: <span class="time-zone">local</span></span>
</header>
<main>
  <section id="server">
    <h2>Server</h2>
    <dl>
      <dt>readiness</dt><dd id="server-readiness">—</dd>
      <dt>endpoint</dt><dd id="server-endpoint">—</dd>
      <dt>uptime</dt><dd id="server-uptime">—</dd>
      <dt>protocol</dt><dd id="server-protocol">—</dd>
      <dt>chunk size</dt><dd id="server-chunk">—</dd>
      <dt>peers</dt><dd id="server-peers">—</dd>
      <dt>liveness</dt><dd id="server-windows">—</dd>
      <dt>tracked</dt><dd id="server-tracked">—</dd>
      <dt>worker memory</dt><dd id="server-mapped">—</dd>
      <dt>mapping limits</dt><dd id="server-map-limits">—</dd>
    </dl>
  </section>
  <section id="cache">
    <h2>Cache</h2>
    <dl>
      <dt>L1 used</dt><dd><span id="l1-used">—</span><div class="bar"><div id="l1-bar"></div></div></dd>
      <dt>L1 objects</dt><dd id="l1-objects">—</dd>
      <dt>L1 evictions</dt><dd id="l1-evictions">—</dd>
      <dt>L1 hit ratio</dt><dd id="l1-hit-ratio">—</dd>
      <dt>lookups</dt><dd id="l1-lookups">—</dd>
      <dt>L2</dt><dd id="l2-state" class="off">off</dd>
      <dt>L2 store</dt><dd id="l2-detail">—</dd>
    </dl>
  </section>
  <section id="kv-events">
    <h2>KV events</h2>
    <dl>
      <dt>events</dt><dd id="kv-events-state" class="off">—</dd>
      <dt>log</dt><dd id="kv-events-log">—</dd>
      <dt>recorded</dt><dd id="kv-events-records">—</dd>
      <dt>publisher</dt><dd id="kv-events-publisher">—</dd>
    </dl>
  </section>
  <section id="l1-tenants" class="wide" hidden>
    <h2>L1 by tenant (salt group)</h2>
    <table>
      <thead><tr><th>salt group</th><th class="num">L1 bytes</th><th class="num">share</th><th class="num">weight</th>
        <th class="num">evictions</th></tr></thead>
      <tbody></tbody>
    </table>
  </section>
  <section id="instances" class="wide">
    <h2>Instances (<span id="instances-count">0</span>)</h2>
    <table>
      <thead><tr><th>instance id</th><th>kind</th><th>tenant</th><th>model</th><th>state</th>
        <th class="num">last seen (s ago)</th><th>flags</th><th class="num">mapped bytes</th></tr></thead>
      <tbody></tbody>
    </table>
  </section>
  <section id="reaps" class="wide">
    <h2>Recent reaps (<span id="reaps-count">0</span>, newest first)</h2>
    <table>
      <thead><tr><th>time (<span class="time-zone">local</span>)</th><th>instance id</th><th>reason</th><th class="num">silent (s)</th>
        <th class="num">window (s)</th><th>module</th></tr></thead>
      <tbody></tbody>
    </table>
  </section>
</main>
<script>
"use strict";
(function () {
  var POLL_MS = 1000;
  var polls = 0;
  function $(id) { return document.getElementById(id); }
  function set(id, text) { $(id).textContent = text; }
  function cell(tr, text, cls) {
    var td = document.createElement("td");
    td.textContent = text;
    if (cls) td.className = cls;
    tr.appendChild(td);
    return td;
  }
  function bytes(n) {
    if (typeof n !== "number" || !isFinite(n)) return "—";
    var units = ["B", "KiB", "MiB", "GiB", "TiB"], i = 0, v = n;
    while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
    return (i === 0 ? String(v) : v.toFixed(1)) + " " + units[i];
  }
  function duration(s) {
    s = Math.floor(s);
    var d = Math.floor(s / 86400), h = Math.floor(s % 86400 / 3600), m = Math.floor(s % 3600 / 60), r = s % 60;
    return (d ? d + "d " : "") + (d || h ? h + "h " : "") + (d || h || m ? m + "m " : "") + r + "s";
  }
  function secs(x) { return typeof x === "number" ? x.toFixed(1) : "—"; }
  function two(n) { return (n < 10 ? "0" : "") + n; }
  // The page's one time format: local date and time to the second; the zone is named once, in the headers.
  function clock(ms) {
    var t = new Date(ms);
    return t.getFullYear() + "-" + two(t.getMonth() + 1) + "-" + two(t.getDate()) + " " +
      two(t.getHours()) + ":" + two(t.getMinutes()) + ":" + two(t.getSeconds());
  }
  function zone() {
    var off = -new Date().getTimezoneOffset(), a = Math.abs(off);
    return "local, UTC" + (off < 0 ? "−" : "+") + two(Math.floor(a / 60)) + ":" + two(a % 60);
  }
  document.querySelectorAll(".time-zone").forEach(function (el) { el.textContent = zone(); });
  function empty(tbody, cols, text) {
    var tr = document.createElement("tr");
    var td = cell(tr, text, "empty");
    td.colSpan = cols;
    tbody.appendChild(tr);
  }
  function render(doc) {
    set("server-version", "v" + doc.version);
    // /readyz's verdict and, when not ready, each failing check with why (issue 27 item 3).
    var rd = doc.readiness || { status: "not_ready", checks: [] };
    var failing = (rd.checks || []).filter(function (c) { return !c.ok; });
    set("server-readiness", rd.status === "ready"
      ? "ready (" + rd.checks.map(function (c) { return c.name; }).join(", ") + ")"
      : "not ready: " + failing.map(function (c) { return c.name + ": " + c.detail; }).join("; "));
    $("server-readiness").setAttribute("data-status", rd.status);
    set("server-endpoint", doc.endpoint);
    set("server-uptime", duration(doc.uptime_seconds));
    set("server-protocol", String(doc.protocol_version));
    set("server-chunk", doc.chunk_size + " tokens");
    set("server-peers", String(doc.connected_peers));
    var w = doc.worker_liveness || {};
    set("server-windows", (w.enabled ? "reaper on" : "reaper off") +
      " · reap timeout " + w.reap_timeout_seconds + " s · registration grace " + w.registration_grace_seconds +
      " s · disconnect grace " + w.disconnect_grace_seconds + " s");
    set("server-tracked", String(w.tracked_instances));
    var nat = doc.native || {};
    set("server-mapped", bytes(nat.mapped_bytes) + " in " + nat.open_mappings + " mapping(s)");
    var ml = doc.mapping_limits || {}, mr = ml.refused || {};
    set("server-map-limits", ml.mappings + " / " + ml.max_mappings + " mappings · ≤ " + ml.max_segments_per_register +
      " segments per REGISTER · host " + bytes(ml.host_mapped_bytes) + " / " + bytes(ml.max_mapped_bytes) +
      " · process maps " + ml.process_maps + " of " + ml.kernel_max_map_count + " (vm.max_map_count" +
      (ml.kernel_max_map_count_source === "fallback" ? ", assumed" : "") + ") · refused " +
      ((mr.max_segments_per_register || 0) + (mr.max_mappings || 0) + (mr.max_mapped_bytes || 0)));

    var l1 = doc.l1 || {};
    var cap = l1.capacity_bytes || 0, used = l1.used_bytes || 0;
    set("l1-used", bytes(used) + " / " + bytes(cap) + (cap > 0 ? " (" + (100 * used / cap).toFixed(1) + "%)" : ""));
    $("l1-bar").style.width = (cap > 0 ? Math.min(100, 100 * used / cap) : 0) + "%";
    set("l1-objects", l1.objects + " (" + l1.locked_objects + " locked, " + l1.reserved_objects + " reserved)");
    set("l1-evictions", String(l1.evictions));
    var lk = doc.lookup || {};
    var ratio = lk.looked_up_chunks > 0 ? lk.hit_chunks / lk.looked_up_chunks : undefined;
    set("l1-hit-ratio", ratio === undefined ? "— (no lookups yet)" :
      (100 * ratio).toFixed(1) + "% (" + lk.hit_chunks + " of " + lk.looked_up_chunks + " chunks)");
    $("l1-hit-ratio").setAttribute("data-ratio", ratio === undefined ? "" : String(ratio));
    set("l1-lookups", String(lk.lookups));
    // With tenancy: each salt group's L1 bytes, share, weight and evictions (issue 27 item 2); hidden without.
    var groups = l1.tenants;
    var shares = $("l1-tenants");
    shares.hidden = !groups;
    var sbody = shares.querySelector("tbody");
    sbody.textContent = "";
    (groups || []).forEach(function (g) {
      var tr = document.createElement("tr");
      tr.setAttribute("data-salt-group", g.salt_group);
      cell(tr, g.salt_group, "group");
      cell(tr, bytes(g.bytes), "num bytes");
      cell(tr, bytes(g.share_bytes), "num share");
      cell(tr, String(g.weight), "num weight");
      cell(tr, String(g.evictions), "num evictions");
      sbody.appendChild(tr);
    });

    var l2 = $("l2-state");
    if (doc.l2 && typeof doc.l2 === "object") {
      var b = doc.l2;
      l2.textContent = b.state || "on"; l2.className = b.state === "ok" ? "" : b.state;
      set("l2-detail", b.url + (b.connected ? "" : " (not connected)") + "; " + bytes(b.inflight_bytes) + " in flight (" + b.queue_depth + " writes); " +
        b.writes + " written, " + b.dropped_writes + " dropped, " + b.hit_chunks + " hit chunks, " + b.corrupt_values + " corrupt; " +
        (b.authenticated ? "authenticated (" + b.unauthenticated_values + " refused)" : "not authenticated") +
        (b.last_error ? "; last error: " + b.last_error : ""));
    } else {
      l2.textContent = "off"; l2.className = "off";
      set("l2-detail", "—");
    }

    var ev = doc.kv_events;
    var evState = $("kv-events-state");
    if (ev && typeof ev === "object" && ev.enabled) {
      evState.textContent = "on"; evState.className = "";
      set("kv-events-log", ev.depth + " / " + ev.capacity + " records · seq " +
        (ev.newest_seq === 0 ? "— (empty)" : ev.oldest_seq + " … " + ev.newest_seq) + " · incarnation " + ev.incarnation);
      set("kv-events-records", ev.records.stored + " stored · " + ev.records.removed + " removed · " + ev.dropped + " dropped · " + ev.lost_answers + " lost answers · " +
        ev.held_chunks + " chunks held");
      var pub = ev.publisher;
      set("kv-events-publisher", pub && typeof pub === "object"
        ? pub.endpoint + " (topic " + JSON.stringify(pub.topic) + ") · " + pub.subscribers + " subscriber(s) · " +
          pub.batches_published + " batches · " + (pub.replay_endpoint === null ? "no replay" : pub.replays_served + " replays served")
        : "off");
    } else {
      evState.textContent = "off (--kv-event-log-size 0)"; evState.className = "off";
      set("kv-events-log", "—");
      set("kv-events-records", "—");
      set("kv-events-publisher", "—");
    }

    var instances = doc.instances || [];
    set("instances-count", String(instances.length));
    var tbody = $("instances").querySelector("tbody");
    tbody.textContent = "";
    if (instances.length === 0) empty(tbody, 8, "no registered instances");
    instances.forEach(function (i) {
      var tr = document.createElement("tr");
      tr.setAttribute("data-instance-id", i.instance_id);
      tr.setAttribute("data-state", i.state);
      cell(tr, i.instance_id, "id");
      cell(tr, i.kind, "kind");
      cell(tr, typeof i.tenant === "string" && i.tenant !== "" ? i.tenant : "—", "tenant");
      cell(tr, typeof i.model_name === "string" ? i.model_name : "—", "model");
      cell(tr, i.state, "state").setAttribute("data-state", i.state);
      cell(tr, secs(i.last_seen_age_seconds), "num age");
      var flags = [];
      if (i.has_liveness_signal) flags.push("ping");
      if (i.has_transfer_activity) flags.push("transfer");
      cell(tr, flags.length ? flags.join(" · ") : "—", "flags");
      var mapped = cell(tr, typeof i.mapped_bytes === "number"
        ? bytes(i.mapped_bytes) + " in " + i.mappings + " mapping(s)" : "—", "num mapped");
      mapped.setAttribute("data-bytes", typeof i.mapped_bytes === "number" ? String(i.mapped_bytes) : "");
      tbody.appendChild(tr);
    });

    var reaps = (doc.recent_reaps || []).slice().reverse();
    set("reaps-count", String(reaps.length));
    var rbody = $("reaps").querySelector("tbody");
    rbody.textContent = "";
    if (reaps.length === 0) empty(rbody, 6, "nothing reaped since start");
    reaps.forEach(function (r) {
      var tr = document.createElement("tr");
      tr.setAttribute("data-instance-id", r.instance_id);
      tr.setAttribute("data-reason", r.reason);
      cell(tr, clock(r.reaped_at_ms), "time");
      cell(tr, r.instance_id, "id");
      cell(tr, r.reason, "reason");
      cell(tr, secs(r.silent_seconds), "num silent");
      cell(tr, String(r.window_seconds), "num window");
      cell(tr, r.module, "module");
      rbody.appendChild(tr);
    });
  }
  function poll() {
    var status = $("poll-status");
    fetch("/api/status", { cache: "no-store" })
      .then(function (r) {
        if (!r.ok) throw new Error("GET /api/status answered " + r.status);
        return r.json();
      })
      .then(function (doc) {
        render(doc);
        polls++;
        document.body.setAttribute("data-polls", String(polls));
        status.setAttribute("data-ok", "true");
        status.textContent = "updated " + clock(Date.now());
      })
      .catch(function (e) {
        status.setAttribute("data-ok", "false");
        status.textContent = "status unavailable: " + (e && e.message ? e.message : String(e));
      })
      .then(function () { setTimeout(poll, POLL_MS); });
  }
  poll();
})();
</script>
</body>
</html>
`
