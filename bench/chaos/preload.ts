/**
 * Preloaded into `mpcache replay` by bench:chaos (`node --import
 * ./bench/chaos/preload.ts src/cli/main.ts replay …`, with
 * MPCACHE_CHAOS_LOG=FILE): writes what the replay does to its worker
 * processes, one JSON line each, to FILE — every signal it sends
 * (`{"at","event":"signal","pid","signal"}`, written before the signal goes
 * out), every worker's registration (`"ready"`, with its pid and instance
 * id, from the worker's Ready message) and every exit — so that the bench
 * can tell, for each instance the server reaped, whether that worker had
 * been killed or paused first. `at` is the wall clock, ms, like the
 * server's log timestamps. Adds nothing to the replay's behaviour; without
 * MPCACHE_CHAOS_LOG it does nothing. Only for benchmarks.
 */
import { ChildProcess } from "node:child_process"
import { appendFileSync } from "node:fs"

const file = process.env["MPCACHE_CHAOS_LOG"]

type Emit = (this: ChildProcess, event: string | symbol, ...args: Array<unknown>) => boolean
type Kill = (this: ChildProcess, signal?: NodeJS.Signals | number) => boolean

const isReady = (m: unknown): m is { readonly _tag: "Ready"; readonly pid: number; readonly instanceId: string } =>
  typeof m === "object" && m !== null && (m as { readonly _tag?: unknown })._tag === "Ready"

if (file !== undefined && file !== "") {
  // Synchronous appends: a line is on disk before the signal it announces is sent.
  const write = (event: Record<string, unknown>): void => appendFileSync(file, `${JSON.stringify({ at: Date.now(), ...event })}\n`)
  const kill: Kill = ChildProcess.prototype.kill
  const patchedKill: Kill = function(signal) {
    write({ event: "signal", pid: this.pid, signal: signal ?? "SIGTERM" })
    return kill.call(this, signal)
  }
  ChildProcess.prototype.kill = patchedKill
  const emit = ChildProcess.prototype.emit as Emit
  const patchedEmit: Emit = function(event, ...args) {
    if (event === "message" && isReady(args[0])) write({ event: "ready", pid: args[0].pid, instanceId: args[0].instanceId })
    if (event === "exit") write({ event: "exit", pid: this.pid, code: args[0], signal: args[1] })
    return emit.call(this, event, ...args)
  }
  ChildProcess.prototype.emit = patchedEmit as typeof ChildProcess.prototype.emit
}
