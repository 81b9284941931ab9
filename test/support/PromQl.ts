/**
 * Just enough PromQL (and Grafana's `label_values`) and Prometheus text for the dashboard test: the
 * metric names an expression selects, its literal label matchers, and the
 * samples of a `/metrics` scrape. Not a PromQL parser: strings, label
 * matchers, ranges and grouping clauses are cut out, then every identifier
 * that is not a function call, keyword or number is a metric name.
 */

const KEYWORDS = new Set([
  "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset", "and", "or", "unless", "inf", "nan", "atan2"
])

/** Metric names selected by `expr` (e.g. `mpcache_request_duration_seconds_bucket`), sorted, unique. */
export const metricNames = (expr: string): Array<string> => {
  const stripped = expr
    // Grafana's `label_values(metric, label)` (a variable query): only its metric.
    .replace(/\blabel_values\(\s*([^,()]*?)\s*,[^)]*\)/g, " $1 ")
    .replace(/"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'/g, "\"\"")
    .replace(/\{[^}]*\}/g, " ")
    .replace(/\[[^\]]*\]/g, " ")
    .replace(/\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)/g, " ")
  const names = new Set<string>()
  for (const m of stripped.matchAll(/[a-zA-Z_:][a-zA-Z0-9_:]*/g)) {
    const rest = stripped.slice(m.index + m[0].length)
    if (/^\s*\(/.test(rest) || KEYWORDS.has(m[0].toLowerCase()) || m[0].startsWith("$")) continue
    // `$variables`, and the exponent of a number like 1e9.
    if (m.index > 0 && /[$0-9.]/.test(stripped[m.index - 1]!)) continue
    names.add(m[0])
  }
  return [...names].sort()
}

/** `name{label="value"}` matchers with a literal value (no `$variable`) in `expr`. */
export const literalMatchers = (expr: string): Array<{ readonly metric: string; readonly label: string; readonly value: string }> => {
  const out: Array<{ metric: string; label: string; value: string }> = []
  for (const m of expr.matchAll(/([a-zA-Z_:][a-zA-Z0-9_:]*)\{([^}]*)\}/g)) {
    for (const l of m[2]!.matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"([^"$]*)"/g)) out.push({ metric: m[1]!, label: l[1]!, value: l[2]! })
  }
  return out
}

/** One sample line of Prometheus text: its name, labels and value (NaN when it does not parse). */
export interface Sample {
  readonly name: string
  readonly labels: Record<string, string>
  readonly value: number
}

/** The samples of a scrape (comments and blank lines skipped). */
export const samplesOf = (text: string): Array<Sample> =>
  text.split("\n").filter((l) => l !== "" && !l.startsWith("#")).map((line) => {
    const m = line.match(/^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)/)
    const labels: Record<string, string> = {}
    for (const l of (m?.[2] ?? "").matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)) labels[l[1]!] = l[2]!
    return { name: m?.[1] ?? line, labels, value: m === null ? Number.NaN : Number(m[3]) }
  })

/** A Grafana dashboard, as far as its queries go. */
export interface Dashboard {
  readonly uid: string
  readonly panels: ReadonlyArray<{ readonly title: string; readonly targets: ReadonlyArray<{ readonly expr: string }> }>
  readonly templating: { readonly list: ReadonlyArray<{ readonly name: string; readonly query: unknown }> }
}

/** Every PromQL expression of `dashboard`: panel targets and query variables. */
export const expressionsOf = (dashboard: Dashboard): Array<string> => [
  ...dashboard.panels.flatMap((p) => p.targets.map((t) => t.expr)),
  ...dashboard.templating.list.flatMap((v) =>
    typeof v.query === "object" && v.query !== null && "query" in v.query ? [String((v.query as { query: unknown }).query)] : []
  )
]

/**
 * What `expressions` query that `samples` lack, one line each: a metric name
 * no sample has, or a literal label matcher no sample of that metric meets.
 */
export const missingSeries = (samples: ReadonlyArray<Sample>, expressions: ReadonlyArray<string>): Array<string> => {
  const names = new Set(samples.map((s) => s.name))
  const missing: Array<string> = []
  for (const expr of expressions) {
    for (const name of metricNames(expr)) if (!names.has(name)) missing.push(`${name} (in ${expr})`)
    for (const m of literalMatchers(expr)) {
      if (!samples.some((s) => s.name === m.metric && s.labels[m.label] === m.value)) missing.push(`${m.metric}{${m.label}="${m.value}"} (in ${expr})`)
    }
  }
  return missing
}

/** The values of `label` among the samples of `name`, sorted, unique. */
export const labelValues = (samples: ReadonlyArray<Sample>, name: string, label: string): Array<string | undefined> =>
  [...new Set(samples.filter((s) => s.name === name).map((s) => s.labels[label]))].sort()
