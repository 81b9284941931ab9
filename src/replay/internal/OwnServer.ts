/**
 * The replay's own `mpcache serve`: a child process for the life of the
 * scope, SIGTERMed at its end (SIGKILLed past its shutdown budget), its IPC
 * sockets removed. With the kv-aware router it publishes its KV events on
 * a PUB and a replay ROUTER of its own (issue 28 item 6); `restart` stops it
 * and starts it again on the same sockets (a new incarnation, a new HTTP port).
 *
 * @internal
 */
import { type ChildProcess, spawn } from "node:child_process"
import { randomUUID } from "node:crypto"
import { rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Effect } from "effect"
import { entryPath } from "../../PackageFiles.ts"
import type { KvEventsPlace } from "../KvRouter.ts"
import { ReplayError, type ReplayOptions } from "../ReplayOptions.ts"
import type { RunKeys } from "../RunKeys.ts"

// `mpcache` in the form this replay runs as (src/PackageFiles.ts): bundled from a bundled replay.
const MAIN = entryPath("cli")

/** One of the replay's servers: where it listens now, and how to restart it. */
export interface OwnServer {
  readonly endpoint: string
  /** Its HTTP frontend now (a restart picks a new port). */
  readonly httpUrl: () => string
  /** Its KV event sockets (kv-aware router only). */
  readonly kvEvents: KvEventsPlace | undefined
  /** Stops the server (SIGTERM, waited for) and starts it again on the same sockets; its new HTTP frontend. */
  readonly restart: Effect.Effect<string, ReplayError>
}

const spawnServer = (o: ReplayOptions, keys: RunKeys | undefined, endpoint: string, kvEvents: KvEventsPlace | undefined) =>
  Effect.callback<{ readonly child: ChildProcess; readonly httpUrl: string }, ReplayError>((resume) => {
    const child = spawn(process.execPath, [
      MAIN,
      "serve",
      "--endpoint",
      endpoint,
      "--http-port",
      "0",
      "--log-format",
      "json",
      "--chunk-size",
      String(o.chunkSizeTokens),
      "--l1-size-gb",
      String(o.l1SizeGb),
      "--worker-disconnect-grace-seconds",
      String(o.disconnectGraceSeconds),
      ...(o.l1Prefault === false ? ["--no-l1-prefault"] : []),
      ...(o.l2Url === undefined ? [] : ["--l2-url", o.l2Url]),
      ...(o.l2Url === undefined || o.l2LookupTimeoutMs === undefined ? [] : ["--l2-lookup-timeout-ms", String(o.l2LookupTimeoutMs)]),
      ...(o.l2Url === undefined || o.l2KeyPrefix === undefined ? [] : ["--l2-key-prefix", o.l2KeyPrefix]),
      ...(kvEvents === undefined ? [] : ["--kv-events-endpoint", kvEvents.endpoint, "--kv-events-replay-endpoint", kvEvents.replayEndpoint]),
      ...(keys === undefined ? [] : ["--curve-secret-key-file", keys.serverSecretFile, "--curve-authorized-keys", keys.authorizedKeysFile, "--http-token-file", keys.httpTokenFile])
    ], { stdio: ["ignore", "ignore", "pipe"] })
    let stderr = ""
    let httpUrl: string | undefined
    let listening = false
    child.stderr!.on("data", (d: Buffer) => {
      stderr = (stderr + d.toString()).slice(-50_000)
      httpUrl ??= stderr.match(/HTTP frontend listening on (http:\/\/[^\s"]+)/)?.[1]
      listening ||= stderr.includes("MQ server listening on")
      if (httpUrl !== undefined && listening) resume(Effect.succeed({ child, httpUrl }))
    })
    child.on("exit", (code) =>
      resume(Effect.fail(new ReplayError({ message: `the replay's server exited (code ${code}) before it was ready: ${stderr.slice(-2000)}` })))
    )
  })

/** SIGTERM, then SIGKILL past the server's shutdown budget; ends when it has exited. */
const stopServer = (child: ChildProcess) =>
  Effect.gen(function*() {
    const exited = Effect.callback<void>((resume) => {
      if (child.exitCode !== null || child.signalCode !== null) return resume(Effect.void)
      child.once("exit", () => resume(Effect.void))
    })
    child.kill("SIGTERM")
    // The server's own shutdown may take its drain (10 s), its reply flush (5 s) and its linger (1 s): a server
    // still inside that budget is waited for, not killed. Past it, SIGKILL, and its exit is awaited too.
    yield* exited.pipe(
      Effect.timeoutOrElse({ duration: SERVER_STOP_TIMEOUT, orElse: () =>
          Effect.logWarning(`the replay's server did not stop within ${SERVER_STOP_TIMEOUT} of SIGTERM: SIGKILL`).pipe(
            Effect.andThen(Effect.sync(() => void child.kill("SIGKILL"))),
            Effect.andThen(exited)
          ) })
    )
  })

/** Starts `mpcache serve` as a child process for the life of the scope; with `keys`, CURVE on; with `o.router` kv-aware, its KV event sockets. */
export const startOwnServer = (o: ReplayOptions, keys: RunKeys | undefined) =>
  Effect.gen(function*() {
    const base = join(tmpdir(), `mpcache-replay-${randomUUID()}`)
    const endpoint = `ipc://${base}.sock`
    const kvEvents = o.router === "kv-aware" ? { endpoint: `ipc://${base}-events.sock`, replayEndpoint: `ipc://${base}-replay.sock` } : undefined
    // The process running now (a restart replaces it); the release stops whichever it is, then removes the sockets.
    const state: { current: { readonly child: ChildProcess; readonly httpUrl: string } | undefined } = { current: undefined }
    state.current = yield* Effect.acquireRelease(spawnServer(o, keys, endpoint, kvEvents), (first) =>
      stopServer((state.current ?? first).child).pipe(
        Effect.andThen(Effect.sync(() => {
          for (const e of [endpoint, kvEvents?.endpoint, kvEvents?.replayEndpoint]) if (e !== undefined) rmSync(e.slice("ipc://".length), { force: true })
        }))
      ))
    // Uninterruptible: a started process is always the one the release stops.
    const restart = Effect.uninterruptible(Effect.gen(function*() {
      yield* stopServer(state.current!.child)
      state.current = yield* spawnServer(o, keys, endpoint, kvEvents)
      return state.current.httpUrl
    }))
    return { endpoint, httpUrl: () => state.current!.httpUrl, kvEvents, restart } satisfies OwnServer
  })

/** How long the replay's own server may take to stop after SIGTERM before it is SIGKILLed (its shutdown budget is 16 s). */
const SERVER_STOP_TIMEOUT = "30 seconds"
