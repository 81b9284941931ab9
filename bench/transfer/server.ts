/**
 * bench:transfer's children: `mpcache serve` (with bench/transfer/loop-delay.ts
 * preloaded, reporting its event-loop delay on SIGUSR2) and the bare
 * zeromq.js echo router the PING probes compare against; and the server's
 * un-labelled Prometheus counters.
 */
import type { ChildProcess } from "node:child_process"
import { spawnReady, startLineChild } from "../lib/children.ts"
import type { makeResources } from "../lib/resources.ts"
import { SERVER_NODE_OPTIONS } from "../lib/serverNodeOptions.ts"
import { CHUNK_TOKENS } from "../lib/kvChunks.ts"
import { L1_SIZE_GB, PROBE_TIMEOUT_MS, READY_TIMEOUT_MS } from "./shape.ts"

/** The bench's resources (children, sockets, cleanup). */
export type Resources = ReturnType<typeof makeResources>

/** Event-loop delay over a window, ms beyond the sampler's period. */
export interface LoopDelay {
  readonly p50: number
  readonly p99: number
  readonly max: number
}

export const NO_DELAY: LoopDelay = { p50: Number.NaN, p99: Number.NaN, max: Number.NaN }

export interface Server {
  readonly child: ChildProcess
  readonly pid: number
  readonly httpUrl: string
  /** The tail of its output, for error messages. */
  readonly tail: () => string
  /** WARN/ERROR log lines so far and the first few of them. */
  readonly warnings: { count: number; readonly first: Array<string> }
  /** The server's event-loop delay since the previous call (SIGUSR2 to bench/transfer/loop-delay.ts). */
  readonly loopDelay: () => Promise<LoopDelay>
  /** Rejects when the server exits: race anything that waits on it against this. */
  readonly exited: Promise<never>
}

/**
 * Starts `mpcache serve` on `endpoint` (a V8 CPU profile into `serverProfDir` when given); resolves once
 * both the MQ and the HTTP frontends listen. `spawned` gets the child at once, so that a start that fails
 * can still be stopped.
 */
export const startServer = async (
  endpoint: string,
  serverProfDir: string | undefined,
  resources: Resources,
  spawned: (child: ChildProcess) => void
): Promise<Server> => {
  const argv = [
    ...SERVER_NODE_OPTIONS,
    ...(serverProfDir === undefined ? [] : ["--cpu-prof", `--cpu-prof-dir=${serverProfDir}`]),
    "--import",
    "./bench/transfer/loop-delay.ts",
    "src/cli/main.ts",
    "serve",
    "--endpoint",
    endpoint,
    "--http-port",
    "0",
    "--l1-size-gb",
    String(L1_SIZE_GB),
    "--chunk-size",
    String(CHUNK_TOKENS),
    "--log-format",
    "json"
  ]
  const child = startLineChild("mpcache server", argv, resources.children)
  spawned(child.process)
  const warnings = { count: 0, first: [] as Array<string> }
  const exited = child.exited.then(({ code, signal }): never => {
    throw new Error(`the mpcache server exited (code ${code}, signal ${signal}); output:\n${child.tail()}`)
  })
  exited.catch(() => {}) // observed where it is raced
  const delayWaiters: Array<(d: LoopDelay) => void> = []
  const loopDelay = (): Promise<LoopDelay> =>
    new Promise((done) => {
      const waiter = (d: LoopDelay) => {
        clearTimeout(giveUp)
        done(d)
      }
      const giveUp = setTimeout(() => {
        delayWaiters.splice(delayWaiters.indexOf(waiter), 1)
        done(NO_DELAY)
      }, PROBE_TIMEOUT_MS)
      delayWaiters.push(waiter)
      if (!child.process.kill("SIGUSR2")) waiter(NO_DELAY)
    })
  child.onLine((line) => {
    if (line.startsWith("{\"bench_loop_delay\"")) {
      const d = (JSON.parse(line) as { bench_loop_delay: { p50_ms: number; p99_ms: number; max_ms: number } }).bench_loop_delay
      delayWaiters.shift()?.({ p50: d.p50_ms, p99: d.p99_ms, max: d.max_ms })
      return
    }
    if (/"level":"(WARN|WARNING|ERROR|FATAL)"/.test(line)) {
      warnings.count++
      if (warnings.first.length < 5) warnings.first.push(line.slice(0, 400))
    }
  })
  const [, http] = await Promise.all([
    child.waitFor(/MQ server listening on/, READY_TIMEOUT_MS),
    child.waitFor(/HTTP frontend listening on (http:\/\/[^\s"]+)/, READY_TIMEOUT_MS)
  ])
  const pid = child.process.pid
  if (pid === undefined) throw new Error(`the mpcache server has no pid; output:\n${child.tail()}`)
  return { child: child.process, pid, httpUrl: http[1]!, tail: child.tail, warnings, loopDelay, exited }
}

/** Starts bench/lib/echo-router.ts on `echoEndpoint`; resolves once it listens. */
export const startEcho = async (echoEndpoint: string, resources: Resources): Promise<void> => {
  await spawnReady("echo router", ["bench/lib/echo-router.ts", echoEndpoint], "echo router listening on", READY_TIMEOUT_MS, resources.children)
}

/** Un-labelled Prometheus samples of the server; a counter never updated yet is absent and reads 0. */
export const metrics = async (s: Server, names: ReadonlyArray<string>): Promise<Record<string, number>> => {
  const text = await (await fetch(`${s.httpUrl}/metrics`)).text()
  const out: Record<string, number> = {}
  for (const name of names) {
    const line = text.split("\n").find((l) => l.startsWith(`${name} `))
    out[name] = line === undefined ? 0 : Number(line.slice(line.lastIndexOf(" ") + 1))
  }
  return out
}
