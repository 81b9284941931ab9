/**
 * Worker liveness end to end (DESIGN §5-6): a server process, worker
 * processes with real shared memory and heartbeats, real signals; with
 * CURVE off and on (test/support/CurveMode.ts, issue 14).
 */
import { readFileSync } from "node:fs"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { CURVE_MODES, curveFixture } from "../support/CurveMode.ts"
import { eventually, getText, ipcEndpoint, startServer, startWorker, statusOf } from "../support/LiveFleet.ts"

const instancesOf = (port: number) => Effect.map(statusOf(port), (doc) => doc.instances)

// Concurrent: every test has its own server, endpoint and workers, and most of their time is waiting for a
// real reap timeout or grace, so the six run side by side (issue 26: a 30 s reap timeout waited twice
// one after the other was the suite's longest file).
describe.concurrent("liveness end to end", () => {
describe.each(CURVE_MODES)("CURVE $curve", ({ curve }) => {
  const fx = curveFixture(curve)

    it.live("SIGKILL a worker that has served: reaped within the disconnect grace, its mappings gone, status and metrics agree", () =>
      Effect.scoped(Effect.gen(function*() {
        const endpoint = ipcEndpoint()
        const { server, httpPort } = yield* startServer(endpoint, ["--worker-disconnect-grace-seconds", "1", ...fx.serverArgs])
        const { worker, namePrefix, instanceId } = yield* startWorker(endpoint, 1_000, 60_000, fx.client().curve)
        const maps = () => readFileSync(`/proc/${server.child.pid}/maps`, "utf8")
        assert.include(maps(), namePrefix)
        assert.deepStrictEqual((yield* instancesOf(httpPort)).map((i) => i.instance_id), [instanceId])
        worker.child.kill("SIGKILL")
        const left = yield* eventually(instancesOf(httpPort), (xs) => xs.length === 0, 5_000)
        assert.deepStrictEqual(left, [])
        assert.notInclude(maps(), namePrefix)
        const status = yield* statusOf(httpPort)
        assert.deepStrictEqual(status.native, { open_mappings: 0, mapped_bytes: 0 })
        assert.strictEqual(status.worker_liveness.tracked_instances, 0)
        const metrics = yield* getText(`http://127.0.0.1:${httpPort}/metrics`)
        assert.match(metrics, /mpcache_reaps_total\{reason="disconnect"\} 1/)
        assert.match(metrics, /mpcache_tracked_instances 0/)
        assert.match(server.stderr(), new RegExp(`reaped instance ${instanceId}: .*reason disconnect`))
      })), 60_000)

    it.live("SIGSTOP a worker past the reap timeout: reaped; SIGCONT: it re-registers and its next store succeeds", () =>
      Effect.scoped(Effect.gen(function*() {
        const endpoint = ipcEndpoint()
        const { httpPort } = yield* startServer(endpoint, [
          "--worker-reap-timeout-seconds",
          "30",
          "--worker-registration-grace-seconds",
          "30",
          ...fx.serverArgs
        ])
        const { worker, instanceId } = yield* startWorker(endpoint, 2_000, 1_000, fx.client().curve)
        const before = yield* instancesOf(httpPort)
        assert.deepStrictEqual(before.map((i) => [i.instance_id, i.state]), [[instanceId, "active"]])
        worker.child.kill("SIGSTOP")
        const reaped = yield* eventually(instancesOf(httpPort), (xs) => xs.length === 0, 45_000)
        assert.deepStrictEqual(reaped, [], "reaped while paused")
        worker.child.kill("SIGCONT")
        yield* worker.waitForStdout(/"event":"store","n":\d+,"ok":true,"healthy":true,"reregistrations":[1-9]/, 15_000)
        const after = yield* instancesOf(httpPort)
        assert.deepStrictEqual(after.map((i) => i.instance_id), [instanceId])
      })), 90_000)

    // How soon (the first heartbeat the new server answers, so within two intervals) is heartbeat logic: TestClock tests in
    // test/services/client/WorkerAdapter.test.ts ("on the next successful ping REGISTER is sent…", "PING_REGISTERED
    // answering ["kv_cache"] re-registers at once…"). Here, real processes: that it happens, with the same ids.
    it.live("kill -9 the server and start it again on the same endpoint: every worker registers again with its id, on its heartbeat", () =>
      Effect.scoped(Effect.gen(function*() {
        const endpoint = ipcEndpoint()
        const first = yield* startServer(endpoint, fx.serverArgs)
        const a = yield* startWorker(endpoint, 1_000, 60_000, fx.client().curve, true)
        const b = yield* startWorker(endpoint, 1_000, 60_000, fx.client().curve, true)
        // What each worker said before the kill: on a busy machine a heartbeat may time out and recover even then.
        const before = [a, b].map((w) => w.worker.stdout().length)
        yield* first.server.stop("SIGKILL")
        const second = yield* startServer(endpoint, fx.serverArgs)
        const again = /"event":"session","tag":"Registered","reason":"(missing|recover)"/
        for (const [i, w] of [a, b].entries()) {
          // No store ran (the next is 60 s away): the heartbeat found the server without it and registered again.
          yield* eventually(Effect.sync(() => again.test(w.worker.stdout().slice(before[i]))), (seen) => seen, 30_000)
          assert.match(w.worker.stdout().slice(before[i]), again)
        }
        const ids = yield* eventually(
          Effect.map(instancesOf(second.httpPort), (xs) => xs.map((i) => i.instance_id).sort()),
          (xs) => xs.length === 2,
          30_000
        )
        assert.deepStrictEqual(ids, [a.instanceId, b.instanceId].sort())
        // No registration failed after the kill.
        for (const [i, w] of [a, b].entries()) assert.notInclude(w.worker.stdout().slice(before[i]), '"tag":"RegisterFailed"')
      })), 60_000)
})
})
