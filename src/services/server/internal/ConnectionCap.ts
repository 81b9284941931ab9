/**
 * The cap on concurrent ZeroMQ connections (issue 24 item 11, `--max-zmq-connections`, DescriptorBudget.ts).
 *
 * libzmq accepts every connection its listener sees and tells the server only through the ROUTER's monitor
 * (`accept`, `disconnect`: every accepted connection ends with one), so a local user opening idle TCP connections
 * could take every descriptor the process has. The server counts them from those events; from three quarters of
 * the cap on, each accept schedules a scan of its accepted sockets (/proc/self/fd, off the event loop, at most one
 * at a time), which tells connections apart by the order it first saw them; above the cap the newest are shut
 * down (libzmq then closes them), counted and logged — at most one WARNING per {@link CAP_LOG_INTERVAL_MS}.
 */
import { Effect, Metric } from "effect"
import type { Scope } from "effect"
import type { AcceptedSocket } from "../../../native/OwnSockets.ts"
import { connectionsRefusedTotal } from "../ServerMetrics.ts"
import { makeWarnWindow } from "./WarnWindow.ts"

/** At most one WARNING about refused connections in this many ms. */
export const CAP_LOG_INTERVAL_MS = 10_000

/** What the cap needs of the system: the accepted sockets on its listener's address, and a way to end one. */
export interface ConnectionCapIo {
  readonly scan: Effect.Effect<ReadonlyArray<AcceptedSocket>, unknown>
  readonly shutdown: (socket: AcceptedSocket) => boolean
}

/** The cap of one listener. */
export interface ConnectionCap {
  /** The ROUTER's monitor saw a connection accepted (a scan may start, in the background). */
  readonly accepted: Effect.Effect<void>
  /** The ROUTER's monitor saw an accepted connection end. */
  readonly ended: Effect.Effect<void>
  /** For `/api/status`: connections open now, the cap, connections refused since start. */
  readonly stats: () => { readonly connections: number; readonly max: number; readonly refused: number }
}

/**
 * The cap of `max` connections for `listener` (a name for logs and metrics, e.g. "zmq"). Scans run as fibers of
 * the caller's scope.
 */
export const makeConnectionCap = (listener: string, max: number, io: ConnectionCapIo): Effect.Effect<ConnectionCap, never, Scope.Scope> =>
  Effect.gen(function*() {
    const scope = yield* Effect.scope
    const services = yield* Effect.context<never>()
    const refusedMetric = Metric.withAttributes(connectionsRefusedTotal, { listener, reason: "cap" })
    let open = 0
    let refused = 0
    let scanning = false
    let again = false
    const warnings = makeWarnWindow(CAP_LOG_INTERVAL_MS)
    // The order in which scans first saw each socket (by inode): the highest are the newest.
    const seenAt = new Map<number, number>()
    let seq = 0

    // Sockets shut down but not yet closed by libzmq: they no longer count, and are never shut down twice.
    const shutDown = new Set<number>()

    const trim = (listed: ReadonlyArray<AcceptedSocket>): Effect.Effect<void> => {
      const present = new Set(listed.map((s) => s.inode))
      for (const inode of seenAt.keys()) if (!present.has(inode)) seenAt.delete(inode)
      for (const inode of shutDown) if (!present.has(inode)) shutDown.delete(inode)
      const sockets = listed.filter((s) => !shutDown.has(s.inode))
      // Sockets first seen by one scan share its number; among them a higher descriptor is the likelier newer one
      // (accept takes the lowest free descriptor, and the older ones were taken first).
      seq++
      for (const s of sockets) if (!seenAt.has(s.inode)) seenAt.set(s.inode, seq)
      const excess = sockets.length - max
      if (excess <= 0) return Effect.void
      const newest = [...sockets].sort((a, b) => seenAt.get(b.inode)! - seenAt.get(a.inode)! || b.fd - a.fd).slice(0, excess)
      let shut = 0
      for (const s of newest) {
        if (io.shutdown(s)) {
          shut++
          shutDown.add(s.inode)
        }
      }
      if (shut === 0) return Effect.void
      refused += shut
      refusedMetric.updateUnsafe(shut, services)
      return warnings.warn(
        "cap",
        `${listener}: ${shut} connection(s) closed at once: ${sockets.length} were open, the cap is ${max} (--max-${listener}-connections); ${refused} since start`,
        shut
      )
    }

    const scanNow: Effect.Effect<void> = Effect.gen(function*() {
      do {
        again = false
        const sockets = yield* io.scan.pipe(
          Effect.catchCause((cause) => Effect.as(Effect.logError(`${listener}: cannot list the accepted connections`, cause), undefined))
        )
        if (sockets !== undefined) yield* trim(sockets)
      } while (again)
    }).pipe(Effect.ensuring(Effect.sync(() => {
      scanning = false
    })))

    return {
      accepted: Effect.suspend(() => {
        open++
        if (open * 4 <= max * 3) return Effect.void
        if (scanning) {
          again = true
          return Effect.void
        }
        scanning = true
        return Effect.asVoid(Effect.forkIn(scanNow, scope))
      }),
      ended: Effect.sync(() => {
        open = Math.max(0, open - 1)
      }),
      stats: () => ({ connections: open, max, refused })
    }
  })
