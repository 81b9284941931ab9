/**
 * A real MQ server on an ephemeral loopback port, with a real client aimed
 * at it, for integration tests. Extra modules (test doubles of later
 * modules) join the handler table as plugins.
 */
import { Effect, Layer } from "effect"
import { MqSideLive, PluginModules } from "../../src/layers/Server.ts"
import { ZmqSocketsLive } from "../../src/layers/Zmq.ts"
import { ServerConfig, type ServerConfigInput } from "../../src/services/server/ServerConfig.ts"
import { CacheControl } from "../../src/services/server/CacheControl.ts"
import { makeTable, type ServerModule } from "../../src/services/server/Handler.ts"
import { LivenessTargets } from "../../src/services/liveness/LivenessTarget.ts"
import { Management } from "../../src/services/server/Management.ts"
import { MqClient } from "../../src/services/client/MqClient.ts"
import { Handlers, MqServer } from "../../src/services/server/MqServer.ts"
import { Connections } from "../../src/services/liveness/Connections.ts"
import { RequestBarrier } from "../../src/services/liveness/RequestBarrier.ts"

export interface TestServerOptions {
  readonly config?: Partial<ServerConfigInput>
  readonly modules?: ReadonlyArray<ServerModule>
  /** Client request timeout; default 5,000 ms. */
  readonly requestTimeoutMs?: number
}

/** MqServer + modules + an MqClient connected to it. */
export const testServer = (options: TestServerOptions = {}) => {
  const server = MqSideLive.pipe(
    Layer.provideMerge(ServerConfig.layerTest({ endpoint: "tcp://127.0.0.1:*", ...options.config })),
    Layer.provide(Layer.succeed(PluginModules, options.modules ?? []))
  )
  const client = Layer.unwrap(
    Effect.gen(function*() {
      const s = yield* MqServer
      return MqClient.layer({ endpoint: s.endpoint, requestTimeoutMs: options.requestTimeoutMs ?? 5_000 })
    })
  )
  return client.pipe(Layer.provideMerge(server))
}

/**
 * A server with only the management module and `modules` in its handler
 * table (no data path), plus a client: for dispatch tests whose test
 * modules serve ops the real modules also serve.
 */
export const bareServer = (options: { readonly modules: ReadonlyArray<ServerModule>; readonly config?: Partial<ServerConfigInput> }) => {
  const handlers = Layer.effect(
    Handlers,
    Effect.gen(function*() {
      const management = yield* Management
      return yield* makeTable([management.module, ...options.modules])
    })
  )
  const server = Layer.unwrap(
    Effect.gen(function*() {
      const config = yield* ServerConfig
      return MqServer.layer({ endpoint: config.endpoint, normalWorkers: config.maxCpuWorkers, affinityLanes: config.maxGpuWorkers })
    })
  ).pipe(
    Layer.provide(Connections.layerPeerEvents),
    Layer.provideMerge(handlers),
    Layer.provideMerge(Management.layer),
    Layer.provideMerge(Connections.layer),
    Layer.provideMerge(Layer.mergeAll(LivenessTargets.layerEmpty, CacheControl.layerEmpty, RequestBarrier.layer)),
    Layer.provideMerge(ServerConfig.layerTest({ endpoint: "tcp://127.0.0.1:*", ...options.config })),
    Layer.provideMerge(ZmqSocketsLive)
  )
  const client = Layer.unwrap(
    Effect.gen(function*() {
      const s = yield* MqServer
      return MqClient.layer({ endpoint: s.endpoint })
    })
  )
  return client.pipe(Layer.provideMerge(server))
}
