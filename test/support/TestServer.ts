/**
 * A real MQ server on an ephemeral loopback port, with a real client aimed
 * at it, for integration tests: the server assembly's own test graph
 * (`layerTest`), extra modules (test doubles of later modules) joined as
 * plugins.
 */
import { Context, Effect, Layer } from "effect"
import { layerTest, layerTestBare } from "../../src/layers/Server.ts"
import type { ServerConfigInput } from "../../src/services/server/ServerConfig.ts"
import type { ServerModule } from "../../src/services/server/Handler.ts"
import { MqClient } from "../../src/services/client/MqClient.ts"
import { MqServer } from "../../src/services/server/MqServer.ts"
import type { DealerCurve } from "../../src/services/zmq/Sockets.ts"
import { type CurveFixture, curveFixture } from "./CurveMode.ts"

export interface TestServerOptions {
  readonly config?: Partial<ServerConfigInput>
  /**
   * CURVE on: `true` makes fresh keys (`curveFixture`), the client authorized
   * as tenant "test" (admin) and speaking CURVE; a fixture is used as given
   * (its "client" speaks), so the suite can connect more clients with it. Default off.
   */
  readonly curve?: boolean | CurveFixture
  readonly modules?: ReadonlyArray<ServerModule>
  /** Client request timeout; default 5,000 ms. */
  readonly requestTimeoutMs?: number
}

/** The CURVE fixture the server in context runs with, for the clients a test connects besides `MqClient`. */
export class TestCurve extends Context.Service<TestCurve, CurveFixture>()("test/support/TestCurve") {}

/** An MqClient connected to the server in context. */
const clientOf = (requestTimeoutMs: number, curve?: DealerCurve) =>
  Layer.unwrap(
    Effect.gen(function*() {
      const s = yield* MqServer
      return MqClient.layer({ endpoint: s.endpoint, requestTimeoutMs, ...(curve === undefined ? {} : { curve }) })
    })
  )

/** MqServer + modules + an MqClient connected to it (with `curve`, both speak CURVE) + its `TestCurve`. */
export const testServer = (options: TestServerOptions = {}) => {
  const fx = typeof options.curve === "object" ? options.curve : curveFixture(options.curve === true)
  const config: Partial<ServerConfigInput> = { ...options.config, ...fx.serverConfig }
  return clientOf(options.requestTimeoutMs ?? 5_000, fx.client().curve).pipe(
    Layer.provideMerge(layerTest({ config, plugins: options.modules ?? [] })),
    Layer.merge(Layer.succeed(TestCurve, fx))
  )
}

/**
 * A server with only the management module and `modules` in its handler
 * table (no data path), plus a client: for dispatch tests whose test
 * modules serve ops the real modules also serve.
 */
export const bareServer = (options: {
  readonly modules: ReadonlyArray<ServerModule>
  readonly config?: Partial<ServerConfigInput>
  readonly curve?: CurveFixture
}) =>
  clientOf(5_000, options.curve?.client().curve).pipe(
    Layer.provideMerge(
      layerTestBare({ config: { ...options.config, ...options.curve?.serverConfig }, plugins: options.modules })
    )
  )
