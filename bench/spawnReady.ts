/** Child processes of the benches: a Node script started and awaited until it says it is ready. */
import { spawn, type ChildProcess } from "node:child_process"
import path from "node:path"

const ROOT = path.resolve(import.meta.dirname, "..")

/**
 * Spawns `node ...argv` in the repository root and resolves with the child
 * once its stdout or stderr shows `ready` (both pipes are drained after).
 * Rejects, naming `name` and the output's tail, when it fails to start,
 * exits first, or is not ready within `timeoutMs`. `onSpawn` gets the child
 * at once, so the caller can clean it up on every path.
 */
export const spawnReady = (
  name: string,
  argv: ReadonlyArray<string>,
  ready: string,
  timeoutMs: number,
  onSpawn: (child: ChildProcess) => void
): Promise<ChildProcess> =>
  new Promise((resolve, reject) => {
    const child = spawn(process.execPath, argv, { cwd: ROOT, stdio: ["ignore", "pipe", "pipe"] })
    onSpawn(child)
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
