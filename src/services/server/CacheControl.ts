/**
 * What CLEAR acts on (DESIGN §3.1 op 20): the storage behind the server.
 * The L1 store provides the real implementation; `layerEmpty` is a server
 * without storage (nothing to clear).
 */
import { Context, Effect, Layer } from "effect"

export class CacheControl extends Context.Service<CacheControl, {
  /**
   * Drops cached objects. `force = false` keeps objects that are locked or
   * being written (upstream's newer non-force default); `force = true` drops
   * those too. Returns the number of objects dropped.
   */
  readonly clear: (force: boolean) => Effect.Effect<number>
}>()("mpcache/services/CacheControl") {
  static readonly layerEmpty = Layer.succeed(this, { clear: () => Effect.succeed(0) })
}
