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

/** One sample line of Prometheus text: its name and labels. */
export interface Sample {
  readonly name: string
  readonly labels: Record<string, string>
}

/** The samples of a scrape (comments and blank lines skipped). */
export const samplesOf = (text: string): Array<Sample> =>
  text.split("\n").filter((l) => l !== "" && !l.startsWith("#")).map((line) => {
    const m = line.match(/^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s/)
    const labels: Record<string, string> = {}
    for (const l of (m?.[2] ?? "").matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)) labels[l[1]!] = l[2]!
    return { name: m?.[1] ?? line, labels }
  })
