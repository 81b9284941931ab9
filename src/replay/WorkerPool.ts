/**
 * The replay's engine workers: child processes (`WorkerProcess.ts`) forked
 * with an IPC channel. A handle runs one request at a time; a worker that
 * dies mid-request fails that request with `WorkerDied`, so the driver can
 * give it to another worker.
 */
import { fork, type ChildProcess } from "node:child_process"
import { Deferred, Effect, Schema } from "effect"
import { entryPath } from "../PackageFiles.ts"
import type { Done, Failed, RunRequest, WorkerMessage, WorkerSettings } from "./Messages.ts"

// The worker in the form this replay runs as (src/PackageFiles.ts): bundled from a bundled replay.
const WORKER_SCRIPT = entryPath("replayWorker")

/** A worker process exited (killed, crashed) before answering. */
export class WorkerDied extends Schema.TaggedError<WorkerDied>()("WorkerDied", {
  slot: Schema.Number,
  message: Schema.String
}) {}

export interface WorkerHandle {
  /** 1-based number of this worker in the run (replacements get new numbers). */
  readonly slot: number
  /** Its KV cache segments are `<namePrefix>-L<layer>` in /dev/shm. */
  readonly namePrefix: string
  readonly child: ChildProcess
  readonly instanceId: string
  readonly pid: number
  readonly chunkSizeTokens: number
  readonly isAlive: () => boolean
  /** Sends one request and waits for its answer. */
  readonly run: (request: RunRequest) => Effect.Effect<Done | Failed, WorkerDied>
  /** Asks the worker to unregister and exit; SIGKILL after `graceMs`. Resolves when it exited. */
  readonly shutdown: (graceMs: number) => Effect.Effect<void>
  /** Output the worker wrote to stderr (its logs), for diagnostics. */
  readonly stderr: () => string
}

/**
 * Forks a worker and waits for it to register (Ready), at most `readyTimeoutMs`.
 * Fails with WorkerDied when it exits or stays silent.
 */
export const spawnWorker = (
  slot: number,
  settings: WorkerSettings,
  readyTimeoutMs = 60_000
): Effect.Effect<WorkerHandle, WorkerDied> =>
  Effect.gen(function*() {
    const child = fork(WORKER_SCRIPT, [JSON.stringify(settings)], {
      execPath: process.execPath,
      execArgv: [],
      stdio: ["ignore", "ignore", "pipe", "ipc"]
    })
    let stderr = ""
    child.stderr?.on("data", (d: Buffer) => {
      stderr = (stderr + d.toString()).slice(-20_000)
    })
    let alive = true
    let pending: Deferred.Deferred<Done | Failed, WorkerDied> | undefined
    const ready = yield* Deferred.make<{ instanceId: string; pid: number; chunkSizeTokens: number }, WorkerDied>()
    child.on("message", (m: WorkerMessage) => {
      if (m._tag === "Ready") Deferred.doneUnsafe(ready, Effect.succeed(m))
      else if (pending !== undefined) {
        const p = pending
        pending = undefined
        Deferred.doneUnsafe(p, Effect.succeed(m))
      }
    })
    const exited = yield* Deferred.make<void>()
    // A send to a worker killed a moment ago fails with EPIPE (an 'error' event, fatal when unheard); its
    // 'exit' event, which follows, fails the request in flight with WorkerDied.
    child.on("error", (e) => {
      stderr = `${stderr}\n[driver] ${e.message}`.slice(-20_000)
    })
    child.on("exit", (code, signal) => {
      alive = false
      const died = new WorkerDied({ slot, message: `worker ${slot} exited (${signal ?? `code ${code}`})` })
      Deferred.doneUnsafe(ready, Effect.fail(died))
      if (pending !== undefined) Deferred.doneUnsafe(pending, Effect.fail(died))
      pending = undefined
      Deferred.doneUnsafe(exited, Effect.void)
    })
    const info = yield* Deferred.await(ready).pipe(
      Effect.timeoutOrElse({
        duration: `${readyTimeoutMs} millis`,
        orElse: () => {
          child.kill("SIGKILL")
          return Effect.fail(new WorkerDied({ slot, message: `worker ${slot} did not register within ${readyTimeoutMs} ms: ${stderr.slice(-2000)}` }))
        }
      })
    )
    return {
      slot,
      namePrefix: settings.namePrefix,
      child,
      instanceId: info.instanceId,
      pid: info.pid,
      chunkSizeTokens: info.chunkSizeTokens,
      isAlive: () => alive,
      run: (request) =>
        Effect.suspend(() => {
          if (!alive) return Effect.fail(new WorkerDied({ slot, message: `worker ${slot} is dead` }))
          const d = Deferred.makeUnsafe<Done | Failed, WorkerDied>()
          pending = d
          child.send(request)
          return Deferred.await(d)
        }),
      shutdown: (graceMs) =>
        Effect.suspend(() => {
          if (!alive) return Effect.void
          if (child.connected) child.send({ _tag: "Shutdown" })
          return Deferred.await(exited).pipe(
            Effect.timeoutOrElse({
              duration: `${graceMs} millis`,
              orElse: () => Effect.sync(() => void child.kill("SIGKILL")).pipe(Effect.andThen(Deferred.await(exited)))
            })
          )
        }),
      stderr: () => stderr
    }
  })
