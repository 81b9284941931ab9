/**
 * What a bench run leaves behind unless it cleans up: child processes, ipc
 * socket files, and whatever else it registers (shared-memory segments).
 * One `Resources` per bench process: it names them after one tag, and it
 * cleans them up on every way out — the end of `main`, a failure, SIGINT or
 * SIGTERM, and as a last resort, synchronously, on `exit`.
 */
import type { ChildProcess } from "node:child_process"
import { rmSync } from "node:fs"
import os from "node:os"
import path from "node:path"
import { isRunning, stopChild } from "./children.ts"

/** A bench run's resources and their cleanup. */
export interface Resources {
  /** Unique to this run (pid and time): every file name it creates starts with it. */
  readonly tag: string
  /** The running children; the spawn helpers of bench/lib/children.ts add to it. */
  readonly children: Set<ChildProcess>
  /** `ipc://<tmpdir>/<tag>-<name>.sock` (`<tag>.sock` without a name); the file is removed on cleanup. */
  readonly ipcEndpoint: (name?: string) => string
  /** Adds a synchronous step to every cleanup, run after the children are stopped (unlinking shm, say). */
  readonly onCleanup: (step: () => void) => void
  /** Stops each child (SIGTERM, SIGKILL after the stop timeout), then runs the synchronous steps. */
  readonly cleanup: () => Promise<void>
  /** SIGKILLs each child still running, then runs the synchronous steps: for `exit`, where nothing async runs. */
  readonly cleanupSync: () => void
}

/** How the run reacts to SIGINT / SIGTERM before exiting 130 / 143. */
export type OnSignal =
  /** `cleanup()`: the children get SIGTERM and time to shut down. */
  | "stop"
  /** `cleanupSync()` at once. */
  | "kill"

/**
 * The resources of this process, named after `tag`, with the `exit` and
 * signal handlers installed. `stopTimeoutMs`: how long a child may take to
 * exit after SIGTERM.
 */
export const makeResources = (
  tag: string,
  options: { readonly stopTimeoutMs: number; readonly onSignal: OnSignal }
): Resources => {
  const children = new Set<ChildProcess>()
  const socketFiles: Array<string> = []
  const steps: Array<() => void> = [() => {
    for (const file of socketFiles) rmSync(file, { force: true })
  }]
  const runSteps = (): void => {
    for (const step of steps) step()
  }
  const resources: Resources = {
    tag,
    children,
    ipcEndpoint: (name) => {
      const file = path.join(os.tmpdir(), name === undefined ? `${tag}.sock` : `${tag}-${name}.sock`)
      socketFiles.push(file)
      return `ipc://${file}`
    },
    onCleanup: (step) => void steps.push(step),
    cleanup: async () => {
      await Promise.all([...children].map((child) => stopChild(child, options.stopTimeoutMs)))
      runSteps()
    },
    cleanupSync: () => {
      for (const child of children) if (isRunning(child)) child.kill("SIGKILL")
      runSteps()
    }
  }
  // Last resort for an abrupt exit: nothing async is possible here.
  process.once("exit", resources.cleanupSync)
  for (const signal of ["SIGINT", "SIGTERM"] as const) {
    process.once(signal, () => {
      const code = signal === "SIGINT" ? 130 : 143
      if (options.onSignal === "stop") {
        void resources.cleanup().finally(() => process.exit(code))
      } else {
        resources.cleanupSync()
        process.exit(code)
      }
    })
  }
  return resources
}

/**
 * Runs a bench's `main`, then cleans up. On a failure it prints
 * `<name> failed: <stack>` to stderr, cleans up and exits 1.
 */
export const runBench = async (name: string, main: () => Promise<void>, resources: Resources): Promise<void> => {
  try {
    await main()
    await resources.cleanup()
  } catch (error) {
    process.stderr.write(`${name} failed: ${error instanceof Error ? error.stack ?? error.message : String(error)}\n`)
    await resources.cleanup()
    process.exit(1)
  }
}
