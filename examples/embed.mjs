#!/usr/bin/env node
// @ts-check
/**
 * An mpcache server embedded in this program's own process, from the
 * `mpcache/server` entry point: the configuration validated as `mpcache serve`
 * validates its flags, the server started, PINGed through `mpcache/client`,
 * and stopped.
 *
 *   node embed.mjs [endpoint]           start, PING itself, stop; exit 0
 *   node embed.mjs [endpoint] --serve   serve until SIGINT/SIGTERM, then drain and exit 0
 *
 * (default endpoint ipc://$TMPDIR/mpcache-embed-<pid>.sock). stdout, the first form:
 *                    listening on <endpoint>
 *                    ping: true
 *                    stopped
 * The server's own log lines go to stderr. A configuration that breaks a rule
 * prints each broken rule (`--flag: what it must be`) and exits 2; a server that
 * cannot start (the L1 pool, the endpoint) prints why and exits 1.
 */
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Cause, Effect, Exit, Fiber, Layer } from "effect"
import { makeMqClient, ZmqSocketsLive } from "mpcache/client"
import { Ping } from "mpcache/schema"
import { defaults, formatIssue, launchLogged, loggerLayer, ServerLive, validate } from "mpcache/server"

const args = process.argv.slice(2)
const serve = args.includes("--serve")
const endpoint = args.find((a) => !a.startsWith("--")) ?? `ipc://${join(tmpdir(), `mpcache-embed-${process.pid}.sock`)}`

// The same defaults and rules as `mpcache serve`'s flags; the HTTP frontend on a free port.
const result = validate({ ...defaults, endpoint, httpPort: 0, l1SizeGb: 0.25, l1Prefault: false })
if ("issues" in result) {
  process.stderr.write(`${result.issues.map(formatIssue).join("\n")}\n`)
  process.exit(2)
}
const server = ServerLive(result.config)
const logs = loggerLayer("pretty")

const fail = (/** @type {unknown} */ error) => {
  process.stderr.write(`embedded server failed: ${String(error)}\n`)
  process.exitCode = 1
}

if (serve) {
  // Runs until interrupted; the interrupt drains in-flight requests and runs every finalizer.
  const fiber = Effect.runFork(launchLogged(server).pipe(Effect.provide(logs)))
  for (const signal of /** @type {const} */ (["SIGINT", "SIGTERM"])) {
    process.once(signal, () => void Effect.runFork(Fiber.interrupt(fiber)))
  }
  Effect.runPromise(Fiber.await(fiber)).then((exit) => {
    if (Exit.isFailure(exit) && !Cause.hasInterruptsOnly(exit.cause)) fail(Cause.pretty(exit.cause))
  })
} else {
  const program = Effect.gen(function*() {
    // The server lives as long as this scope: built here, released (drained, every finalizer run) when it closes.
    yield* Layer.build(server)
    const lines = [`listening on ${endpoint}`]
    const client = yield* makeMqClient({ endpoint, requestTimeoutMs: 5_000 })
    lines.push(`ping: ${yield* client.request(Ping, [null])}`)
    return lines
  })
  Effect.runPromise(program.pipe(Effect.scoped, Effect.provide(ZmqSocketsLive), Effect.provide(logs))).then(
    (lines) => process.stdout.write(`${[...lines, "stopped"].join("\n")}\n`),
    fail
  )
}
