/**
 * The Grafana dashboard (deploy/grafana/mpcache-dashboard.json, issue 17)
 * queries only what a real server exposes: a server child process is driven
 * through everything the panels show (workers registering, storing,
 * retrieving, looking up, both transfer modes, a worker SIGKILLed and
 * reaped, an error reply), then its `/metrics` is scraped and every metric
 * name in every PromQL expression of the dashboard — and every literal
 * label matcher — must be among the samples.
 */
import { readFileSync } from "node:fs"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { pack } from "../../src/schema/Frame.ts"
import { runCli } from "../support/Cli.ts"
import { eventually, getText, ipcEndpoint, startServer, statusOf } from "../support/LiveFleet.ts"
import { literalMatchers, metricNames, samplesOf } from "../support/PromQl.ts"
import { rawDealer } from "../support/RawDealer.ts"

interface Dashboard {
  readonly uid: string
  readonly panels: ReadonlyArray<{ readonly title: string; readonly targets: ReadonlyArray<{ readonly expr: string }> }>
  readonly templating: { readonly list: ReadonlyArray<{ readonly name: string; readonly query: unknown }> }
}

const dashboard = JSON.parse(
  readFileSync(new URL("../../deploy/grafana/mpcache-dashboard.json", import.meta.url), "utf8")
) as Dashboard

/** Every PromQL expression of the dashboard: panel targets and query variables. */
const expressions = (): Array<string> => [
  ...dashboard.panels.flatMap((p) => p.targets.map((t) => t.expr)),
  ...dashboard.templating.list.flatMap((v) =>
    typeof v.query === "object" && v.query !== null && "query" in v.query ? [String((v.query as { query: unknown }).query)] : []
  )
]

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
      const names = new Set(samples.map((s) => s.name))
      const missing: Array<string> = []
      for (const expr of expressions()) {
        for (const name of metricNames(expr)) if (!names.has(name)) missing.push(`${name} (in ${expr})`)
        for (const m of literalMatchers(expr)) {
          if (!samples.some((s) => s.name === m.metric && s.labels[m.label] === m.value)) {
            missing.push(`${m.metric}{${m.label}="${m.value}"} (in ${expr})`)
          }
        }
      }
      assert.deepStrictEqual(missing, [])
      // The series the panels split by carry the labels they group on.
      const labelsOf = (name: string, label: string) => [...new Set(samples.filter((s) => s.name === name).map((s) => s.labels[label]))].sort()
      assert.deepStrictEqual(labelsOf("mpcache_reaps_total", "reason"), ["disconnect"])
      assert.include(labelsOf("mpcache_errors_total", "code"), "unknown_op")
      assert.include(labelsOf("mpcache_engine_driven_bytes_total", "direction"), "store")
    })), 240_000)
})
