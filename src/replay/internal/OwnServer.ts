/**
 * The replay's own `mpcache serve`: a child process for the life of the
 * scope, SIGTERMed at its end (SIGKILLed past its shutdown budget), its IPC
 * socket removed.
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
import { ReplayError, type ReplayOptions } from "../ReplayOptions.ts"
import type { RunKeys } from "../RunKeys.ts"

// `mpcache` in the form this replay runs as (src/PackageFiles.ts): bundled from a bundled replay.
const MAIN = entryPath("cli")

/** Starts `mpcache serve` as a child process for the life of the scope; with `keys`, CURVE on. */
export const startOwnServer = (o: ReplayOptions, keys: RunKeys | undefined) =>
  Effect.acquireRelease(
    Effect.callback<{ readonly child: ChildProcess; readonly endpoint: string; readonly httpUrl: string }, ReplayError>((resume) => {
      const socket = join(tmpdir(), `mpcache-replay-${randomUUID()}.sock`)
      const endpoint = `ipc://${socket}`
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
        ...(o.l2Url === undefined ? [] : ["--l2-url", o.l2Url]),
        ...(o.l2Url === undefined || o.l2LookupTimeoutMs === undefined ? [] : ["--l2-lookup-timeout-ms", String(o.l2LookupTimeoutMs)]),
        ...(keys === undefined ? [] : ["--curve-secret-key-file", keys.serverSecretFile, "--curve-authorized-keys", keys.authorizedKeysFile])
      ], { stdio: ["ignore", "ignore", "pipe"] })
      let stderr = ""
      let httpUrl: string | undefined
      let listening = false
      child.stderr!.on("data", (d: Buffer) => {
        stderr = (stderr + d.toString()).slice(-50_000)
        httpUrl ??= stderr.match(/HTTP frontend listening on (http:\/\/[^\s"]+)/)?.[1]
        listening ||= stderr.includes("MQ server listening on")
        if (httpUrl !== undefined && listening) resume(Effect.succeed({ child, endpoint, httpUrl }))
      })
      child.on("exit", (code) =>
        resume(Effect.fail(new ReplayError({ message: `the replay's server exited (code ${code}) before it was ready: ${stderr.slice(-2000)}` })))
      )
    }),
    ({ child, endpoint }) =>
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
      }).pipe(
        Effect.andThen(Effect.sync(() => rmSync(endpoint.slice("ipc://".length), { force: true })))
      )
  )

/** How long the replay's own server may take to stop after SIGTERM before it is SIGKILLed (its shutdown budget is 16 s). */
const SERVER_STOP_TIMEOUT = "30 seconds"
