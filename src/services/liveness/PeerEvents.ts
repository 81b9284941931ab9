/**
 * Connection events of the server's ROUTER (DESIGN §5 "Connection loss"):
 * with ZMQ_ROUTER_NOTIFY on, the ROUTER reports each client connection
 * (routing id) when it connects and again when it disconnects; and after
 * every successful request that names an instance id, the MQ server says
 * which routing id it came from. The connection tracker listens.
 */
import { Context, Effect, Layer } from "effect"
import type { InstanceId } from "../../schema/InstanceId.ts"

/** Listener for the MQ server's connection events. Called on the receive loop or a pool: keep it quick. */
export class PeerEvents extends Context.Service<PeerEvents, {
  /** A peer (routing id, hex) connected. */
  readonly connected: (peer: string) => Effect.Effect<void>
  /** A peer's connection is gone (closed socket or dead process on loopback/ipc). */
  readonly disconnected: (peer: string) => Effect.Effect<void>
  /** A request from `peer` naming instance `id` succeeded (an error reply binds nothing). */
  readonly instanceMessage: (peer: string, id: InstanceId) => Effect.Effect<void>
  /**
   * Whether `instanceMessage(peer, id)` would change nothing now: `peer` is bound to `id` already, or is not
   * connected (it binds nothing). Synchronous: the MQ server's fast path answers a named PING on the receive
   * loop only then, and skips `instanceMessage` (issue 25 item 4).
   */
  readonly isBound: (peer: string, id: InstanceId) => boolean
}>()("mpcache/services/PeerEvents") {
  /** Nobody listens. */
  static readonly layerNoop = Layer.succeed(this, {
    connected: () => Effect.void,
    disconnected: () => Effect.void,
    instanceMessage: () => Effect.void,
    isBound: () => true
  })

  /**
   * A recording fake for tests of what feeds PeerEvents (the MQ server):
   * each call is pushed to `events` as `connected <peer>`, `disconnected
   * <peer>` or `instance <peer> <id>`; `isBound(peer, id)` is true once an
   * `instanceMessage(peer, id)` was recorded since `peer` last connected.
   */
  static readonly layerTest = (events: Array<string>) =>
    Layer.sync(this, () => {
      const bound = new Map<string, Set<InstanceId>>()
      return {
        connected: (peer) => Effect.sync(() => {
          events.push(`connected ${peer}`)
          bound.set(peer, new Set())
        }),
        disconnected: (peer) => Effect.sync(() => {
          events.push(`disconnected ${peer}`)
          bound.delete(peer)
        }),
        instanceMessage: (peer, id) => Effect.sync(() => {
          events.push(`instance ${peer} ${id}`)
          bound.get(peer)?.add(id)
        }),
        isBound: (peer, id) => bound.get(peer)?.has(id) ?? false
      }
    })
}
