/**
 * Metric series that exist from the start (issue 25 item 6; Prometheus'
 * instrumentation advice, "Avoid missing metrics": export 0 for every series
 * you know of before anything has happened). An Effect metric appears in the
 * registry only at its first update or read, so a quiet server's `/metrics`
 * would lack its reaps, errors or PING rate, and the dashboard would say
 * "No data" where the truth is 0.
 *
 * **Mental model.** A metric is declared once, where it is defined, with the
 * values its labels can take: {@link fromStart} for a metric with no label (or
 * several, listed), {@link byLabel} for the common case of one label, which
 * also hands back one handle per value (built once, not per update). Each
 * declaration records its series here; {@link existFromStart} reads every
 * recorded series once, which registers it at its zero state (a counter or a
 * gauge at 0, a histogram with empty buckets) in the registry in context. It
 * never changes a value: a series already updated keeps it.
 *
 * **Gotchas.** Only series of modules that are loaded are recorded (ES module
 * imports are static: everything the server imports is loaded before it
 * starts). A label value found only at run time (a tenant, a peer) has no
 * place here: such series appear at their first update, as before.
 *
 * @see src/layers/Http.ts runs {@link existFromStart} with the `/metrics` route.
 */
import { Effect, Metric } from "effect"

/** Every series declared so far (a metric with all of its labels set), in declaration order. */
const declared: Array<Metric.Metric<never, unknown>> = []

/** The values each label of a metric can take; a series per combination. */
export type KnownLabels = Readonly<Record<string, ReadonlyArray<string>>>

/** Every combination of one value per label (one empty set when there is no label). */
const combinations = (labels: KnownLabels): Array<Record<string, string>> =>
  Object.entries(labels).reduce<Array<Record<string, string>>>(
    (sets, [key, values]) => sets.flatMap((set) => values.map((value) => ({ ...set, [key]: value }))),
    [{}]
  )

/**
 * Declares `metric`'s series as existing from the start: the metric itself
 * when `labels` is empty, else one series per combination of the listed label
 * values (`{ listener: ["zmq", "http"], reason: ["cap"] }`: two series).
 * Returns `metric` unchanged, so the declaration reads
 * `export const x = fromStart(Metric.counter(…))`.
 */
export const fromStart = <M extends Metric.Metric<never, unknown>>(metric: M, labels: KnownLabels = {}): M => {
  for (const attributes of combinations(labels)) {
    declared.push(Object.keys(attributes).length === 0 ? metric : Metric.withAttributes(metric, attributes))
  }
  return metric
}

/**
 * One handle of `metric` per value of its label `key`, each series existing
 * from the start: `byLabel(reapsTotal, "reason", ["timeout", "grace"]).grace`
 * is `reapsTotal{reason="grace"}`. The values are the one list of what the
 * label can be; derive the label's type from it (`typeof VALUES[number]`).
 */
export const byLabel = <I, S, const V extends string>(
  metric: Metric.Metric<I, S>,
  key: string,
  values: ReadonlyArray<V>
): Readonly<Record<V, Metric.Metric<I, S>>> => {
  const handles = Object.fromEntries(values.map((value) => [value, Metric.withAttributes(metric, { [key]: value })])) as Record<
    V,
    Metric.Metric<I, S>
  >
  for (const value of values) declared.push(handles[value])
  return handles
}

/**
 * Registers every declared series in the current registry
 * (`Metric.MetricRegistry`) at its zero state; values already there are
 * kept. Never fails. Run once where the metrics are served.
 */
export const existFromStart: Effect.Effect<void> = Effect.suspend(() =>
  Effect.forEach(declared.slice(), (series) => Metric.value(series), { discard: true })
)
