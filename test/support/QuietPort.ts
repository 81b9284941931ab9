/**
 * Loopback TCP ports that no other test file takes by accident: below the
 * kernel's ephemeral range (`ip_local_port_range`, 32768–60999 here), so a
 * port-0 bind or an outgoing connection of a file running beside this one
 * never lands on a port a test checked and is about to bind (or rebind, as a
 * restarted server does). Ranges are split by owner so they never race each
 * other: 10000–19999 for single ports (`quietPort`), 20000–39999 for
 * RedisFleet's (P, P + 10000) node/cluster-bus pairs.
 */
import { createServer } from "node:net"

/** Whether `port` on 127.0.0.1 can be listened on now (it is closed again before this resolves). */
export const canBind = (port: number): Promise<boolean> =>
  new Promise<boolean>((resolve) => {
    const s = createServer()
    s.once("error", () => resolve(false))
    s.listen(port, "127.0.0.1", () => s.close(() => resolve(true)))
  })

const handedOut = new Set<number>()

/**
 * A port in 10000–19999 free now and not handed out before in this process.
 * Rejects after 500 tries (a machine whose whole range is taken).
 */
export const quietPort = async (): Promise<number> => {
  for (let i = 0; i < 500; i++) {
    const p = 10000 + Math.floor(Math.random() * 10000)
    if (handedOut.has(p)) continue
    if (await canBind(p)) {
      handedOut.add(p)
      return p
    }
  }
  throw new Error("quietPort: no free port in 10000–19999 after 500 tries")
}
