/**
 * Runs the real `mpcache` CLI as a child process (Node 24 from
 * process.execPath, never npx: setup-notes), with scoped cleanup.
 */
import { spawn, type ChildProcess } from "node:child_process"
import { fileURLToPath } from "node:url"
import { Effect, Scope } from "effect"

/**
 * The bundled `mpcache` command (scripts/bundle-serve.mjs, built by vitest's global setup from src/cli/main.ts):
 * `node CLI …` is `mpcache …`, started in about 0.2 s instead of the 1.3 s from source (issue 26). A
 * `mpcache replay` started from it starts its own server and workers bundled too (src/PackageFiles.ts).
 */
export const CLI = fileURLToPath(new URL("../../build/cli/bin/mpcache.mjs", import.meta.url))

/**
 * The bundled entry of `mpcache serve` (scripts/bundle-serve.mjs, built by vitest's global setup): what
 * `npm start` runs; `node SERVE_ENTRY [flags]` is `mpcache serve [flags]`.
 */
export const SERVE_ENTRY = fileURLToPath(new URL("../../build/cli/bin/serve.mjs", import.meta.url))

/**
 * The node argv of `mpcache ...args`: `serve` through its own launcher (what `npm start` runs), every other command
 * through {@link CLI}. A test's server, and a test's replay's own servers, skip the L1 prefault unless the test
 * names `--l1-prefault` or `--no-l1-prefault` itself: touching the default 1 GiB pool costs 0.65 s of CPU a
 * server, and the suite starts 160 of them; test/e2e/cli.test.ts's "status --json" runs one with the prefault and
 * waits for it to end, test/e2e/replay.test.ts's first replay keeps it.
 */
export const cliArgv = (args: ReadonlyArray<string>): Array<string> => {
  const prefault = args[0] === "serve" || args[0] === "replay" ? (args.some((a) => /^--(no-)?l1-prefault$/.test(a)) ? [] : ["--no-l1-prefault"]) : []
  return args[0] === "serve" ? [SERVE_ENTRY, ...args.slice(1), ...prefault] : [CLI, ...args, ...prefault]
}

export interface CliResult {
  readonly code: number | null
  readonly signal: NodeJS.Signals | null
  readonly stdout: string
  readonly stderr: string
}

/** Runs `mpcache ...args` to completion (killed after `timeoutMs`, default 60 s: a bound on a hang). */
export const runCli = (
  args: ReadonlyArray<string>,
  timeoutMs = 60_000,
  env: Record<string, string> = {}
): Effect.Effect<CliResult> => runNodeArgv(cliArgv(args), timeoutMs, env)

/** Runs `node ...argv` (this Node, this process's environment plus `env`) to completion, killed after `timeoutMs`. */
export const runNodeArgv = (
  argv: ReadonlyArray<string>,
  timeoutMs = 60_000,
  env: Record<string, string> = {}
): Effect.Effect<CliResult> =>
  Effect.callback<CliResult>((resume) => {
    const child = spawn(process.execPath, argv, { stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, ...env } })
    let stdout = ""
    let stderr = ""
    child.stdout.on("data", (d: Buffer) => (stdout += d.toString()))
    child.stderr.on("data", (d: Buffer) => (stderr += d.toString()))
    const timer = setTimeout(() => child.kill("SIGKILL"), timeoutMs)
    child.on("close", (code, signal) => {
      clearTimeout(timer)
      resume(Effect.succeed({ code, signal, stdout, stderr }))
    })
    return Effect.sync(() => child.kill("SIGKILL"))
  })

/** A long-running CLI process (e.g. `serve`) stopped when the scope closes if still alive (SIGTERM, then SIGKILL). */
export interface CliProcess {
  readonly child: ChildProcess
  /** Everything written to stderr so far. */
  readonly stderr: () => string
  readonly stdout: () => string
  /**
   * Waits until stderr holds `count` (default 1) matches of `pattern` and returns the last of them; fails when
   * the process exits first or after `timeoutMs` (default 60 s: a bound on a hang, never a timing).
   */
  readonly waitForStderr: (pattern: RegExp, timeoutMs?: number, count?: number) => Effect.Effect<RegExpMatchArray, Error>
  /** Waits until stdout holds `count` (default 1) matches of `pattern`, as {@link waitForStderr}. */
  readonly waitForStdout: (pattern: RegExp, timeoutMs?: number, count?: number) => Effect.Effect<RegExpMatchArray, Error>
  /** How many matches of `pattern` stderr holds so far (to wait for one more with {@link waitForStderr}). */
  readonly countStderr: (pattern: RegExp) => number
  /**
   * SIGSTOPs the process for `ms`, then SIGCONTs it; returns how long it was stopped as this process measured it
   * (longer than `ms` on a busy machine: a bound drawn from it holds there too).
   */
  readonly pauseFor: (ms: number) => Effect.Effect<number>
  /** Sends `signal` and waits for the exit. */
  readonly stop: (signal: NodeJS.Signals) => Effect.Effect<{ readonly code: number | null; readonly signal: NodeJS.Signals | null }>
}

/** Every match of `pattern` in `text`, in order (a copy of the pattern with the global flag does the scan). */
const matchesOf = (text: string, pattern: RegExp): Array<RegExpMatchArray> =>
  [...text.matchAll(new RegExp(pattern.source, pattern.flags.includes("g") ? pattern.flags : `${pattern.flags}g`))]

export const startCli = (args: ReadonlyArray<string>, env: Readonly<Record<string, string>> = {}): Effect.Effect<CliProcess, never, Scope.Scope> => {
  const [script, ...rest] = cliArgv(args)
  return startScript(script!, rest, env)
}

/** A Node 24 script as a child process (this process's environment plus `env`), killed when the scope closes if still alive. */
export const startScript = (
  script: string,
  args: ReadonlyArray<string>,
  env: Readonly<Record<string, string>> = {}
): Effect.Effect<CliProcess, never, Scope.Scope> =>
  Effect.acquireRelease(
    Effect.sync(() => {
      const child = spawn(process.execPath, [script, ...args], { stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, ...env } })
      let stdout = ""
      let stderr = ""
      child.stdout!.on("data", (d: Buffer) => (stdout += d.toString()))
      child.stderr!.on("data", (d: Buffer) => (stderr += d.toString()))
      const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
        child.on("exit", (code, signal) => resolve({ code, signal }))
      )
      const waitFor = (stream: () => string, pattern: RegExp, timeoutMs = 60_000, count = 1) =>
        Effect.tryPromise({
          try: () =>
            new Promise<RegExpMatchArray>((resolve, reject) => {
              const started = Date.now()
              const poll = () => {
                const ms = matchesOf(stream(), pattern)
                if (ms.length >= count) return resolve(ms[count - 1]!)
                if (child.exitCode !== null) return reject(new Error(`process exited (${child.exitCode}) before ${pattern}: ${stderr}${stdout.slice(-2000)}`))
                if (Date.now() - started > timeoutMs) {
                  return reject(new Error(`timed out waiting for ${count > 1 ? `${count} matches of ` : ""}${pattern}: ${stderr}${stdout.slice(-2000)}`))
                }
                setTimeout(poll, 20)
              }
              poll()
            }),
          catch: (e) => e as Error
        })
      const stop = (signal: NodeJS.Signals) =>
        Effect.promise(() => {
          child.kill(signal)
          return exited
        })
      return {
        child,
        stderr: () => stderr,
        stdout: () => stdout,
        waitForStderr: (pattern: RegExp, timeoutMs?: number, count?: number) => waitFor(() => stderr, pattern, timeoutMs, count),
        waitForStdout: (pattern: RegExp, timeoutMs?: number, count?: number) => waitFor(() => stdout, pattern, timeoutMs, count),
        countStderr: (pattern: RegExp) => matchesOf(stderr, pattern).length,
        pauseFor: (ms: number) =>
          Effect.gen(function*() {
            const stoppedAt = Date.now()
            child.kill("SIGSTOP")
            yield* Effect.sleep(`${ms} millis`)
            child.kill("SIGCONT")
            return Date.now() - stoppedAt
          }),
        stop
      }
    }),
    // SIGTERM first, so a server unlinks its L1 pool (a SIGKILLed one leaves its 1 GiB segment in /dev/shm);
    // SIGKILL after 5 s. SIGCONT wakes a process a test left stopped.
    (p) =>
      Effect.promise(() =>
        new Promise<void>((resolve) => {
          const c = p.child
          if (c.exitCode !== null || c.signalCode !== null) return resolve()
          const timer = setTimeout(() => c.kill("SIGKILL"), 5_000)
          c.once("exit", () => {
            clearTimeout(timer)
            resolve()
          })
          c.kill("SIGTERM")
          c.kill("SIGCONT")
        })
      )
  )

/** Runs `script` (Node 24) with its JSON argument; its last stdout line is a JSON result. */
export const runJsonScript = (script: string, args: Record<string, unknown>) =>
  Effect.callback<{ readonly code: number | null; readonly result: Record<string, unknown>; readonly stderr: string }>((resume) => {
    const child = spawn(process.execPath, [script, JSON.stringify(args)], { stdio: ["ignore", "pipe", "pipe"] })
    let out = ""
    let err = ""
    child.stdout.on("data", (d: Buffer) => (out += d.toString()))
    child.stderr.on("data", (d: Buffer) => (err += d.toString()))
    child.on("close", (code) => {
      let result: Record<string, unknown> = {}
      try {
        result = JSON.parse(out.trim().split("\n").pop() ?? "{}") as Record<string, unknown>
      } catch {
        result = { unparsable: out }
      }
      resume(Effect.succeed({ code, result, stderr: err }))
    })
    return Effect.sync(() => child.kill("SIGKILL"))
  })
