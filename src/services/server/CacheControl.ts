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
  /**
   * For tests: an in-memory cache of `cache.unlocked` objects free to drop
   * and `cache.locked` ones locked or being written; CLEAR drops the first
   * (and with `force` the second), records its `force` in `cache.clears` and
   * answers how many it dropped, as the L1 store does.
   */
  static readonly layerTest = (cache: MemoryCache = { unlocked: 0, locked: 0, clears: [] }) =>
    Layer.succeed(this, {
      clear: (force) =>
        Effect.sync(() => {
          cache.clears.push(force)
          const dropped = cache.unlocked + (force ? cache.locked : 0)
          cache.unlocked = 0
          if (force) cache.locked = 0
          return dropped
        })
    })
}

/** The state of {@link CacheControl.layerTest}: objects held and every CLEAR's `force`. */
export interface MemoryCache {
  unlocked: number
  locked: number
  readonly clears: Array<boolean>
}
