/**
 * Child program of `bench:ping --flood` and test/e2e/pingFlood.test.ts: the attacker of issue 27 item 1. Opens
 * `dealers` raw DEALERs to ENDPOINT, each with a receive high-water mark of 1 and a 4 KiB kernel receive buffer,
 * and has each send `pings` nil PINGs as fast as its pipe takes them (`pings` 0: until it is stopped). It never
 * reads a reply, so the server's replies to it pile up in its pipe and then in the server's outbox.
 *
 * Prints JSON lines on stdout: `{"flooding":N}` once every DEALER has sent its first PING, `{"sent":N}` every
 * 10,000 PINGs of all DEALERs, `{"done":N,"seconds":S}` when all are sent. Then it keeps its connections open
 * (still reading nothing) until it gets SIGTERM or SIGINT; then it prints `{"stopped":N,"seconds":S}` (the PINGs
 * the server's sockets had taken by then, and the seconds since the first) and exits 0.
 *
 *   node bench/ping/flooder.ts ENDPOINT DEALERS PINGS
 */
import { Dealer } from "zeromq"
import { pack } from "../../src/schema/Frame.ts"
import { pingTail } from "../lib/pingClient.ts"

const [endpoint, dealersText, pingsText] = process.argv.slice(2)
const dealers = Number(dealersText)
const pings = Number(pingsText)
if (endpoint === undefined || !Number.isInteger(dealers) || dealers < 1 || !Number.isInteger(pings) || pings < 0) {
  process.stderr.write("usage: node bench/ping/flooder.ts ENDPOINT DEALERS PINGS (DEALERS ≥ 1, PINGS ≥ 0; 0: until stopped)\n")
  process.exit(2)
}

const say = (line: Record<string, number>): void => void process.stdout.write(`${JSON.stringify(line)}\n`)
const sockets = Array.from({ length: dealers }, () => {
  const d = new Dealer({ linger: 0, receiveHighWaterMark: 1, receiveBufferSize: 4096 })
  d.connect(endpoint)
  return d
})
let stopped = false
let sent = 0
const t0 = process.hrtime.bigint()
const stop = (): void => {
  stopped = true
  say({ stopped: sent, seconds: Number(process.hrtime.bigint() - t0) / 1e9 })
  for (const s of sockets) s.close()
  process.exit(0)
}
process.once("SIGTERM", stop)
process.once("SIGINT", stop)
// Kept alive while it holds its connections after the last PING.
const keepAlive = setInterval(() => {}, 1 << 30)
void keepAlive

const tail = pingTail(null)
let started = 0
await Promise.all(sockets.map(async (d) => {
  for (let uid = 0; !stopped && (pings === 0 || uid < pings); uid++) {
    await d.send([pack(uid), ...tail])
    if (uid === 0 && ++started === dealers) say({ flooding: dealers })
    if (++sent % 10_000 === 0) say({ sent })
  }
}))
say({ done: sent, seconds: Number(process.hrtime.bigint() - t0) / 1e9 })
