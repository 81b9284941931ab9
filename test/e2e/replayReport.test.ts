/**
 * `mpcache replay --report PATH.html` (issue 17) as a user runs it: a short
 * replay with workers SIGKILLed writes one self-contained HTML file whose
 * SVG charts carry the expected series and event marks. The SVG is parsed
 * (data-series / data-points / data-event), never compared as an image.
 */
import { existsSync, mkdtempSync, readFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import type { ReplaySummary } from "../../src/replay/Driver.ts"
import { fitAxis } from "../../src/replay/ReportHtml.ts"
import type { ReplayTimeline } from "../../src/replay/Timeline.ts"
import { browserIn, hasChromium, NO_CHROMIUM, screenshotDir, warnWithoutChromium } from "../support/Browser.ts"
import { runCli } from "../support/Cli.ts"
import { parseReportCharts, reportData } from "../support/ReportSvg.ts"

const last = <A>(xs: ReadonlyArray<A>): A => xs[xs.length - 1]!

/** Requests of the run; a worker is killed after every 50 (--kill-every-requests: by progress, not time). */
const REQUESTS = 200

warnWithoutChromium("replayReport.test.ts")
/** The report the first test wrote, which the browser test opens. */
let reportPath: string | undefined

/** The little of the DOM the checks read (the project compiles without lib "dom"). */
interface Box {
  readonly scrollWidth: number
  readonly clientWidth: number
  readonly scrollHeight: number
  readonly clientHeight: number
}
interface ReportDom {
  readonly documentElement: Box
  querySelector(selector: string): (Box & { getBoundingClientRect(): { readonly right: number } }) | null
  querySelectorAll(selector: string): Iterable<Box & { getBoundingClientRect(): { readonly right: number } }>
}

describe("mpcache replay --report", () => {
  it.live("a replay with kills: latency, hit ratio beside the perfect LRU, workers alive with kill/replace/reap marks, bytes moved", () =>
    Effect.gen(function*() {
      const dir = mkdtempSync(join(tmpdir(), "mpcache-replay-report-"))
      const path = join(dir, "report.html")
      reportPath = path
      const r = yield* runCli(
        ["replay", "--json", "--requests", String(REQUESTS), "--workers", "2", "--max-rate", "--kill-every-requests", "50", "--report", path],
        150_000
      )
      assert.strictEqual(r.code, 0, r.stderr.slice(-3000))
      assert.include(r.stderr, `mpcache replay: report written to ${path}`)
      const summary = JSON.parse(r.stdout) as ReplaySummary
      assert.isTrue(existsSync(path))
      const html = readFileSync(path, "utf8")

      // Self-contained: nothing to fetch, no script to run (the only script is inert JSON).
      assert.notMatch(html, /\b(src|href)\s*=|@import|url\(/i)
      assert.deepStrictEqual([...html.matchAll(/https?:\/\/[^\s"'<]+/g)].map((m) => m[0]).filter((u) => u !== "http://www.w3.org/2000/svg"), [])
      assert.deepStrictEqual([...html.matchAll(/<script\b[^>]*>/g)].map((m) => m[0]), ['<script type="application/json" id="replay-data">'])

      const data = reportData(html) as { summary: ReplaySummary; timeline: ReplayTimeline }
      assert.deepStrictEqual(data.summary, summary)
      const tl = data.timeline
      assert.strictEqual(tl.seconds.reduce((n, s) => n + s.requests, 0), REQUESTS)

      const charts = parseReportCharts(html)
      assert.deepStrictEqual(
        charts.map((c) => [c.id, c.series.map((s) => s.name)]),
        [
          ["chart-latency", ["latency-p50", "latency-p99"]],
          ["chart-hit-ratio", ["hit-ratio", "perfect-lru"]],
          ["chart-workers", ["workers-alive"]],
          ["chart-bytes", ["bytes-stored", "bytes-retrieved"]]
        ]
      )
      const series = (chart: string, name: string) => charts.find((c) => c.id === chart)!.series.find((s) => s.name === name)!.points

      // Latency: one point per second in which requests completed; p99 never below p50.
      const busy = tl.seconds.filter((s) => s.requests > 0)
      const p50 = series("chart-latency", "latency-p50")
      const p99 = series("chart-latency", "latency-p99")
      assert.deepStrictEqual(p50.map(([t]) => t), busy.map((s) => s.t + 0.5))
      assert.deepStrictEqual(p50.map(([, v]) => v), busy.map((s) => s.latency_p50_ms))
      assert.isTrue(p50.every(([, v], i) => p99[i]![1] >= v))

      // Hit ratio: the run's and the perfect LRU's end exactly at the summary's figures.
      assert.strictEqual(last(series("chart-hit-ratio", "hit-ratio"))[1], summary.hit_ratio)
      assert.strictEqual(last(series("chart-hit-ratio", "perfect-lru"))[1], summary.perfect_lru_hit_ratio)
      // Its axis is fitted to the plotted ratios (src/replay/ReportHtml.ts fitAxis), not 0–100 %.
      const ratios = [...series("chart-hit-ratio", "hit-ratio"), ...series("chart-hit-ratio", "perfect-lru")].map(([, v]) => v)
      const fitted = fitAxis(Math.min(...ratios), Math.max(...ratios), { floor: 0, ceil: 1, minSpan: 0.04 })
      const svgTag = html.match(/<svg id="chart-hit-ratio"[^>]*>/)![0]
      assert.include(svgTag, `data-y-min="${fitted.min}" data-y-max="${fitted.max}"`)
      assert.isAtMost(fitted.min, Math.min(...ratios))
      assert.isAtLeast(fitted.max, Math.max(...ratios))

      // Bytes: the per-second MB add up to what the summary says was stored and retrieved.
      const mb = (name: string) => series("chart-bytes", name).reduce((n, [, v]) => n + v, 0)
      assert.approximately(mb("bytes-stored") / 1000, summary.gb_stored, 0.0001)
      assert.approximately(mb("bytes-retrieved") / 1000, summary.gb_retrieved, 0.0001)

      // Workers alive: two at the start, fewer after a kill, and one mark per kill, replacement and reap.
      const alive = series("chart-workers", "workers-alive")
      assert.deepStrictEqual(alive[0], [0, 2])
      assert.isAtMost(Math.min(...alive.map(([, v]) => v)), 1)
      const events = charts.find((c) => c.id === "chart-workers")!.events
      const of = (kind: string) => events.filter((e) => e.kind === kind)
      assert.isAtLeast(summary.churn.killed, 1)
      assert.strictEqual(of("kill").length, summary.churn.killed)
      assert.strictEqual(of("replace").length, summary.churn.replaced)
      assert.strictEqual(of("pause").length, 0)
      assert.strictEqual(of("reap").length, summary.reaped["disconnect"])
      assert.deepStrictEqual(of("reap").map((e) => e.reason), of("reap").map(() => "disconnect"))
      // Every killed instance was reaped, after its kill; every chart carries the same marks.
      const killedIds = of("kill").map((e) => e.instanceId!).sort()
      assert.deepStrictEqual(of("reap").map((e) => e.instanceId!).sort(), killedIds)
      for (const k of of("kill")) assert.isAbove(of("reap").find((e) => e.instanceId === k.instanceId)!.t, k.t)
      for (const c of charts) assert.deepStrictEqual(c.events, events)
    }), 180_000)

  it.live.skipIf(!hasChromium)(
    "in Chromium, narrow and wide: nothing clips or scrolls sideways, the summary box shows every line; screenshots in test-output" +
      (hasChromium ? "" : ` — ${NO_CHROMIUM}`),
    () =>
      Effect.scoped(Effect.gen(function*() {
        assert.isDefined(reportPath, "the replay test before this one writes the report")
        const shots = screenshotDir("replay-report")
        for (const width of [560, 1400]) {
          const context = yield* browserIn({ width, height: 900 })
          const page = yield* Effect.promise(() => context.newPage())
          yield* Effect.promise(() => page.goto(`file://${reportPath}`, { waitUntil: "load" }))
          const layout = yield* Effect.promise(() =>
            page.evaluate(() => {
              // Runs in the page.
              const document = (globalThis as unknown as { readonly document: ReportDom }).document
              const box = (b: Box | null) =>
                b === null ? null : { sw: b.scrollWidth, cw: b.clientWidth, sh: b.scrollHeight, ch: b.clientHeight }
              return {
                page: box(document.documentElement),
                viewport: (globalThis as unknown as { readonly innerWidth: number }).innerWidth,
                figures: box(document.querySelector("dl")),
                summary: box(document.querySelector("pre")),
                chartsRight: [...document.querySelectorAll("svg.chart")].map((c) => c.getBoundingClientRect().right)
              }
            })
          )
          yield* Effect.promise(() => page.screenshot({ path: join(shots, `report-${width}px.png`), fullPage: true }))
          const where = `at ${width} px: ${JSON.stringify(layout)}`
          // The page never scrolls sideways; each chart fits in the viewport.
          assert.isAtMost(layout.page!.sw, layout.viewport, where)
          assert.strictEqual(layout.chartsRight.length, 4, where)
          for (const right of layout.chartsRight) assert.isAtMost(right, layout.viewport, where)
          // The figures and the summary box: no line behind a scrollbar, either way.
          for (const b of [layout.figures!, layout.summary!]) {
            assert.isAtMost(b.sw, b.cw, where)
            assert.isAtMost(b.sh, b.ch, where)
          }
        }
        console.log(`replay report screenshots: ${shots}`)
      })),
    60_000
  )
})
