/**
 * The HTTP frontend's connection service on its own (src/layers/Http.ts
 * `HttpConnections`, issue 24 item 11): the guarded server of
 * HttpConnectionGuard.ts (whose bounds test/integration/HttpConnectionGuard.test.ts
 * covers) with each close counted in `mpcache_http_connections_closed_total`
 * and logged. A real server on an ephemeral loopback port, real TCP clients.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect, Metric } from "effect"
import { PrometheusMetrics } from "effect/observability"
import { HttpConnections } from "../../src/layers/Http.ts"
import { descriptorBudgetDefaults } from "../../src/services/server/DescriptorBudget.ts"
import { type CapturedLog, captureLogs } from "../support/FakeMqClient.ts"
import { connectRawTcp, within } from "../support/RawTcp.ts"

/** Listens on an ephemeral port for the life of the Scope; answers every request "ok". */
const listening = Effect.gen(function*() {
  const { server } = yield* HttpConnections
  server.on("request", (_req, res) => res.end("ok"))
  return yield* Effect.acquireRelease(
    Effect.promise(() => new Promise<number>((resolve) => server.listen(0, "127.0.0.1", () => resolve((server.address() as { port: number }).port)))),
    () => Effect.promise(() => new Promise<void>((resolve) => server.close(() => resolve())))
  )
})

describe("HttpConnections", () => {
  it.live("a malformed request is answered 400 and closed, counted under its reason and logged once as a WARNING naming it", () => {
    const logs: Array<CapturedLog> = []
    return Effect.gen(function*() {
      const port = yield* listening
      const c = yield* connectRawTcp(port)
      c.socket.write("NOT HTTP\r\n\r\n")
      yield* within(c.closed, 10_000, "the malformed connection closed")
      assert.match(c.received(), /^HTTP\/1\.1 400 Bad Request\r\n/)
      const { stats } = yield* HttpConnections
      assert.strictEqual(stats().closed.bad_request, 1)
      assert.match(yield* PrometheusMetrics.format(), /^mpcache_http_connections_closed_total\{reason="bad_request"\} 1$/m)
      assert.deepStrictEqual(logs.filter((l) => l.level === "Warn").map((l) => l.text), [
        "HTTP frontend closed a connection that sent a malformed request (400)"
      ])
    }).pipe(
      Effect.scoped,
      Effect.provide(HttpConnections.layerTest()),
      Effect.provide(captureLogs(logs)),
      Effect.provideService(Metric.MetricRegistry, new Map())
    )
  })

  it.live("the cap comes from the configuration: with --max-http-connections 1 a second client evicts the first, idle one, counted", () =>
    Effect.gen(function*() {
      const port = yield* listening
      const { stats } = yield* HttpConnections
      const a = yield* connectRawTcp(port)
      yield* Effect.promise(async () => {
        while (stats().openConnections !== 1) await new Promise((resolve) => setImmediate(resolve))
      })
      const b = yield* connectRawTcp(port)
      yield* within(a.closed, 10_000, "the idle first connection evicted")
      assert.strictEqual(stats().closed.evicted_idle, 1)
      b.socket.destroy()
    }).pipe(Effect.scoped, Effect.provide(HttpConnections.layerTest({ descriptorCaps: { ...descriptorBudgetDefaults, maxHttpConnections: 1 } }))))
})
