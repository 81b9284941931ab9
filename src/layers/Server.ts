/**
 * The server assembly: configuration → modules → the merged handler table →
 * MQ server → HTTP frontend. Every module's rows are joined here in one
 * visible list; a duplicate op refuses to start.
 *
 * Teardown runs in reverse: HTTP stops, the MQ server stops receiving and
 * drains in-flight requests, then modules release their state.
 */
import { Context, Effect, Layer } from "effect"
import { CacheControl } from "../services/CacheControl.ts"
import { LivenessTargets } from "../services/LivenessTarget.ts"
import { Management } from "../services/Management.ts"
import { makeTable, type ServerModule } from "../services/Handler.ts"
import { Handlers, MqServer } from "../services/MqServer.ts"
import { PeerEvents } from "../services/PeerEvents.ts"
import { HttpLive, StartedAt, StatusBlocks } from "./Http.ts"
import { ServerConfig, type ServerConfigShape } from "./ServerConfig.ts"

/** Server modules and what they need. */
const ModulesLive = Management.layer.pipe(
  Layer.provide(Layer.mergeAll(LivenessTargets.layerEmpty, CacheControl.layerEmpty))
)

/**
 * Out-of-tree server modules (upstream: runtime plugins), joined after the
 * built-in ones. Empty unless a program provides some.
 */
export const PluginModules = Context.Reference<ReadonlyArray<ServerModule>>("mpcache/layers/PluginModules", {
  defaultValue: () => []
})

/** The merged handler table: one row list per module. */
const HandlersLive = Layer.effect(
  Handlers,
  Effect.gen(function*() {
    const management = yield* Management
    const plugins = yield* PluginModules
    return yield* makeTable([management.module, ...plugins])
  })
)

/** The MQ server on the configured endpoint and pools. */
const MqServerLive = Layer.unwrap(
  Effect.gen(function*() {
    const config = yield* ServerConfig
    return MqServer.layer({
      endpoint: config.endpoint,
      normalWorkers: config.maxCpuWorkers,
      affinityLanes: config.maxGpuWorkers
    })
  })
).pipe(Layer.provide(PeerEvents.layerNoop))

/**
 * The MQ side alone (no HTTP): what integration tests start. Exposes the
 * MqServer and the modules.
 */
export const MqSideLive = MqServerLive.pipe(
  Layer.provideMerge(HandlersLive),
  Layer.provideMerge(ModulesLive)
)

/** The whole server for `config`: MQ side plus HTTP frontend. */
export const ServerLive = (config: ServerConfigShape) =>
  HttpLive.pipe(
    Layer.provide(Layer.mergeAll(StatusBlocks.layerEmpty, StartedAt.layer)),
    Layer.provideMerge(MqSideLive),
    Layer.provideMerge(ServerConfig.layer(config))
  )
