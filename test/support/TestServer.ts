/**
 * A real MQ server on an ephemeral loopback port, with a real client aimed
 * at it, for integration tests: the server assembly's own test graph
 * (`layerTest`), extra modules (test doubles of later modules) joined as
 * plugins.
 */
import { Effect, Layer } from "effect"
import { layerTest, layerTestBare } from "../../src/layers/Server.ts"
import type { ServerConfigInput } from "../../src/services/server/ServerConfig.ts"
import type { ServerModule } from "../../src/services/server/Handler.ts"
import { MqClient } from "../../src/services/client/MqClient.ts"
import { MqServer } from "../../src/services/server/MqServer.ts"

export interface TestServerOptions {
  readonly config?: Partial<ServerConfigInput>
  readonly modules?: ReadonlyArray<ServerModule>
  /** Client request timeout; default 5,000 ms. */
  readonly requestTimeoutMs?: number
}

/** An MqClient connected to the server in context. */
const clientOf = (requestTimeoutMs: number) =>
  Layer.unwrap(
    Effect.gen(function*() {
      const s = yield* MqServer
      return MqClient.layer({ endpoint: s.endpoint, requestTimeoutMs })
    })
  )

/** MqServer + modules + an MqClient connected to it. */
export const testServer = (options: TestServerOptions = {}) =>
  clientOf(options.requestTimeoutMs ?? 5_000).pipe(
    Layer.provideMerge(layerTest({ ...(options.config ? { config: options.config } : {}), plugins: options.modules ?? [] }))
  )

/**
 * A server with only the management module and `modules` in its handler
 * table (no data path), plus a client: for dispatch tests whose test
 * modules serve ops the real modules also serve.
 */
export const bareServer = (options: { readonly modules: ReadonlyArray<ServerModule>; readonly config?: Partial<ServerConfigInput> }) =>
  clientOf(5_000).pipe(
    Layer.provideMerge(
      layerTestBare({ ...(options.config ? { config: options.config } : {}), plugins: options.modules })
    )
  )
