/**
 * A raw TCP client for the listener attacks of issue 24 item 11: a connection that sends what the test writes
 * (or nothing), keeps what it receives, and tells when the server closed it.
 */
import { connect, type Socket } from "node:net"
import { Effect, Scope } from "effect"

/** One raw connection: its socket, what it received (latin1), and a promise of its close. */
export interface RawTcpConnection {
  readonly socket: Socket
  readonly received: () => string
  readonly closed: Promise<void>
}

/** Connects to 127.0.0.1:`port`; resolves once connected. The caller destroys it. */
export const connectRawTcp = (port: number): Effect.Effect<RawTcpConnection> =>
  Effect.promise(() =>
    new Promise<RawTcpConnection>((resolve, reject) => {
      const socket = connect(port, "127.0.0.1")
      let received = ""
      socket.on("data", (d: Buffer) => (received += d.toString("latin1")))
      socket.on("error", () => {})
      const closed = new Promise<void>((done) => socket.once("close", () => done()))
      socket.once("connect", () => resolve({ socket, received: () => received, closed }))
      socket.once("error", reject)
    })
  )

/** {@link connectRawTcp}, destroyed when the scope closes. */
export const rawTcpConnection = (port: number): Effect.Effect<RawTcpConnection, never, Scope.Scope> =>
  Effect.acquireRelease(connectRawTcp(port), (c) => Effect.sync(() => c.socket.destroy()))

/** Waits for `promise`, failing after `ms` (a bound on a hang, not a timing). */
export const within = <A>(promise: Promise<A>, ms: number, what: string): Effect.Effect<A> =>
  Effect.promise(() => Promise.race([promise, new Promise<never>((_, reject) => setTimeout(() => reject(new Error(`timed out: ${what}`)), ms))]))
