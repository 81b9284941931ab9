/**
 * The reference server of bench:ping (`bench/ping/ping.ts`, `bench/ping/profile.ts`) and of bench:transfer's PING probe: a bare zeromq.js ROUTER that sends
 * every message straight back ([routingId, ...frames]) without decoding it,
 * i.e. the ceiling of this stack (Node + zeromq.js + libzmq).
 *
 * Usage: node bench/lib/echo-router.ts ENDPOINT
 * Prints "echo router listening on ENDPOINT" to stderr once bound; stops on
 * SIGTERM/SIGINT.
 */
import { Router } from "zeromq"

const endpoint = process.argv[2]
if (endpoint === undefined) {
  process.stderr.write("usage: node bench/lib/echo-router.ts ENDPOINT\n")
  process.exit(2)
}

const router = new Router({ linger: 0 })
await router.bind(endpoint)
process.stderr.write(`echo router listening on ${endpoint}\n`)

const stop = (): void => router.close()
process.once("SIGTERM", stop)
process.once("SIGINT", stop)

try {
  for await (const msg of router) await router.send(msg)
} catch (error) {
  if (!router.closed) throw error // a send cut short by stop() is expected
}
