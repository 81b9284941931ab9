/**
 * A real server and real worker processes for end-to-end tests of what
 * operators see (status page, dashboard): `mpcache serve` as a child
 * process on an ipc endpoint with an ephemeral HTTP port, and
 * worker-daemon.ts workers (shared-memory KV cache, heartbeat, a store
 * every `storeEveryMs`). The same shapes as test/e2e/liveness.test.ts.
 */
import { randomUUID } from "node:crypto"
import { readdirSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { assert } from "@effect/vitest"
import { Effect, Schedule } from "effect"
import { decodeStatusDocument } from "../../src/schema/Status.ts"
import type { DealerCurve } from "../../src/services/zmq/Sockets.ts"
import { runJsonScript, startCli, startScript } from "./Cli.ts"
import { childScript } from "./ChildScripts.ts"

const DAEMON = childScript("worker-daemon")

/** A fresh ipc endpoint under the temp folder. */
export const ipcEndpoint = () => `ipc://${join(tmpdir(), `mpcache-fleet-${randomUUID()}.sock`)}`

/**
 * `mpcache serve` with `flags`, once both its HTTP frontend and MQ server listen (each within
 * `readyTimeoutMs`, default 60 s: a bound on a hang); stopped with the scope.
 */
export const startServer = (endpoint: string, flags: ReadonlyArray<string>, readyTimeoutMs?: number, env: Readonly<Record<string, string>> = {}) =>
  Effect.gen(function*() {
    const server = yield* startCli(["serve", "--endpoint", endpoint, "--http-port", "0", "--chunk-size", "64", ...flags], env)
    const [, port] = yield* server.waitForStderr(/HTTP frontend listening on http:\/\/127\.0\.0\.1:(\d+)/, readyTimeoutMs)
    yield* server.waitForStderr(/MQ server listening on/, readyTimeoutMs)
    return { server, httpPort: Number(port) }
  })

/**
 * A worker daemon, once registered and its first store succeeded; its segments unlinked with the scope.
 * `curve`: its CURVE keys (CurveFixture.client()); absent: no CURVE.
 */
export const startWorker = (endpoint: string, heartbeatIntervalMs: number, storeEveryMs: number, curve?: DealerCurve, reportSession = false) =>
  Effect.gen(function*() {
    const namePrefix = `mpcache-e2e-fleet-${randomUUID()}`
    // Added first, so it runs last: after the worker is gone (a SIGKILLed worker cannot unlink its segments).
    yield* Effect.addFinalizer(() =>
      Effect.sync(() => {
        for (const name of readdirSync("/dev/shm")) if (name.startsWith(namePrefix)) rmSync(`/dev/shm/${name}`, { force: true })
      })
    )
    const worker = yield* startScript(DAEMON, [JSON.stringify({ endpoint, namePrefix, heartbeatIntervalMs, storeEveryMs, reportSession, ...(curve === undefined ? {} : { curve }) })])
    const [, instanceId] = yield* worker.waitForStdout(/"event":"registered","instanceId":"(\d+)"/, 60_000)
    yield* worker.waitForStdout(/"event":"store","n":1,"ok":true/, 60_000)
    return { worker, namePrefix, instanceId: instanceId! }
  })

export const getJson = (url: string) => Effect.promise(() => fetch(url).then((r) => r.json() as Promise<unknown>))
export const getText = (url: string) => Effect.promise(() => fetch(url).then((r) => r.text()))

/** `/api/status` of the server on `port`, decoded (a defect when it does not fit the schema). */
export const statusOf = (port: number) =>
  getJson(`http://127.0.0.1:${port}/api/status`).pipe(Effect.flatMap(decodeStatusDocument), Effect.orDie)

/** Polls `check` every 100 ms until it holds, at most `timeoutMs`; then returns the last value. */
export const eventually = <A>(check: Effect.Effect<A>, holds: (a: A) => boolean, timeoutMs: number) =>
  check.pipe(
    Effect.repeat({ schedule: Schedule.spaced("100 millis"), until: holds }),
    Effect.timeoutOrElse({ duration: `${timeoutMs} millis`, orElse: () => check })
  )

const WORKER_MAIN = childScript("worker-main")

/**
 * The fault tests' survivor check: a fresh worker process RETRIEVEs request "req-a" (330 tokens, seed 42,
 * stored earlier by another worker) into 20 blocks of its own, and gets all 320 complete-chunk tokens back
 * byte for byte: a fault of one instance left L1 and the other instances' data untouched (issue 13).
 */
export const assertRetrievesIntact = (endpoint: string, namePrefix: string) =>
  Effect.gen(function*() {
    const c = yield* runJsonScript(WORKER_MAIN, {
      endpoint,
      mode: "retrieve",
      namePrefix,
      seed: 42,
      blockIds: Array.from({ length: 20 }, (_, i) => 63 - i),
      tokenCount: 330,
      requestId: "req-a"
    })
    assert.strictEqual(c.code, 0, c.stderr)
    assert.deepStrictEqual(
      { ok: c.result["ok"], hitTokens: c.result["hitTokens"], mismatches: c.result["mismatches"] },
      { ok: true, hitTokens: 320, mismatches: [] }
    )
  })
