/**
 * Spawn → first reply (issue 16): a DEALER that retries its connection
 * every millisecond is connected to an ipc endpoint and has one PING [nil]
 * queued before the server is spawned; the time runs from `spawn()` to that
 * PING's reply. Measured for `mpcache serve` and for the plainest server
 * there is, `node -e` with a zeromq.js ROUTER bound that echoes (the floor:
 * Node's own start plus loading zeromq), alternately, in the same run.
 */
import { spawn } from "node:child_process"
import { Dealer } from "zeromq"
import { ROOT, stopChild, type Tracker } from "../lib/children.ts"
import { pingTail, readPingReply, type Responder } from "../lib/pingClient.ts"
import { pack } from "../../src/schema/Frame.ts"

/** The reference server: bind, then echo every message back. */
export const PLAIN_ECHO_SCRIPT =
  "const z=require('zeromq');const r=new z.Router({linger:0});r.bind(process.argv[1]).then(async()=>{for await(const m of r)await r.send(m)})"

const REPLY_TIMEOUT_MS = 30_000
const STOP_TIMEOUT_MS = 5_000

/**
 * Spawns `node ...argv` (the server of `responder`, bound to `endpoint`) and
 * resolves with the ms from the spawn to the first PING's reply; the child is
 * stopped (SIGTERM) before it resolves. Rejects when no reply comes in 30 s.
 */
export const spawnToFirstReply = async (
  argv: ReadonlyArray<string>,
  endpoint: string,
  responder: Responder,
  tracker: Tracker
): Promise<number> => {
  const dealer = new Dealer({ linger: 0, receiveTimeout: REPLY_TIMEOUT_MS, reconnectInterval: 1, reconnectMaxInterval: 1 })
  try {
    dealer.connect(endpoint)
    await dealer.send([pack(0), ...pingTail(null)])
    const t0 = performance.now()
    const child = spawn(process.execPath, argv, { cwd: ROOT, stdio: ["ignore", "ignore", "ignore"] })
    tracker.add(child)
    try {
      const reply = await dealer.receive()
      const ms = performance.now() - t0
      readPingReply(reply, responder)
      return ms
    } finally {
      await stopChild(child, STOP_TIMEOUT_MS)
      tracker.delete(child)
    }
  } finally {
    dealer.close()
  }
}
