/**
 * Reads the charts of a replay report (src/replay/ReportHtml.ts) back out of
 * its HTML: per `<svg id="chart-…">`, the series (`data-series`,
 * `data-points`) and the event marks (`data-event`, `data-t`, …). A parser
 * of the markup ReportHtml writes (attributes in double quotes), not a
 * general HTML parser.
 */
export interface ParsedChart {
  readonly id: string
  readonly series: ReadonlyArray<{ readonly name: string; readonly points: ReadonlyArray<readonly [number, number]> }>
  readonly events: ReadonlyArray<{ readonly kind: string; readonly t: number; readonly slot?: number; readonly instanceId?: string; readonly reason?: string }>
}

const attrs = (tag: string): Record<string, string> => {
  const out: Record<string, string> = {}
  for (const m of tag.matchAll(/([a-zA-Z-:]+)="([^"]*)"/g)) out[m[1]!] = m[2]!
  return out
}

export const parseReportCharts = (html: string): ReadonlyArray<ParsedChart> =>
  [...html.matchAll(/<svg\b[^>]*>[\s\S]*?<\/svg>/g)].map((m) => {
    const svg = m[0]
    const id = attrs(svg.slice(0, svg.indexOf(">")))["id"] ?? ""
    const series = [...svg.matchAll(/<path\b[^>]*class="series[^"]*"[^>]*>/g)].map((p) => {
      const a = attrs(p[0])
      const points = (a["data-points"] ?? "").split(";").filter((s) => s !== "").map((pt) => {
        const [t, v] = pt.split(",").map(Number)
        return [t!, v!] as const
      })
      return { name: a["data-series"] ?? "", points }
    })
    const events = [...svg.matchAll(/<line\b[^>]*class="event[^"]*"[^>]*>/g)].map((l) => {
      const a = attrs(l[0])
      return {
        kind: a["data-event"] ?? "",
        t: Number(a["data-t"]),
        ...(a["data-slot"] === undefined ? {} : { slot: Number(a["data-slot"]) }),
        ...(a["data-instance-id"] === undefined ? {} : { instanceId: a["data-instance-id"] }),
        ...(a["data-reason"] === undefined ? {} : { reason: a["data-reason"] })
      }
    })
    return { id, series, events }
  })

/** The JSON the report embeds (`<script type="application/json" id="replay-data">`). */
export const reportData = (html: string): unknown => {
  const m = html.match(/<script type="application\/json" id="replay-data">([\s\S]*?)<\/script>/)
  return m === null ? undefined : JSON.parse(m[1]!)
}
