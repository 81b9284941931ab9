#!/usr/bin/env node
// @ts-check
/**
 * A liveness probe written against the public entry points only: PINGs an
 * mpcache server as an untracked prober and prints its chunk size.
 *
 *   node ping.mjs [endpoint]        (default tcp://127.0.0.1:5555)
 *
 * stdout (exit 0):   ping: true
 *                    chunk size: 256 tokens
 * On failure (no server within 5 s, a wire error) it prints the error on
 * stderr and exits 1.
 *
 * Plain JavaScript (ESM) on purpose: Node runs it from anywhere, also from
 * node_modules/mpcache/examples/, where it never strips TypeScript types.
 * `// @ts-check` still type-checks it against the package's declarations.
 */
import { Effect, Layer, Logger } from "effect"
import { makeMqClient, ZmqSocketsLive } from "mpcache/client"
import { GetChunkSize, Ping } from "mpcache/schema"

const endpoint = process.argv[2] ?? "tcp://127.0.0.1:5555"

const program = Effect.gen(function*() {
  const client = yield* makeMqClient({ endpoint, requestTimeoutMs: 5_000 })
  // instance_id nil: an untracked prober, so the server tracks nothing for it.
  const alive = yield* client.request(Ping, [null])
  const chunkSize = yield* client.request(GetChunkSize, [])
  return [`ping: ${alive}`, `chunk size: ${chunkSize} tokens`]
})

// A probe needs sockets only (no native memory); logs go to stderr so stdout holds just the result.
const live = Layer.mergeAll(ZmqSocketsLive, Layer.succeed(Logger.LogToStderr, true))

Effect.runPromise(program.pipe(Effect.scoped, Effect.provide(live))).then(
  (lines) => process.stdout.write(`${lines.join("\n")}\n`),
  (error) => {
    process.stderr.write(`ping failed: ${String(error)}\n`)
    process.exitCode = 1
  }
)
