/**
 * The replay report (`mpcache replay --report PATH.html`, issue 17): one
 * self-contained HTML file — inline CSS, inline SVG, no script that runs,
 * nothing fetched — with four charts over the run's timeline (Timeline.ts):
 *
 *   #chart-latency    request latency p50 / p99 per second, ms
 *   #chart-hit-ratio  cumulative hit ratio beside the perfect-LRU line (LruSim.ts)
 *   #chart-workers    workers alive (a step line)
 *   #chart-bytes      MB stored / retrieved per second
 *
 * and on every chart the kill, pause, resume, replace and reap events as
 * vertical marks, each kind with its own colour, dash and marker shape
 * (EVENT_STYLES) and a legend of the kinds that occur with their counts.
 * The hit-ratio axis is fitted to the data (fitAxis). Plain SVG strings built here from the data, so producing
 * a report needs no browser, no DOM and no dependency.
 *
 * Stable hooks for tests and tools: every series is a
 * `<path class="series" data-series="NAME" data-points="t,v;t,v;…">` (t in
 * seconds since the start, v in the chart's unit, exactly the plotted
 * values) inside `<svg id="chart-…">`; every event a
 * `<line class="event" data-event="KIND" data-t="…">` with
 * `data-slot` / `data-instance-id` / `data-reason` where known. The summary
 * and the timeline are embedded as JSON in
 * `<script type="application/json" id="replay-data">`.
 */
import type { ReplaySummary } from "./Driver.ts"
import { formatSummary, policyComparison, routerLine } from "./Report.ts"
import type { ReplayTimeline, TimelineEvent } from "./Timeline.ts"

/** One line of a chart: `points` are [t seconds, value] in the chart's unit. */
export interface ChartSeries {
  readonly name: string
  readonly label: string
  readonly colour: string
  readonly points: ReadonlyArray<readonly [number, number]>
  /** Draw as a step (hold each value until the next point). */
  readonly step?: boolean
  readonly dashed?: boolean
}

/** One chart: its id (`chart-…`), title, unit, value range and series. */
export interface Chart {
  readonly id: string
  readonly title: string
  readonly unit: string
  /** Fixed top of the value axis; otherwise a round number above the largest value. */
  readonly yMax?: number
  /**
   * Fit both ends of the value axis to the data ({@link fitAxis}) within `[floor, ceil]`, at least `minSpan`
   * tall, instead of starting at 0: a ratio of 5–9 % gets a 4–10 % axis, not a line along the bottom of 0–100 %.
   */
  readonly fit?: { readonly floor: number; readonly ceil: number; readonly minSpan: number }
  readonly format: (v: number) => string
  /** Value ticks at whole numbers only (counts). */
  readonly integerTicks?: boolean
  readonly series: ReadonlyArray<ChartSeries>
}

const WIDTH = 920
const HEIGHT = 272
const MARGIN = { left: 64, right: 16, top: 28, bottom: 48 }

/**
 * How each kind of event is drawn, so that kinds differ by more than colour (a reader who cannot tell red
 * from purple, or a grey print, still can): the line's dash, a marker shape at its top, at a height of its
 * own so that a kill, its replacement and its reap in the same second do not hide each other, and the glyph
 * the HTML legend shows for the shape.
 */
export const EVENT_STYLES: Record<TimelineEvent["kind"], {
  readonly colour: string
  readonly dash: string
  readonly shape: "cross" | "bars" | "triangle" | "diamond" | "circle"
  readonly glyph: string
  /** The marker's centre below the plot's top, px. */
  readonly row: number
}> = {
  kill: { colour: "#c53030", dash: "", shape: "cross", glyph: "✕", row: 7 },
  pause: { colour: "#b7791f", dash: "4 2 1 2", shape: "bars", glyph: "‖", row: 7 },
  resume: { colour: "#2f855a", dash: "8 3", shape: "triangle", glyph: "▶", row: 19 },
  replace: { colour: "#2b6cb0", dash: "6 3", shape: "diamond", glyph: "◆", row: 19 },
  reap: { colour: "#6b46c1", dash: "1 3", shape: "circle", glyph: "●", row: 31 }
}

const EVENT_KINDS = Object.keys(EVENT_STYLES) as ReadonlyArray<TimelineEvent["kind"]>

const esc = (s: string): string =>
  s.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;").replace(/'/g, "&#39;")

const num = (x: number, digits = 2): string => {
  const r = Math.round(x * 10 ** digits) / 10 ** digits
  return Object.is(r, -0) ? "0" : String(r)
}

/** A round step for about `count` ticks up to `max` (1, 2 or 5 × 10^k). */
export const niceStep = (max: number, count = 5): number => {
  if (!(max > 0)) return 1
  const raw = max / count
  const mag = 10 ** Math.floor(Math.log10(raw))
  const f = raw / mag
  return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * mag
}

/**
 * The value axis fitted to data between `lo` and `hi`: round ends ({@link niceStep} for about 5 ticks) that
 * leave a tenth of the data's span free on each side, at least `minSpan` tall, clamped to `[floor, ceil]`.
 * No data (`lo > hi`) gives `[floor, floor + minSpan]` (within `ceil`).
 */
export const fitAxis = (
  lo: number,
  hi: number,
  bounds: { readonly floor: number; readonly ceil: number; readonly minSpan: number }
): { readonly min: number; readonly max: number; readonly step: number } => {
  const { floor, ceil, minSpan } = bounds
  if (!(lo <= hi)) {
    const max = Math.min(ceil, floor + minSpan)
    return { min: floor, max, step: niceStep(max - floor) }
  }
  const mid = (lo + hi) / 2
  const span = Math.max(minSpan, (hi - lo) * 1.2)
  const step = niceStep(span)
  // Rounding to the step in decimal steps, so 0.1 + 0.2 does not leave an end at 0.30000000000000004.
  const round = (v: number) => Number(v.toPrecision(12))
  // A hair of slack, so an end that is a whole number of steps (0.18 / 0.01 = 17.999…) stays where it is.
  let min = round(Math.floor((mid - span / 2) / step + 1e-9) * step)
  let max = round(Math.ceil((mid + span / 2) / step - 1e-9) * step)
  if (min < floor) {
    max = Math.min(ceil, round(max + (floor - min)))
    min = floor
  }
  if (max > ceil) {
    min = Math.max(floor, round(min - (max - ceil)))
    max = ceil
  }
  return { min, max, step }
}

/** A marker of `shape` centred at (cx, cy), as an SVG path's `d` (strokes for cross and bars, fills for the rest). */
const markerPath = (shape: (typeof EVENT_STYLES)[TimelineEvent["kind"]]["shape"], cx: number, cy: number): string => {
  const r = 4.5
  switch (shape) {
    case "cross":
      return `M${num(cx - r)} ${num(cy - r)}L${num(cx + r)} ${num(cy + r)}M${num(cx - r)} ${num(cy + r)}L${num(cx + r)} ${num(cy - r)}`
    case "bars":
      return `M${num(cx - 2)} ${num(cy - r)}V${num(cy + r)}M${num(cx + 2)} ${num(cy - r)}V${num(cy + r)}`
    case "triangle":
      return `M${num(cx - r)} ${num(cy - r)}L${num(cx + r)} ${num(cy)}L${num(cx - r)} ${num(cy + r)}Z`
    case "diamond":
      return `M${num(cx)} ${num(cy - r)}L${num(cx + r)} ${num(cy)}L${num(cx)} ${num(cy + r)}L${num(cx - r)} ${num(cy)}Z`
    case "circle":
      return `M${num(cx - r)} ${num(cy)}a${r} ${r} 0 1 0 ${2 * r} 0a${r} ${r} 0 1 0 ${-2 * r} 0Z`
  }
}

/** One event marker: its shape in the kind's colour (stroked for the open shapes, filled for the others). */
const marker = (kind: TimelineEvent["kind"], cx: number, cy: number, extra = ""): string => {
  const st = EVENT_STYLES[kind]
  const open = st.shape === "cross" || st.shape === "bars"
  return `<path class="event-marker" data-event="${kind}"${extra} d="${markerPath(st.shape, cx, cy)}" ` +
    (open ? `fill="none" stroke="${st.colour}" stroke-width="2"` : `fill="${st.colour}" stroke="#fff" stroke-width="1"`) + `/>`
}

const eventTitle = (e: TimelineEvent): string => {
  const who = [e.slot === undefined ? "" : `worker ${e.slot}`, e.instance_id === undefined ? "" : `instance ${e.instance_id}`]
    .filter((s) => s !== "")
    .join(", ")
  return `${e.kind}${e.reason === undefined ? "" : ` (${e.reason})`}${who === "" ? "" : ` · ${who}`} at ${num(e.t)} s`
}

/** One chart as an `<svg>` element string, x from 0 to `xMax` seconds, with the events marked. */
export const chartSvg = (chart: Chart, xMax: number, events: ReadonlyArray<TimelineEvent>): string => {
  const plotW = WIDTH - MARGIN.left - MARGIN.right
  const plotH = HEIGHT - MARGIN.top - MARGIN.bottom
  const values = chart.series.flatMap((s) => s.points.map(([, v]) => v))
  const dataMax = Math.max(0, ...values)
  const fitted = chart.fit === undefined ? undefined : fitAxis(Math.min(...values), Math.max(...values), chart.fit)
  const yStep = fitted?.step ??
    (chart.integerTicks ? Math.max(1, niceStep(chart.yMax ?? dataMax)) : niceStep(chart.yMax ?? dataMax))
  const yBottom = fitted?.min ?? 0
  const yTop = fitted?.max ?? chart.yMax ?? Math.max(yStep, Math.ceil(dataMax / yStep) * yStep)
  const xEnd = Math.max(1, xMax)
  const xStep = niceStep(xEnd, 10)
  const x = (t: number) => MARGIN.left + (Math.min(t, xEnd) / xEnd) * plotW
  const y = (v: number) => MARGIN.top + plotH - ((Math.min(Math.max(v, yBottom), yTop) - yBottom) / (yTop - yBottom)) * plotH
  const out: Array<string> = []
  out.push(
    `<svg id="${esc(chart.id)}" class="chart" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 ${WIDTH} ${HEIGHT}" ` +
      `width="${WIDTH}" height="${HEIGHT}" role="img" aria-label="${esc(chart.title)}" data-unit="${esc(chart.unit)}" ` +
      `data-x-max="${num(xEnd, 3)}" data-y-min="${num(yBottom, 6)}" data-y-max="${num(yTop, 6)}">`
  )
  out.push(`<title>${esc(chart.title)}</title>`)
  out.push(`<text class="chart-title" x="${MARGIN.left}" y="18">${esc(chart.title)}</text>`)
  // Grid and axes.
  out.push(`<g class="axis axis-y">`)
  for (let i = 0, v = yBottom; v <= yTop + yStep / 1e6; i++, v = Number((yBottom + i * yStep).toPrecision(12))) {
    out.push(
      `<line class="grid" x1="${MARGIN.left}" x2="${WIDTH - MARGIN.right}" y1="${num(y(v))}" y2="${num(y(v))}"/>` +
        `<text class="tick" x="${MARGIN.left - 6}" y="${num(y(v) + 4)}" text-anchor="end">${esc(chart.format(v))}</text>`
    )
  }
  out.push(`</g><g class="axis axis-x">`)
  for (let t = 0; t <= xEnd + xStep / 1e6; t += xStep) {
    out.push(
      `<line class="tick-mark" x1="${num(x(t))}" x2="${num(x(t))}" y1="${MARGIN.top + plotH}" y2="${MARGIN.top + plotH + 4}"/>` +
        `<text class="tick" x="${num(x(t))}" y="${MARGIN.top + plotH + 16}" text-anchor="middle">${num(t)}</text>`
    )
  }
  out.push(
    `<text class="axis-label" x="${WIDTH - MARGIN.right}" y="${HEIGHT - 8}" text-anchor="end">seconds since start</text>` +
      `<line class="axis-line" x1="${MARGIN.left}" x2="${WIDTH - MARGIN.right}" y1="${MARGIN.top + plotH}" y2="${MARGIN.top + plotH}"/>` +
      `</g>`
  )
  // Events.
  out.push(`<g class="events">`)
  for (const e of events) {
    const attrs = [
      `data-event="${e.kind}"`,
      `data-t="${num(e.t, 3)}"`,
      e.slot === undefined ? "" : `data-slot="${e.slot}"`,
      e.instance_id === undefined ? "" : `data-instance-id="${esc(e.instance_id)}"`,
      e.reason === undefined ? "" : `data-reason="${esc(e.reason)}"`
    ].filter((a) => a !== "").join(" ")
    const st = EVENT_STYLES[e.kind]
    out.push(
      `<line class="event event-${e.kind}" ${attrs} x1="${num(x(e.t))}" x2="${num(x(e.t))}" y1="${MARGIN.top}" ` +
        `y2="${MARGIN.top + plotH}" stroke="${st.colour}"${st.dash === "" ? "" : ` stroke-dasharray="${st.dash}"`}>` +
        `<title>${esc(eventTitle(e))}</title></line>` +
        marker(e.kind, x(e.t), MARGIN.top + st.row, ` data-t="${num(e.t, 3)}"`)
    )
  }
  out.push(`</g>`)
  // The events' legend, bottom left: each kind that occurs, drawn as on the chart, with its count.
  out.push(`<g class="event-legend">`)
  let ex = MARGIN.left
  for (const kind of EVENT_KINDS) {
    const count = events.filter((e) => e.kind === kind).length
    if (count === 0) continue
    const st = EVENT_STYLES[kind]
    const label = `${kind} (${count})`
    out.push(
      `<g class="event-legend-item" data-event="${kind}" data-count="${count}">` +
        `<line x1="${ex}" x2="${ex + 22}" y1="${HEIGHT - 12}" y2="${HEIGHT - 12}" stroke="${st.colour}" stroke-width="1.5"` +
        `${st.dash === "" ? "" : ` stroke-dasharray="${st.dash}"`}/>${marker(kind, ex + 11, HEIGHT - 12)}` +
        `<text class="legend-label" x="${ex + 28}" y="${HEIGHT - 8}">${esc(label)}</text></g>`
    )
    ex += 40 + label.length * 7
  }
  out.push(`</g>`)
  // Series.
  out.push(`<g class="series-group">`)
  for (const s of chart.series) {
    const pts = s.points
    let d = ""
    pts.forEach(([t, v], i) => {
      if (i === 0) d += `M${num(x(t))} ${num(y(v))}`
      else if (s.step) d += `H${num(x(t))}V${num(y(v))}`
      else d += `L${num(x(t))} ${num(y(v))}`
    })
    const data = pts.map(([t, v]) => `${num(t, 3)},${num(v, 6)}`).join(";")
    out.push(
      `<path class="series series-${esc(s.name)}" data-series="${esc(s.name)}" data-label="${esc(s.label)}" ` +
        `data-points="${data}" d="${d}" fill="none" stroke="${s.colour}" stroke-width="2"` +
        `${s.dashed ? ` stroke-dasharray="6 4"` : ""}/>`
    )
    if (!s.step && pts.length <= 300) {
      for (const [t, v] of pts) {
        out.push(`<circle class="point" data-series="${esc(s.name)}" cx="${num(x(t))}" cy="${num(y(v))}" r="2.5" fill="${s.colour}"/>`)
      }
    }
  }
  out.push(`</g>`)
  // Legend.
  out.push(`<g class="legend">`)
  let lx = WIDTH - MARGIN.right
  for (const s of [...chart.series].reverse()) {
    const w = 28 + s.label.length * 7
    lx -= w
    out.push(
      `<line x1="${lx}" x2="${lx + 18}" y1="14" y2="14" stroke="${s.colour}" stroke-width="2"${s.dashed ? ` stroke-dasharray="6 4"` : ""}/>` +
        `<text class="legend-label" x="${lx + 22}" y="18">${esc(s.label)}</text>`
    )
  }
  out.push(`</g></svg>`)
  return out.join("\n")
}

const pct = (v: number) => `${num(100 * v, 1)}%`

/** The four charts of a replay (ids, series names, units as the module header lists them). */
export const replayCharts = (tl: ReplayTimeline): ReadonlyArray<Chart> => {
  const secs = tl.seconds
  const latency = (key: "latency_p50_ms" | "latency_p99_ms") =>
    secs.flatMap((s): Array<readonly [number, number]> => (s[key] === null ? [] : [[s.t + 0.5, s[key]!]]))
  const ratio = (key: "hit_ratio" | "perfect_lru_hit_ratio") =>
    secs.flatMap((s): Array<readonly [number, number]> => (s[key] === null ? [] : [[s.t + 1, s[key]!]]))
  const mb = (key: "bytes_stored" | "bytes_retrieved") => secs.map((s): readonly [number, number] => [s.t + 0.5, s[key] / 1e6])
  return [
    {
      id: "chart-latency",
      title: "Request latency per second (ms)",
      unit: "ms",
      format: (v) => num(v, 1),
      series: [
        { name: "latency-p50", label: "p50", colour: "#2b6cb0", points: latency("latency_p50_ms") },
        { name: "latency-p99", label: "p99", colour: "#c05621", points: latency("latency_p99_ms") }
      ]
    },
    {
      id: "chart-hit-ratio",
      title: "Hit ratio over the run (cumulative)",
      unit: "ratio",
      fit: { floor: 0, ceil: 1, minSpan: 0.04 },
      format: pct,
      series: [
        { name: "hit-ratio", label: "mpcache", colour: "#2f855a", points: ratio("hit_ratio") },
        { name: "perfect-lru", label: "perfect LRU", colour: "#718096", points: ratio("perfect_lru_hit_ratio"), dashed: true }
      ]
    },
    {
      id: "chart-workers",
      title: "Workers alive",
      unit: "workers",
      format: (v) => num(v, 0),
      integerTicks: true,
      series: [{
        name: "workers-alive",
        label: "alive",
        colour: "#2d3748",
        step: true,
        points: tl.workers_alive.map((s): readonly [number, number] => [s.t, s.alive])
      }]
    },
    {
      id: "chart-bytes",
      title: "Bytes moved per second (MB)",
      unit: "MB",
      format: (v) => num(v, 2),
      series: [
        { name: "bytes-stored", label: "stored", colour: "#805ad5", points: mb("bytes_stored") },
        { name: "bytes-retrieved", label: "retrieved", colour: "#dd6b20", points: mb("bytes_retrieved") }
      ]
    }
  ]
}

/** JSON that may sit inside `<script>`: no `<` (so no `</script>`), and no U+2028/9. */
const scriptJson = (value: unknown): string =>
  JSON.stringify(value).replace(/</g, "\\u003c").replace(/\u2028/g, "\\u2028").replace(/\u2029/g, "\\u2029")

/** The whole report: one HTML document (UTF-8). */
export const reportHtml = (summary: ReplaySummary, timeline: ReplayTimeline, policies: ReadonlyArray<ReplaySummary> = [summary]): string => {
  const counts = (kind: TimelineEvent["kind"]) => timeline.events.filter((e) => e.kind === kind).length
  const legend = EVENT_KINDS
    .map((k) => `<span class="ev" data-event="${k}"><b style="color:${EVENT_STYLES[k].colour}">${EVENT_STYLES[k].glyph}</b>${k} (${counts(k)})</span>`)
    .join(" ")
  const figures: Array<[string, string]> = [
    ["requests", `${summary.requests} (${summary.failed_requests} failed) in ${summary.duration_seconds} s`],
    ["hit ratio", `${num(100 * summary.hit_ratio)}% · perfect LRU ${num(100 * summary.perfect_lru_hit_ratio)}%`],
    ...(summary.servers > 1 || summary.l2_url !== null
      ? [[
        "hits by tier",
        `${summary.servers} servers · L2 ${summary.l2_url ?? "none"} · L1 ${num(100 * summary.hit_ratio_l1)}% · L2 ${num(100 * summary.hit_ratio_l2)}% · ` +
        `perfect LRU of the combined capacity ${num(100 * summary.perfect_lru_combined_hit_ratio)}%`
      ] as [string, string]]
      : []),
    ["router", routerLine(summary)],
    ...(policies.length > 1 ? [["routers compared", policyComparison(policies).join("\n")] as [string, string]] : []),
    ["latency p50 / p99", `${summary.latency_ms.request.p50} / ${summary.latency_ms.request.p99} ms`],
    ["moved", `${summary.gb_stored} GB stored · ${summary.gb_retrieved} GB retrieved`],
    ["churn", `killed ${summary.churn.killed} · paused ${summary.churn.paused} · replaced ${summary.churn.replaced}`],
    ["reaped", Object.entries(summary.reaped).map(([k, v]) => `${k} ${v}`).join(" · ")],
    ["checks", `leaked ${summary.leaked_contexts} · open mappings ${summary.open_mappings_after_shutdown} · mismatches ${summary.data_mismatches}`]
  ]
  const charts = replayCharts(timeline).map((c) => `<figure>${chartSvg(c, timeline.duration_seconds, timeline.events)}</figure>`)
  return `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>mpcache replay report</title>
<style>
  body { margin: 0; padding: 1rem 1.5rem; font: 14px/1.4 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #1d232b; background: #f6f7f9; }
  h1 { font-size: 1.2rem; margin: 0 0 .3rem; }
  .muted { color: #66707c; }
  * { box-sizing: border-box; }
  dl { display: grid; grid-template-columns: max-content minmax(0, 1fr); gap: .2rem 1rem; background: #fff; border: 1px solid #e1e4e8; border-radius: 6px; padding: .8rem 1rem; max-width: 940px; }
  dt { color: #66707c; } dd { margin: 0; font-variant-numeric: tabular-nums; overflow-wrap: anywhere; white-space: pre-line; }
  figure { margin: 1rem 0; background: #fff; border: 1px solid #e1e4e8; border-radius: 6px; padding: .4rem; max-width: 940px; }
  svg.chart { display: block; width: 100%; height: auto; font: 11px system-ui, sans-serif; }
  svg .chart-title { font-weight: 600; font-size: 13px; fill: #1d232b; }
  svg .grid { stroke: #edf0f3; } svg .axis-line, svg .tick-mark { stroke: #a0aec0; }
  svg .tick, svg .axis-label, svg .legend-label { fill: #4a5568; }
  svg .event { stroke-width: 1.5; opacity: .85; }
  .ev { margin-right: 1rem; white-space: nowrap; } .ev b { margin-right: .3rem; }
  /* The summary wraps instead of scrolling: no line of it hides behind a scrollbar, at any width. */
  pre { background: #fff; border: 1px solid #e1e4e8; border-radius: 6px; padding: .8rem 1rem; max-width: 940px; white-space: pre-wrap; overflow-wrap: anywhere; overflow: visible; }
</style>
</head>
<body>
<h1>mpcache replay report</h1>
<p class="muted">${esc(summary.trace)} · ${summary.workers} workers · ${esc(summary.transfer_mode)} · model ${esc(summary.model)} · chunk ${summary.chunk_size} tokens · L1 ${summary.l1_capacity_chunks} chunks · started ${esc(new Date(timeline.started_at_ms).toISOString())}</p>
<dl>
${figures.map(([k, v]) => `  <dt>${esc(k)}</dt><dd>${esc(v)}</dd>`).join("\n")}
</dl>
<p>Events: ${legend}</p>
${charts.join("\n")}
<h2>Summary</h2>
<pre>${esc(formatSummary(summary))}</pre>
<script type="application/json" id="replay-data">${scriptJson({ summary, timeline })}</script>
</body>
</html>
`
}
