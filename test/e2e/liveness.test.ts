/**
 * Worker liveness end to end (DESIGN §5-6): a server process, worker
 * processes with real shared memory and heartbeats, real signals.
 */
import { decodeStatusDocument } from "../../src/schema/Status.ts"
import { randomUUID } from "node:crypto"
import { readdirSync, readFileSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { fileURLToPath } from "node:url"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Schedule } from "effect"
import { startCli, startScript } from "../support/Cli.ts"

const DAEMON = fileURLToPath(new URL("../support/worker-daemon.ts", import.meta.url))

const startServer = (endpoint: string, flags: ReadonlyArray<string>) =>
  Effect.gen(function*() {
    const server = yield* startCli(["serve", "--endpoint", endpoint, "--http-port", "0", "--chunk-size", "64", ...flags])
    const [, port] = yield* server.waitForStderr(/HTTP frontend listening on http:\/\/127\.0\.0\.1:(\d+)/)
    yield* server.waitForStderr(/MQ server listening on/)
    return { server, httpPort: Number(port) }
  })

const startWorker = (endpoint: string, heartbeatIntervalMs: number, storeEveryMs: number) =>
  Effect.gen(function*() {
    const namePrefix = `mpcache-e2e-live-${randomUUID()}`
    // Added first, so it runs last: after the worker is gone. A SIGKILLed worker cannot unlink its own
    // segments (nor may the server), so the test does.
    yield* Effect.addFinalizer(() =>
      Effect.sync(() => {
        for (const name of readdirSync("/dev/shm")) if (name.startsWith(namePrefix)) rmSync(`/dev/shm/${name}`, { force: true })
      })
    )
    const worker = yield* startScript(DAEMON, [JSON.stringify({ endpoint, namePrefix, heartbeatIntervalMs, storeEveryMs })])
    const [, instanceId] = yield* worker.waitForStdout(/"event":"registered","instanceId":"(\d+)"/, 20_000)
    yield* worker.waitForStdout(/"event":"store","n":1,"ok":true/, 20_000)
    return { worker, namePrefix, instanceId: instanceId! }
  })

const getJson = (url: string) => Effect.promise(() => fetch(url).then((r) => r.json() as Promise<Record<string, unknown>>))
const getText = (url: string) => Effect.promise(() => fetch(url).then((r) => r.text()))

const statusOf = (port: number) =>
  getJson(`http://127.0.0.1:${port}/api/status`).pipe(Effect.flatMap(decodeStatusDocument), Effect.orDie)
const instancesOf = (port: number) => Effect.map(statusOf(port), (doc) => doc.instances)

/** Polls `check` every 100 ms until it holds, at most `timeoutMs`. */
const eventually = <A>(check: Effect.Effect<A>, holds: (a: A) => boolean, timeoutMs: number) =>
  check.pipe(
    Effect.repeat({ schedule: Schedule.spaced("100 millis"), until: holds }),
    Effect.timeoutOrElse({ duration: `${timeoutMs} millis`, orElse: () => check })
  )

const ipcEndpoint = () => `ipc://${join(tmpdir(), `mpcache-live-${randomUUID()}.sock`)}`

describe("liveness end to end", () => {
  it.live("SIGKILL a worker that has served: reaped within the disconnect grace, its mappings gone, status and metrics agree", () =>
    Effect.scoped(Effect.gen(function*() {
      const endpoint = ipcEndpoint()
      const { server, httpPort } = yield* startServer(endpoint, ["--worker-disconnect-grace-seconds", "1"])
      const { worker, namePrefix, instanceId } = yield* startWorker(endpoint, 1_000, 60_000)
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
        "30"
      ])
      const { worker, instanceId } = yield* startWorker(endpoint, 2_000, 1_000)
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

  it.live("kill -9 the server and start it again on the same endpoint: every worker registers again within two heartbeat intervals", () =>
    Effect.scoped(Effect.gen(function*() {
      const endpoint = ipcEndpoint()
      const first = yield* startServer(endpoint, [])
      const a = yield* startWorker(endpoint, 1_000, 60_000)
      const b = yield* startWorker(endpoint, 1_000, 60_000)
      yield* first.server.stop("SIGKILL")
      const second = yield* startServer(endpoint, [])
      const ids = yield* eventually(
        Effect.map(instancesOf(second.httpPort), (xs) => xs.map((i) => i.instance_id).sort()),
        (xs) => xs.length === 2,
        2 * 1_000 + 1_500
      )
      assert.deepStrictEqual(ids, [a.instanceId, b.instanceId].sort())
    })), 60_000)
})
