/**
 * Connection events of the server's ROUTER (DESIGN §5 "Connection loss"):
 * with ZMQ_ROUTER_NOTIFY on, the ROUTER reports each client connection
 * (routing id) when it connects and again when it disconnects. The liveness
 * module listens to mark instances `suspect`; until then nothing does.
 */
import { Context, Effect, Layer } from "effect"

/** Listener for ROUTER connect/disconnect notifications. Called on the receive loop: keep it quick. */
export class PeerEvents extends Context.Service<PeerEvents, {
  /** A peer (routing id, hex) connected. */
  readonly connected: (peer: string) => Effect.Effect<void>
  /** A peer's connection is gone (closed socket or dead process on loopback/ipc). */
  readonly disconnected: (peer: string) => Effect.Effect<void>
}>()("mpcache/services/PeerEvents") {
  /** Nobody listens. */
  static readonly layerNoop = Layer.succeed(this, {
    connected: () => Effect.void,
    disconnected: () => Effect.void
  })
}
