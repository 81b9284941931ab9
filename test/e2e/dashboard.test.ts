/**
 * The Grafana dashboard (deploy/grafana/mpcache-dashboard.json, issue 17)
 * queries only what a real server exposes: a server child process is driven
 * through everything the panels show (workers registering, storing,
 * retrieving, looking up, both transfer modes, a worker SIGKILLed and
 * reaped, an error reply), then its `/metrics` is scraped and every metric
 * name in every PromQL expression of the dashboard — and every literal
 * label matcher — must be among the samples.
 *
 * And before anything happened (issue 25 item 6): a fresh server's
 * `/metrics` already lists every series every dashboard under
 * deploy/grafana queries, each at 0, with the known values of its labels,
 * so a quiet server's panels read 0, not "No data".
 */
import { readdirSync, readFileSync } from "node:fs"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { pack } from "../../src/schema/Frame.ts"
import { OPS } from "../../src/schema/Op.ts"
import { ErrorCode } from "../../src/schema/WireError.ts"
import { REAP_REASONS } from "../../src/services/liveness/Rule.ts"
import { runCli } from "../support/Cli.ts"
import { eventually, getText, ipcEndpoint, startServer, statusOf } from "../support/LiveFleet.ts"
import { type Dashboard, expressionsOf, labelValues, metricNames, missingSeries, samplesOf } from "../support/PromQl.ts"
import { rawDealer } from "../support/RawDealer.ts"

const dashboard = JSON.parse(
  readFileSync(new URL("../../deploy/grafana/mpcache-dashboard.json", import.meta.url), "utf8")
) as Dashboard

/** Every PromQL expression of the dashboard: panel targets and query variables. */
const expressions = (): Array<string> => expressionsOf(dashboard)

const GRAFANA = new URL("../../deploy/grafana/", import.meta.url)

/** Every expression of every dashboard under deploy/grafana, with its file. */
const everyDashboardsExpressions = (): Array<{ readonly file: string; readonly expr: string }> =>
  readdirSync(GRAFANA).filter((f) => f.endsWith(".json")).sort().flatMap((file) =>
    expressionsOf(JSON.parse(readFileSync(new URL(file, GRAFANA), "utf8")) as Dashboard).map((expr) => ({ file, expr }))
  )

describe("Grafana dashboard", () => {
  it("has the panels of issue 17 and queries exactly these metrics", () => {
    assert.strictEqual(dashboard.uid, "mpcache-overview")
    assert.deepStrictEqual(dashboard.panels.map((p) => p.title), [
      "Tracked instances",
      "Suspect instances",
      "Connected peers",
      "L1 used",
      "Tracked instances by state",
      "Reaps by reason",
      "PING rate",
      "PING latency",
      "L1 bytes used",
      "L1 hit ratio",
      "Transfers GB/s",
      "Errors by code",
      "Requests by op",
      "Request latency p99 by op"
    ])
    assert.deepStrictEqual([...new Set(expressions().flatMap(metricNames))].sort(), [
      "mpcache_connected_peers",
      "mpcache_engine_driven_bytes_total",
      "mpcache_errors_total",
      "mpcache_l1_used_bytes",
      "mpcache_lookup_chunks_total",
      "mpcache_lookup_hit_chunks_total",
      "mpcache_pings_total",
      "mpcache_reaps_total",
      "mpcache_request_duration_seconds_bucket",
      "mpcache_requests_total",
      "mpcache_retrieved_bytes_total",
      "mpcache_stored_bytes_total",
      "mpcache_suspect_instances",
      "mpcache_tracked_instances"
    ])
    assert.deepStrictEqual(metricNames(`sum by (le) (rate(x_bucket{op="ping",instance=~"$instance"}[$__rate_interval])) / 1e9`), ["x_bucket"])
  })

  it.live("every metric (and literal label) it queries is in a real server's /metrics once the server has worked", () =>
    Effect.scoped(Effect.gen(function*() {
      const endpoint = ipcEndpoint()
      const { httpPort } = yield* startServer(endpoint, ["--worker-disconnect-grace-seconds", "1"])
      const httpUrl = `http://127.0.0.1:${httpPort}`
      const common = ["--json", "--server", endpoint, "--http-url", httpUrl, "--max-rate"]
      // Engine-driven workers first (the shared pool's bytes; later lookups would find their chunks cached) …
      const engine = yield* runCli(["replay", ...common, "--requests", "10", "--workers", "1", "--transfer-mode", "engine-driven"], 150_000)
      assert.strictEqual(engine.code, 0, engine.stderr.slice(-3000))
      // … LMCache-driven ones with two killed (lookups, stores, retrieves, PINGs, a suspect, a reap), after
      // requests 40 and 80 (by progress, so as many on a fast server as on a slow one) …
      const lmcache = yield* runCli(["replay", ...common, "--requests", "120", "--workers", "2", "--kill-every-requests", "40"], 150_000)
      assert.strictEqual(lmcache.code, 0, lmcache.stderr.slice(-3000))
      const run = JSON.parse(lmcache.stdout) as { churn: { killed: number }; chunks: { stored: number; retrieved: number } }
      assert.isAtLeast(run.churn.killed, 1)
      assert.isAbove(run.chunks.stored, 0)
      assert.isAbove(run.chunks.retrieved, 0)
      // … and an error reply (unknown op 99).
      const raw = yield* rawDealer(endpoint)
      yield* raw.send([pack(1), pack(99)])
      assert.isDefined(yield* raw.receive(5_000))
      yield* eventually(statusOf(httpPort), (d) => d.instances.length === 0, 5_000)

      const samples = samplesOf(yield* getText(`${httpUrl}/metrics`))
      assert.deepStrictEqual(missingSeries(samples, expressions()), [])
      // The series the panels split by carry the labels they group on, and count what happened.
      const valueOf = (name: string, labels: Record<string, string>) =>
        samples.find((s) => s.name === name && Object.entries(labels).every(([k, v]) => s.labels[k] === v))?.value
      assert.deepStrictEqual(labelValues(samples, "mpcache_reaps_total", "reason"), [...REAP_REASONS].sort())
      assert.isAtLeast(valueOf("mpcache_reaps_total", { reason: "disconnect" }) ?? 0, 1)
      assert.strictEqual(valueOf("mpcache_reaps_total", { reason: "timeout" }), 0)
      assert.isAtLeast(valueOf("mpcache_errors_total", { code: "unknown_op" }) ?? 0, 1)
      assert.isAbove(valueOf("mpcache_engine_driven_bytes_total", { direction: "store" }) ?? 0, 0)
    })), 240_000)

  it("the check of a scrape names a series a dashboard queries and the server lacks", () => {
    const samples = samplesOf("mpcache_reaps_total{reason=\"timeout\"} 0\n")
    assert.deepStrictEqual(missingSeries(samples, [`sum(rate(mpcache_reaps_total{reason="timeout"}[1m]))`]), [])
    assert.deepStrictEqual(missingSeries(samples, [`sum(mpcache_no_such_gauge)`, `mpcache_reaps_total{reason="grace"}`]), [
      "mpcache_no_such_gauge (in sum(mpcache_no_such_gauge))",
      `mpcache_reaps_total{reason="grace"} (in mpcache_reaps_total{reason="grace"})`
    ])
  })

  it.live("a fresh server's /metrics lists every series every dashboard in deploy/grafana queries, each at 0 (issue 25 item 6)", () =>
    Effect.scoped(Effect.gen(function*() {
      const queried = everyDashboardsExpressions()
      assert.isAbove(queried.length, 0, "no dashboard expression found under deploy/grafana")
      const { httpPort } = yield* startServer(ipcEndpoint(), [])
      const samples = samplesOf(yield* getText(`http://127.0.0.1:${httpPort}/metrics`))
      assert.deepStrictEqual(missingSeries(samples, queried.map((q) => q.expr)), [])
      // Nothing happened yet: every queried series reads 0 (a histogram's buckets, sum and count too).
      const names = new Set(queried.flatMap((q) => metricNames(q.expr)))
      assert.deepStrictEqual(samples.filter((s) => names.has(s.name) && s.value !== 0), [])
      // Labelled series exist for each known value of the labels the panels split by.
      assert.deepStrictEqual(labelValues(samples, "mpcache_reaps_total", "reason"), [...REAP_REASONS].sort())
      assert.deepStrictEqual(labelValues(samples, "mpcache_errors_total", "code"), [...ErrorCode.literals].sort())
      assert.deepStrictEqual(labelValues(samples, "mpcache_pings_total", "form"), ["instance", "nil", "ping_registered"])
      assert.deepStrictEqual(labelValues(samples, "mpcache_engine_driven_bytes_total", "direction"), ["retrieve", "store"])
      const ops = OPS.map((o) => o.name).sort()
      assert.deepStrictEqual(labelValues(samples, "mpcache_requests_total", "op"), ops)
      assert.deepStrictEqual(labelValues(samples, "mpcache_request_duration_seconds_bucket", "op"), ops)
      // Unlabelled ones: exactly one series each.
      for (const name of ["mpcache_tracked_instances", "mpcache_suspect_instances", "mpcache_connected_peers", "mpcache_l1_used_bytes"]) {
        assert.deepStrictEqual(samples.filter((s) => s.name === name), [{ name, labels: {}, value: 0 }])
      }
    })), 60_000)
})
