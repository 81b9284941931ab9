/**
 * The replay report's data and charts (issue 17) from a made-up timeline:
 * per-second buckets, the perfect-LRU line, events, and the SVG hooks a
 * reader parses.
 */
import { assert, describe, it } from "@effect/vitest"
import { perfectLru, perfectLruCumulative } from "../../src/replay/LruSim.ts"
import { chartSvg, EVENT_STYLES, fitAxis, niceStep, replayCharts } from "../../src/replay/ReportHtml.ts"
import { TimelineRecorder } from "../../src/replay/Timeline.ts"
import { parseReportCharts } from "../support/ReportSvg.ts"

const T0 = 1_700_000_000_000

const recorded = () => {
  const r = new TimelineRecorder(T0)
  r.sampleAlive(T0, 2)
  r.complete({ atMs: T0 + 200, latencyMs: 10, lookedUpChunks: 4, hitChunks: 0, bytesStored: 4_000_000, bytesRetrieved: 0 })
  r.complete({ atMs: T0 + 700, latencyMs: 30, lookedUpChunks: 4, hitChunks: 2, bytesStored: 2_000_000, bytesRetrieved: 2_000_000 })
  r.event(T0 + 1_500, { kind: "kill", slot: 1, instance_id: "11" })
  r.sampleAlive(T0 + 1_600, 1)
  r.sampleAlive(T0 + 1_700, 1)
  r.event(T0 + 2_500, { kind: "replace", slot: 3, instance_id: "33" })
  r.sampleAlive(T0 + 2_500, 2)
  r.complete({ atMs: T0 + 2_900, latencyMs: 50, lookedUpChunks: 2, hitChunks: 2, bytesStored: 0, bytesRetrieved: 2_000_000 })
  r.reap({ instance_id: "11", reason: "disconnect", reaped_at_ms: T0 + 3_600 })
  r.reap({ instance_id: "11", reason: "disconnect", reaped_at_ms: T0 + 3_600 })
  r.reap({ instance_id: "9", reason: "timeout", reaped_at_ms: T0 - 5_000 })
  return r.build(T0 + 3_000, [[4, 0], [8, 1], [10, 3]])
}

describe("replay timeline", () => {
  it("buckets completions per second, the cumulative ratios beside the perfect LRU's, and the events in time order", () => {
    const tl = recorded()
    assert.strictEqual(tl.duration_seconds, 3.6)
    assert.deepStrictEqual(tl.seconds, [
      { t: 0, requests: 2, latency_p50_ms: 10, latency_p99_ms: 30, hit_ratio: 0.25, perfect_lru_hit_ratio: 0.125, bytes_stored: 6_000_000, bytes_retrieved: 2_000_000 },
      { t: 1, requests: 0, latency_p50_ms: null, latency_p99_ms: null, hit_ratio: 0.25, perfect_lru_hit_ratio: 0.125, bytes_stored: 0, bytes_retrieved: 0 },
      { t: 2, requests: 1, latency_p50_ms: 50, latency_p99_ms: 50, hit_ratio: 0.4, perfect_lru_hit_ratio: 0.3, bytes_stored: 0, bytes_retrieved: 2_000_000 },
      { t: 3, requests: 0, latency_p50_ms: null, latency_p99_ms: null, hit_ratio: 0.4, perfect_lru_hit_ratio: 0.3, bytes_stored: 0, bytes_retrieved: 0 }
    ])
    assert.deepStrictEqual(tl.workers_alive, [{ t: 0, alive: 2 }, { t: 1.6, alive: 1 }, { t: 2.5, alive: 2 }, { t: 3.6, alive: 2 }])
    assert.deepStrictEqual(tl.events, [
      { t: 1.5, kind: "kill", slot: 1, instance_id: "11" },
      { t: 2.5, kind: "replace", slot: 3, instance_id: "33" },
      { t: 3.6, kind: "reap", instance_id: "11", reason: "disconnect" }
    ])
  })

  it("the charts carry the series and event marks as data attributes", () => {
    const tl = recorded()
    const html = replayCharts(tl).map((c) => chartSvg(c, tl.duration_seconds, tl.events)).join("\n")
    const charts = parseReportCharts(html)
    assert.deepStrictEqual(charts.map((c) => c.id), ["chart-latency", "chart-hit-ratio", "chart-workers", "chart-bytes"])
    const points = (chart: string, name: string) => charts.find((c) => c.id === chart)!.series.find((s) => s.name === name)!.points
    assert.deepStrictEqual(points("chart-latency", "latency-p50"), [[0.5, 10], [2.5, 50]])
    assert.deepStrictEqual(points("chart-latency", "latency-p99"), [[0.5, 30], [2.5, 50]])
    assert.deepStrictEqual(points("chart-hit-ratio", "hit-ratio"), [[1, 0.25], [2, 0.25], [3, 0.4], [4, 0.4]])
    assert.deepStrictEqual(points("chart-hit-ratio", "perfect-lru"), [[1, 0.125], [2, 0.125], [3, 0.3], [4, 0.3]])
    assert.deepStrictEqual(points("chart-workers", "workers-alive"), [[0, 2], [1.6, 1], [2.5, 2], [3.6, 2]])
    assert.deepStrictEqual(points("chart-bytes", "bytes-stored"), [[0.5, 6], [1.5, 0], [2.5, 0], [3.5, 0]])
    assert.deepStrictEqual(points("chart-bytes", "bytes-retrieved"), [[0.5, 2], [1.5, 0], [2.5, 2], [3.5, 0]])
    for (const c of charts) {
      assert.deepStrictEqual(c.events, [
        { kind: "kill", t: 1.5, slot: 1, instanceId: "11" },
        { kind: "replace", t: 2.5, slot: 3, instanceId: "33" },
        { kind: "reap", t: 3.6, instanceId: "11", reason: "disconnect" }
      ])
    }
  })

  it("the hit-ratio axis fits the data: round ends a tenth of the span beyond it, at least 4 points tall, within 0–100 %", () => {
    const ratio = { floor: 0, ceil: 1, minSpan: 0.04 }
    assert.deepStrictEqual(fitAxis(0.05, 0.09, ratio), { min: 0.04, max: 0.1, step: 0.01 })
    assert.deepStrictEqual(fitAxis(0.9, 0.99, ratio), { min: 0.85, max: 1, step: 0.05 })
    assert.deepStrictEqual(fitAxis(0.2, 0.2, ratio), { min: 0.18, max: 0.22, step: 0.01 })
    assert.deepStrictEqual(fitAxis(0, 0.03, ratio), { min: 0, max: 0.05, step: 0.01 })
    assert.deepStrictEqual(fitAxis(0.98, 1, ratio), { min: 0.96, max: 1, step: 0.01 })
    assert.deepStrictEqual(fitAxis(0.125, 0.4, ratio), { min: 0, max: 0.5, step: 0.1 })
    assert.deepStrictEqual(fitAxis(Infinity, -Infinity, ratio), { min: 0, max: 0.04, step: 0.01 })
    // The chart carries the fitted ends, and its ticks run between them.
    const tl = recorded()
    const svg = chartSvg(replayCharts(tl).find((c) => c.id === "chart-hit-ratio")!, tl.duration_seconds, tl.events)
    assert.include(svg, `data-y-min="0" data-y-max="0.5"`)
    assert.deepStrictEqual([...svg.matchAll(/<text class="tick" x="58"[^>]*>([^<]*)</g)].map((m) => m[1]), ["0%", "10%", "20%", "30%", "40%", "50%"])
    // The other charts start at 0.
    const latency = chartSvg(replayCharts(tl)[0]!, tl.duration_seconds, tl.events)
    assert.include(latency, `data-y-min="0" data-y-max="50"`)
  })

  it("each kind of event has its own colour, dash and marker shape, and a legend item with its count", () => {
    const styles = Object.values(EVENT_STYLES)
    for (const key of ["colour", "dash", "glyph"] as const) assert.strictEqual(new Set(styles.map((st) => st[key])).size, styles.length, key)
    assert.strictEqual(new Set(styles.map((st) => st.shape)).size, styles.length)
    const tl = recorded()
    const svg = chartSvg(replayCharts(tl)[2]!, tl.duration_seconds, tl.events)
    assert.deepStrictEqual(
      [...svg.matchAll(/<line class="event event-(\w+)"[^>]*?( stroke-dasharray="[^"]*")?>/g)].map((m) => [m[1], m[2] ?? ""]),
      [["kill", ""], ["replace", ` stroke-dasharray="6 3"`], ["reap", ` stroke-dasharray="1 3"`]]
    )
    assert.deepStrictEqual(
      [...svg.matchAll(/<path class="event-marker" data-event="(\w+)" data-t="([^"]*)"/g)].map((m) => [m[1], m[2]]),
      [["kill", "1.5"], ["replace", "2.5"], ["reap", "3.6"]]
    )
    assert.deepStrictEqual(
      [...svg.matchAll(/<g class="event-legend-item" data-event="(\w+)" data-count="(\d+)">[\s\S]*?<text[^>]*>([^<]*)<\/text>/g)]
        .map((m) => [m[1], m[2], m[3]]),
      [["kill", "1", "kill (1)"], ["replace", "1", "replace (1)"], ["reap", "1", "reap (1)"]]
    )
  })

  it("round axis steps; the cumulative LRU ends where perfectLru does", () => {
    assert.deepStrictEqual([niceStep(0), niceStep(7), niceStep(1), niceStep(5_000), niceStep(48, 10)], [1, 2, 0.2, 1000, 5])
    const requests = [{ hashIds: [1, 2], inputLength: 1024 }, { hashIds: [1, 3], inputLength: 1024 }, { hashIds: [1, 2], inputLength: 1024 }]
    const steps = perfectLruCumulative(requests, 256, 100)
    assert.deepStrictEqual(steps, [[4, 0], [8, 2], [12, 6]])
    assert.deepStrictEqual(perfectLru(requests, 256, 100), { lookedUpChunks: 12, hitChunks: 6, hitRatio: 0.5 })
  })
})
