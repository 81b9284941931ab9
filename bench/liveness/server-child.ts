/**
 * Child program of bench:liveness (part 2, PING latency while the reaper
 * scans): an in-process MQ server (the real MqServer, handler table,
 * management module, connection tracker and request barrier, assembled like
 * test/support/TestServer.ts `bareServer`) whose management module drives a
 * LivenessTarget around an InstanceRegistry holding `--n` fresh contexts.
 *
 *   node bench/liveness/server-child.ts --endpoint ipc:///tmp/x.sock --n 100000
 *
 * Once listening it prints `{"ready":true,"endpoint":…,"pingId":"<decimal>"}`
 * on stdout (pingId: one of the tracked ids, for named PINGs). Then, on
 * stdin, one command a line:
 *
 * - `scan on`: runs `Reaper.scan(now)` back to back — one scan, one turn
 *   of the event loop (so the socket and the handlers get to run), the next
 *   scan — until the next command arrives, then prints
 *   `{"scans":k,"scanMs":[…]}`;
 * - `scan every MS`: the same, one scan every MS ms on a fixed grid (the
 *   reaper's own loop, at a chosen period);
 * - `quit` (or end of input): shuts the server down and exits.
 *
 * Logs go to stderr as JSON, like the server's. The configured windows are
 * long (bench/liveness/fixture.ts WINDOWS), so the management module's own
 * reaper never scans during a run and every entry stays fresh.
 */
import { layerTestBare } from "../../src/layers/Server.ts"
import { createInterface } from "node:readline"
import { parseArgs } from "node:util"
import { NodeRuntime } from "@effect/platform-node"
import { Effect } from "effect"
import { loggerLayer } from "../../src/layers/Logging.ts"
import { formatInstanceId } from "../../src/schema/InstanceId.ts"
import { Reaper } from "../../src/services/liveness/Reaper.ts"
import { MqServer } from "../../src/services/server/MqServer.ts"
import { fillRegistry, nextTurn, registryTarget, WINDOWS } from "./fixture.ts"

const { values: args } = parseArgs({
  options: { endpoint: { type: "string" }, n: { type: "string", default: "100000" } }
})
if (args.endpoint === undefined) {
  process.stderr.write("--endpoint is required\n")
  process.exit(2)
}
const endpoint = args.endpoint
const n = Number(args.n)

// Commands from stdin, handed to the program one at a time.
const commands: Array<string> = []
let wake: (() => void) | undefined
const input = createInterface({ input: process.stdin })
input.on("line", (line) => {
  commands.push(line.trim())
  wake?.()
})
input.on("close", () => {
  commands.push("quit")
  wake?.()
})
const nextCommand = (): Promise<string> =>
  new Promise((resolve) => {
    const take = () => {
      wake = undefined
      resolve(commands.shift()!)
    }
    if (commands.length > 0) take()
    else wake = take
  })

const say = (line: Record<string, unknown>) => Effect.sync(() => void process.stdout.write(`${JSON.stringify(line)}\n`))

const program = Effect.gen(function*() {
  const filled = yield* fillRegistry(n)
  const target = registryTarget(filled.registry)

  const server = layerTestBare({
    config: { endpoint, ...WINDOWS },
    plugins: [{ name: target.name, rows: [], target }]
  })

  yield* Effect.gen(function*() {
    const reaper = yield* Reaper
    const mq = yield* MqServer
    yield* say({ ready: true, endpoint: mq.endpoint, pingId: formatInstanceId(filled.ids[0]!), tracked: n })
    while (true) {
      const command = yield* Effect.promise(nextCommand)
      if (command === "quit") break
      const every = command.match(/^scan every (\d+)$/)
      if (command !== "scan on" && every === null) continue
      const periodMs = every === null ? 0 : Number(every[1])
      const scanMs: Array<number> = []
      let due = Date.now() + periodMs
      while (commands.length === 0) {
        if (periodMs > 0) {
          // On a fixed grid, like the reaper's loop.
          const wait = due - Date.now()
          if (wait > 0) yield* Effect.sleep(wait)
          if (commands.length > 0) break
          due += periodMs
        }
        const t0 = performance.now()
        // Uninterruptible like the reaper's own scans.
        yield* Effect.uninterruptible(reaper.scan(Date.now()))
        scanMs.push(performance.now() - t0)
        if (periodMs === 0) yield* nextTurn
      }
      yield* say({ scans: scanMs.length, scanMs })
    }
  }).pipe(Effect.provide(server))
})

NodeRuntime.runMain(program.pipe(Effect.provide(loggerLayer("json"))))
