/**
 * Child processes of the benches, all `node` scripts run from the repository
 * root: spawned until they say they are ready (`spawnReady`), followed line
 * by line (`startLineChild`), run to their last JSON line (`runJson`), and
 * stopped with SIGTERM then SIGKILL (`stopChild`).
 *
 * Every spawn adds its child to a `Tracker` at once, so that the caller's
 * cleanup (bench/lib/resources.ts) reaches it on every path, a failed start
 * included; a line child also removes itself once it has ended.
 */
import { spawn, type ChildProcess } from "node:child_process"
import { ROOT } from "./root.ts"

/** The repository root: every child runs there, so argv paths are relative to it. */
export { ROOT }

/** The children to clean up: a `Set<ChildProcess>` is one. */
export interface Tracker {
  readonly add: (child: ChildProcess) => void
  readonly delete: (child: ChildProcess) => void
}

/** Whether `child` has neither exited nor been killed by a signal. */
export const isRunning = (child: ChildProcess): boolean => child.exitCode === null && child.signalCode === null

/**
 * SIGTERM, then waits for the exit; SIGKILL when it has not come within
 * `timeoutMs` (graceful first: the server unmaps and writes its CPU profile
 * on SIGTERM). Resolves at once for a child that already ended.
 */
export const stopChild = (child: ChildProcess, timeoutMs: number): Promise<void> =>
  new Promise((resolve) => {
    if (!isRunning(child)) return resolve()
    const timer = setTimeout(() => child.kill("SIGKILL"), timeoutMs)
    child.once("exit", () => {
      clearTimeout(timer)
      resolve()
    })
    child.kill("SIGTERM")
  })

/**
 * Spawns `node ...argv` and resolves with the child once its stdout or
 * stderr shows `ready` (both pipes are drained after). Rejects, naming
 * `name` and the output's tail (4,000 characters), when it fails to start,
 * exits first, or is not ready within `timeoutMs`.
 */
export const spawnReady = (
  name: string,
  argv: ReadonlyArray<string>,
  ready: string,
  timeoutMs: number,
  tracker: Tracker
): Promise<ChildProcess> =>
  new Promise((resolve, reject) => {
    const child = spawn(process.execPath, argv, { cwd: ROOT, stdio: ["ignore", "pipe", "pipe"] })
    tracker.add(child)
    let output = ""
    const timer = setTimeout(() => fail(`not ready after ${timeoutMs} ms`), timeoutMs)
    const fail = (why: string): void => {
      clearTimeout(timer)
      reject(new Error(`${name} ${why}; output:\n${output.slice(-4000)}`))
    }
    const onData = (chunk: Buffer): void => {
      if (output.includes(ready)) return // already up: just drain the pipe
      output += chunk.toString()
      if (output.includes(ready)) {
        clearTimeout(timer)
        resolve(child)
      }
    }
    child.stdout?.on("data", onData)
    child.stderr?.on("data", onData)
    child.once("error", (error) => fail(`failed to start: ${error.message}`))
    child.once("exit", (code, signal) => fail(`exited early (code ${code}, signal ${signal})`))
  })

/** Which pipe a line came from. */
export type Stream = "stdout" | "stderr"

/** How a child ended: its exit code, or the signal that killed it (both null when it failed to start). */
export interface Exited {
  readonly code: number | null
  readonly signal: NodeJS.Signals | null
}

/** A child whose stdout and stderr lines are kept (the last 400) and can be waited for. */
export interface LineChild {
  readonly name: string
  readonly process: ChildProcess
  /**
   * Resolves with the first match of `pattern` in a past or future line (of
   * `stream` only, when given); rejects after `timeoutMs` or when the child
   * exits first, with the output's tail.
   */
  readonly waitFor: (pattern: RegExp, timeoutMs: number, stream?: Stream) => Promise<RegExpMatchArray>
  /** Calls `listener` for each future line, with the wall clock (ms) it was read at. */
  readonly onLine: (listener: (line: string, stream: Stream, at: number) => void) => void
  /** The last 40 lines, prefixed with their stream, at most 6,000 characters: for error messages. */
  readonly tail: () => string
  readonly exited: Promise<Exited>
}

const KEEP_LINES = 400

/**
 * Spawns `node ...argv` with both output pipes split into lines; stdin is a
 * pipe when `options.stdin` (a child driven by commands), else ignored.
 */
export const startLineChild = (
  name: string,
  argv: ReadonlyArray<string>,
  tracker: Tracker,
  options: { readonly stdin?: boolean } = {}
): LineChild => {
  const child = spawn(process.execPath, argv, { cwd: ROOT, stdio: [options.stdin === true ? "pipe" : "ignore", "pipe", "pipe"] })
  tracker.add(child)
  const lines: Array<{ readonly line: string; readonly stream: Stream }> = []
  const listeners: Array<(line: string, stream: Stream, at: number) => void> = []
  const exited = new Promise<Exited>((resolve) => {
    child.once("exit", (code, signal) => {
      tracker.delete(child)
      resolve({ code, signal })
    })
    child.once("error", () => {
      tracker.delete(child)
      resolve({ code: null, signal: null })
    })
  })
  for (const stream of ["stdout", "stderr"] as const) {
    let partial = ""
    child[stream]!.on("data", (chunk: Buffer) => {
      const at = Date.now()
      const parts = (partial + chunk.toString()).split("\n")
      partial = parts.pop()!
      for (const line of parts) {
        lines.push({ line, stream })
        if (lines.length > KEEP_LINES) lines.shift()
        for (const listener of listeners) listener(line, stream, at)
      }
    })
  }
  const tail = () => lines.slice(-40).map((l) => `${l.stream}: ${l.line}`).join("\n").slice(-6000)
  const waitFor = (pattern: RegExp, timeoutMs: number, stream?: Stream) =>
    new Promise<RegExpMatchArray>((resolve, reject) => {
      for (const l of lines) {
        const m = (stream === undefined || l.stream === stream) ? l.line.match(pattern) : null
        if (m !== null) return resolve(m)
      }
      let done = false
      const timer = setTimeout(() => finish(new Error(`${name}: no line matching ${pattern} within ${timeoutMs} ms; output:\n${tail()}`)), timeoutMs)
      const finish = (result: RegExpMatchArray | Error) => {
        if (done) return
        done = true
        clearTimeout(timer)
        if (result instanceof Error) reject(result)
        else resolve(result)
      }
      listeners.push((line, s) => {
        if (stream !== undefined && s !== stream) return
        const m = line.match(pattern)
        if (m !== null) finish(m)
      })
      void exited.then(({ code, signal }) =>
        finish(new Error(`${name} exited (code ${code}, signal ${signal}) before a line matching ${pattern}; output:\n${tail()}`))
      )
    })
  return { name, process: child, waitFor, onLine: (l) => void listeners.push(l), tail, exited }
}

/**
 * Runs `node ...argv` to its end and returns its last stdout line that
 * starts with `{`, parsed as `A` (unchecked: the child is ours). Rejects when
 * it exits non-zero or printed no such line.
 */
export const runJson = async <A>(
  name: string,
  argv: ReadonlyArray<string>,
  tracker: Tracker
): Promise<A> => {
  const child = startLineChild(name, argv, tracker)
  let last = ""
  child.onLine((line, stream) => {
    if (stream === "stdout" && line.trim().startsWith("{")) last = line
  })
  const { code, signal } = await child.exited
  if (code !== 0 || last === "") throw new Error(`${name} failed (code ${code}, signal ${signal}); output:\n${child.tail()}`)
  return JSON.parse(last) as A
}

/**
 * Runs `node ...argv` with stderr passed through and stdout passed through
 * too, or captured when `capture`; resolves with the exit code (128 for a
 * signal, 1 for a failed start) and what stdout was captured. Never rejects.
 */
export const runNode = (argv: ReadonlyArray<string>, capture: boolean): Promise<{ code: number; stdout: string }> =>
  new Promise((resolve) => {
    const child = spawn(process.execPath, argv, { cwd: ROOT, stdio: ["ignore", capture ? "pipe" : "inherit", "inherit"] })
    let stdout = ""
    child.stdout?.on("data", (chunk: Buffer) => {
      stdout += chunk.toString()
    })
    child.once("error", (error) => {
      process.stderr.write(`cannot start node ${argv.join(" ")}: ${error.message}\n`)
      resolve({ code: 1, stdout })
    })
    child.once("exit", (code, signal) => resolve({ code: code ?? (signal === null ? 1 : 128), stdout }))
  })
