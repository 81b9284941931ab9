/**
 * Which peers are connected to the MQ server's ROUTER (DESIGN §5 "Connection loss"), told by ZMQ_ROUTER_NOTIFY and
 * confirmed by probes.
 *
 * ROUTER_NOTIFY's connect and disconnect notifications are both a lone empty frame, and a peer can send that frame
 * itself (a buggy client, or one that wants a live worker reaped: issue 14). The connect comes before anything the
 * peer sends, so the first one from a routing id is the connect; a later one is the disconnect only if the peer is
 * really gone, which probes tell, off the receive loop: the disconnect notification travels through the peer's
 * pipe before libzmq tears the pipe down, so right after it a probe may still be delivered into the dying pipe; the
 * probe is repeated over about a second ({@link PROBE_DELAYS_MS}) and one EHOSTUNREACH means gone. A live peer
 * answers every probe (and receives those empty frames, which clients ignore). At most one probe sequence per
 * peer runs at a time.
 */
import { Effect, Metric, type Scope } from "effect"
import type { PeerEvents } from "../../liveness/PeerEvents.ts"
import * as M from "../ServerMetrics.ts"

/** When the probes of one ambiguous empty frame are sent, ms after it. */
export const PROBE_DELAYS_MS: ReadonlyArray<number> = [0, 10, 50, 200, 800]

/** What the connected-peer set needs of the MQ server. */
export interface ConnectedPeersOptions {
  /** One probe of `routingId`'s connection (ReplyOutbox's `probe`): false only for EHOSTUNREACH. */
  readonly probe: (routingId: Uint8Array) => Promise<boolean>
  /** Told of each connect and confirmed disconnect. */
  readonly events: PeerEvents["Service"]
  /** Drops the server's own state of a peer whose disconnect is confirmed (its lane, its outbox, its admission). */
  readonly forget: (peer: string) => void
  /** Drops a lone empty frame that is no notification, with one WARNING naming `why`, and counts it. */
  readonly drop: (peer: string, why: string) => Effect.Effect<void>
}

/** The connected peers of one MQ server. */
export interface ConnectedPeers {
  /**
   * A lone empty frame from `routingId` (`peer`: its hex): the connect when the peer is not connected, else probed
   * (in the background, in the Scope the set was made in) and then either the disconnect or dropped. Never fails.
   */
  readonly emptyFrame: (routingId: Uint8Array, peer: string) => Effect.Effect<void>
  /** Whether the peer (routing id, hex) is connected. */
  readonly has: (peer: string) => boolean
  /** Peers connected now. */
  readonly size: () => number
}

/** An empty set of connected peers; its probe sequences run in the current Scope. */
export const makeConnectedPeers = (options: ConnectedPeersOptions): Effect.Effect<ConnectedPeers, never, Scope.Scope> =>
  Effect.gen(function*() {
    const scope = yield* Effect.scope
    const connected = new Set<string>()
    // Peers whose connection is being probed.
    const probing = new Set<string>()

    /** Whether the connection of `routingId` is still up: every probe over PROBE_DELAYS_MS answered. */
    const stillConnected = (routingId: Uint8Array): Effect.Effect<boolean> =>
      Effect.gen(function*() {
        for (const delayMs of PROBE_DELAYS_MS) {
          if (delayMs > 0) yield* Effect.sleep(delayMs)
          if (!(yield* Effect.promise(() => options.probe(routingId)))) return false
        }
        return true
      })

    /** The peer's connection is gone (a confirmed ROUTER_NOTIFY disconnect): its lane and its bindings go. */
    const disconnected = (peer: string): Effect.Effect<void> => {
      if (!connected.delete(peer)) return Effect.void
      options.forget(peer)
      return Metric.update(M.connectedPeers, connected.size).pipe(
        Effect.andThen(Effect.logDebug("peer disconnected").pipe(Effect.annotateLogs({ peer }))),
        Effect.andThen(options.events.disconnected(peer))
      )
    }

    const emptyFrame = (routingId: Uint8Array, peer: string): Effect.Effect<void> => {
      if (connected.has(peer)) {
        if (probing.has(peer)) return options.drop(peer, "a lone empty frame from a connected peer while its connection is being probed")
        probing.add(peer)
        return stillConnected(routingId).pipe(
          Effect.flatMap((alive) =>
            alive
              ? options.drop(peer, "a lone empty frame from a connected peer is not a ROUTER notification (its connection answered every probe)")
              : disconnected(peer)
          ),
          Effect.ensuring(Effect.sync(() => probing.delete(peer))),
          Effect.forkIn(scope),
          Effect.asVoid
        )
      }
      connected.add(peer)
      return Metric.update(M.connectedPeers, connected.size).pipe(
        Effect.andThen(Effect.logDebug("peer connected").pipe(Effect.annotateLogs({ peer }))),
        Effect.andThen(options.events.connected(peer))
      )
    }

    return { emptyFrame, has: (peer) => connected.has(peer), size: () => connected.size }
  })
