/**
 * A real MQ server on an ephemeral loopback port, with a real client aimed
 * at it, for integration tests. Extra modules (test doubles of later
 * modules) join the handler table as plugins.
 */
import { Effect, Layer } from "effect"
import { MqSideLive, PluginModules } from "../../src/layers/Server.ts"
import { ServerConfig, type ServerConfigInput } from "../../src/layers/ServerConfig.ts"
import type { ServerModule } from "../../src/services/Handler.ts"
import { MqClient } from "../../src/services/MqClient.ts"
import { MqServer } from "../../src/services/MqServer.ts"

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
