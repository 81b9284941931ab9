/**
 * A PING client in a process of its own, for benches whose own event loop is
 * busy (bench:transfer runs the worker in the bench process): the round trips
 * it times then include the server and the kernel, not the bench's other work.
 *
 * Parent side: `startPingChild(endpoint, intervalMs)` forks this file with an
 * IPC channel; the child sends one PING [nil] every `intervalMs`, whatever the
 * replies do (`pacedPingLoop` in ./pingClient.ts), from the start;
 * `measure()` starts recording, `collect()` stops recording and returns the
 * round trips (µs) of the PINGs sent since, `stop()` ends the child.
 */
import { fork, type ChildProcess } from "node:child_process"
import { pacedPingLoop, type PingRun, type Responder } from "./pingClient.ts"

type ToChild = { readonly type: "measure" } | { readonly type: "collect" } | { readonly type: "stop" }
type FromChild = { readonly type: "latencies"; readonly us: ReadonlyArray<number> } | { readonly type: "failed"; readonly why: string }

/** The parent's handle on one PING child. */
export interface PingChild {
  readonly measure: () => void
  readonly collect: () => Promise<Array<number>>
  readonly stop: () => Promise<void>
  /** Rejects when the child fails or exits before `stop()`. */
  readonly failed: Promise<never>
}

/**
 * Forks a PING child against `endpoint`, sending one PING every `intervalMs`
 * and checking each reply is what `responder` answers.
 */
export const startPingChild = (endpoint: string, intervalMs: number, responder: Responder): PingChild => {
  const child: ChildProcess = fork(import.meta.filename, [endpoint, String(intervalMs), responder], {
    stdio: ["ignore", "inherit", "inherit", "ipc"]
  })
  let stopping = false
  const waiters: Array<(us: Array<number>) => void> = []
  const failed = new Promise<never>((_, reject) => {
    child.on("message", (m: FromChild) => {
      if (m.type === "latencies") waiters.shift()?.([...m.us])
      else reject(new Error(`PING client failed: ${m.why}`))
    })
    child.once("exit", (code, signal) => {
      if (!stopping) reject(new Error(`PING client exited (code ${code}, signal ${signal})`))
    })
  })
  failed.catch(() => {}) // observed where it is raced
  const send = (m: ToChild): void => {
    child.send(m)
  }
  return {
    measure: () => send({ type: "measure" }),
    collect: () => new Promise((resolve) => {
      waiters.push(resolve)
      send({ type: "collect" })
    }),
    stop: () =>
      new Promise((resolve) => {
        stopping = true
        if (child.exitCode !== null || child.signalCode !== null) return resolve()
        child.once("exit", () => resolve())
        send({ type: "stop" })
      }),
    failed
  }
}

// ------------------------------------------------------------- child side

if (process.send !== undefined && process.argv[1] === import.meta.filename) {
  const endpoint = process.argv[2]!
  const intervalMs = Number(process.argv[3])
  const run: PingRun = { measuring: false, stopped: false, latenciesUs: [] }
  const reply = (m: FromChild): void => {
    process.send!(m)
  }
  process.on("message", (m: ToChild) => {
    if (m.type === "measure") {
      run.latenciesUs.length = 0
      run.measuring = true
    } else if (m.type === "collect") {
      // The PINGs sent in the window count however late their replies come (the slow ones matter most).
      run.measuring = false
      const deliver = (): void => {
        if ((run.outstanding?.() ?? 0) > 0) setTimeout(deliver, 1)
        else reply({ type: "latencies", us: run.latenciesUs.splice(0) })
      }
      deliver()
    } else {
      run.stopped = true
    }
  })
  pacedPingLoop(endpoint, run, intervalMs, process.argv[4] === "echo" ? "echo" : "mpcache").then(
    () => process.disconnect(),
    (error: unknown) => {
      reply({ type: "failed", why: error instanceof Error ? error.message : String(error) })
      process.disconnect()
      process.exitCode = 1
    }
  )
}
