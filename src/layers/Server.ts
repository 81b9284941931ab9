/**
 * The server assembly: configuration → native memory and storage → modules
 * → one list of module records → liveness targets, the merged handler table
 * and the `/api/status` blocks, all derived from that list → MQ server →
 * HTTP frontend. A duplicate op refuses to start.
 *
 * Teardown runs in reverse: HTTP stops; the MQ server stops receiving and
 * drains in-flight requests; the reaper stops; the transfer modules release
 * every context through the same finalizer as UNREGISTER; lookup releases
 * its locks; the native backend closes anything still mapped.
 *
 * `ServerLive` is the real server; `layerTest` and `layerModulesTest` are the
 * same graph for tests and benches (an ephemeral port, test doubles joined as
 * plugins, optionally without sockets), so nobody wires the graph by hand.
 */
import { Context, Duration, Effect, Layer, Option } from "effect"
import type { InstanceId } from "../schema/InstanceId.ts"
import { Blend } from "../services/server/Blend.ts"
import { CacheControl } from "../services/server/CacheControl.ts"
import { EngineDrivenTransfer } from "../services/server/EngineDrivenTransfer.ts"
import { FdExchange } from "../services/server/FdExchange.ts"
import { makeTable, type ServerModule } from "../services/server/Handler.ts"
import { L1ShareWeights, L1Store } from "../services/server/L1Store.ts"
import { storageModule } from "../services/server/StorageStatus.ts"
import { LayoutRegistry } from "../services/server/LayoutRegistry.ts"
import { MappingBudget } from "../services/server/MappingBudget.ts"
import { LivenessTargets } from "../services/liveness/LivenessTarget.ts"
import { LmcacheDrivenTransfer } from "../services/server/LmcacheDrivenTransfer.ts"
import { Lookup } from "../services/server/Lookup.ts"
import { Management } from "../services/server/Management.ts"
import { Reaper } from "../services/liveness/Reaper.ts"
import { Readiness } from "../services/server/Readiness.ts"
import { Handlers, MqServer } from "../services/server/MqServer.ts"
import { Connections } from "../services/liveness/Connections.ts"
import { RequestBarrier } from "../services/liveness/RequestBarrier.ts"
import { ServerConfig, type ServerConfigInput, type ServerConfigShape } from "../services/server/ServerConfig.ts"
import type { StatusBlocks } from "./Http.ts"
import { LivenessSettingsLive } from "./LivenessSettings.ts"
import { NativeMemoryLive } from "./NativeMemory.ts"
import { ZmqSocketsLive } from "./Zmq.ts"
import { Tenancy } from "../services/auth/Tenancy.ts"
import { PeerEvents } from "../services/liveness/PeerEvents.ts"
import { ZmqSockets } from "../services/zmq/Sockets.ts"
import { layerL2Tier, l2Module } from "../services/server/l2/L2Tier.ts"
import { KvEvents, kvEventsModule } from "../services/server/kvevents/KvEvents.ts"
import { KvEventPublisherLive } from "../services/server/kvevents/KvEventPublisher.ts"

/**
 * Out-of-tree server modules (upstream: runtime plugins), joined after the
 * built-in ones. Empty unless a program provides some.
 */
export const PluginModules = Context.Reference<ReadonlyArray<ServerModule>>("mpcache/layers/PluginModules", {
  defaultValue: () => []
})

/**
 * Every module record of this server but management's, in the order their
 * rows and status blocks are joined: the one list of the assembly.
 */
export class ServerModules extends Context.Service<ServerModules, ReadonlyArray<ServerModule>>()(
  "mpcache/layers/ServerModules"
) {}

/**
 * L1 (its shares from the tenancy: the same Tenancy the control layer builds, layers being memoized; its commits
 * and drops announced in the KV event log), layouts, the budget of worker-memory mappings and the native memory
 * backend.
 */
const StorageLive = Layer.mergeAll(
  L1Store.layer.pipe(Layer.provide(Layer.effect(L1ShareWeights, Effect.map(Tenancy, (t) => t.l1WeightOf)).pipe(Layer.provide(Tenancy.layer)))),
  LayoutRegistry.layer,
  MappingBudget.layer
).pipe(Layer.provideMerge(NativeMemoryLive), Layer.provideMerge(KvEvents.layer))

/** The L2 tier on the configured Redis (issue 15); nothing (the "no L2" default) without --l2-url. */
const L2Live = Layer.unwrap(
  Effect.gen(function*() {
    const { l2 } = yield* ServerConfig
    if (l2 === undefined) return Layer.empty
    // Loaded only with --l2-url: the redis client pulls in net/tls, which a server without L2 never needs.
    const { layerL2Redis } = yield* Effect.promise(() => import("./L2Redis.ts"))
    return layerL2Tier.pipe(Layer.provide(layerL2Redis(l2)))
  })
)

/** The built-in modules: lookup/prefetch, LMCache-driven and engine-driven transfers, blend, and their storage. */
const BuiltinModulesLive = Layer.effect(
  ServerModules,
  Effect.gen(function*() {
    return [
      (yield* Lookup).module,
      (yield* LmcacheDrivenTransfer).module,
      (yield* FdExchange).module,
      (yield* EngineDrivenTransfer).module,
      (yield* Blend).module,
      yield* storageModule,
      (yield* MappingBudget).module,
      yield* l2Module,
      yield* kvEventsModule,
      ...(yield* PluginModules)
    ]
  })
).pipe(
  Layer.provideMerge(Blend.layer),
  Layer.provideMerge(Layer.mergeAll(LmcacheDrivenTransfer.layer, EngineDrivenTransfer.layer)),
  Layer.provideMerge(Layer.mergeAll(Lookup.layer, L1Store.layerCacheControl, FdExchange.layer)),
  Layer.provideMerge(L2Live),
  Layer.provideMerge(StorageLive)
)

/** No built-in module: only the plugins, and CLEAR drops nothing (dispatch and liveness tests). */
const NoBuiltinModulesLive = Layer.mergeAll(
  Layer.effect(ServerModules, Effect.gen(function*() {
    return yield* PluginModules
  })),
  CacheControl.layerEmpty
)

/**
 * The management module and the reaper over the records' liveness targets,
 * the connection tracker and the merged handler table. Built after the
 * modules they drive, so at shutdown the reaper stops before any of them
 * releases state.
 */
const ControlLive = Layer.effect(
  Handlers,
  Effect.gen(function*() {
    const management = yield* Management
    const tenancy = yield* Tenancy
    // Every row behind the tenant checks (docs/security.md; the identity with CURVE off).
    return tenancy.guard(yield* makeTable([management.module, tenancy.module, ...(yield* ServerModules)]), yield* LivenessTargets)
  })
).pipe(
  Layer.provideMerge(Layer.mergeAll(Management.layer, Reaper.layer)),
  Layer.provideMerge(Connections.layer),
  Layer.provideMerge(LivenessSettingsLive),
  Layer.provideMerge(
    Layer.effect(
      LivenessTargets,
      Effect.gen(function*() {
        const modules = yield* ServerModules
        // Tenancy has no target of its own: an instance's owner lives in these targets' entries (issue 25 item 1).
        return modules.flatMap((m) => (m.target === undefined ? [] : [m.target]))
      })
    )
  ),
  Layer.provideMerge(Tenancy.layer)
)

/** The ZAP handler, bound before the ROUTER (and closed after it) when CURVE is on. */
const ZapLive = Layer.effectDiscard(
  Effect.gen(function*() {
    const tenancy = yield* Tenancy
    if (tenancy.enabled) yield* (yield* ZmqSockets).serveZap(tenancy.authenticate)
  })
)

/** The connection tracker's events, and with CURVE on a closed connection also loses its tenant binding. */
const PeerEventsLive = Layer.effect(
  PeerEvents,
  Effect.gen(function*() {
    const inner = yield* PeerEvents
    const tenancy = yield* Tenancy
    // A closed connection's descriptor-socket nonce and pending tokens go too (issue 13 item 2).
    const fdExchange = Option.getOrUndefined(yield* Effect.serviceOption(FdExchange))
    if (!tenancy.enabled && fdExchange === undefined) return inner
    return PeerEvents.of({
      ...inner,
      disconnected: (peer) =>
        inner.disconnected(peer).pipe(
          Effect.andThen(tenancy.enabled ? tenancy.disconnected(peer) : Effect.void),
          Effect.andThen(fdExchange === undefined ? Effect.void : fdExchange.disconnected(peer))
        )
    })
  })
).pipe(Layer.provide(Connections.layerPeerEvents))

/** The MQ server on the configured endpoint and pools. */
const MqServerLive = Layer.unwrap(
  Effect.gen(function*() {
    const config = yield* ServerConfig
    const tenancy = yield* Tenancy
    return MqServer.layer({
      endpoint: config.endpoint,
      normalWorkers: config.maxCpuWorkers,
      affinityLanes: config.maxGpuWorkers,
      maxConnections: config.descriptors.zmqConnections,
      maxQueuedReplyBytesPerPeer: config.maxQueuedReplyBytesPerPeer,
      ...(tenancy.curve === undefined ? {} : { curve: { secretKey: tenancy.curve.secretKey, zapDomain: tenancy.curve.zapDomain } }),
      ...(config.ipcGroupId === undefined ? {} : { ipcGroupId: config.ipcGroupId }),
      ...(tenancy.enabled ? { onHandshakeFailure: tenancy.handshakeFailed } : {})
    })
  })
).pipe(Layer.provide(Layer.mergeAll(PeerEventsLive, ZapLive)))

/** The modules and their control, over `modules` and `barrier` (everything but sockets and config). */
const modulesOver = <A, E, R>(modules: Layer.Layer<A | ServerModules | CacheControl, E, R>, barrier: Layer.Layer<RequestBarrier>) =>
  ControlLive.pipe(Layer.provideMerge(Layer.mergeAll(modules, barrier)))

/** The MQ side over `modules` (no HTTP). */
const mqSideOver = <A, E, R>(modules: Layer.Layer<A | ServerModules | CacheControl, E, R>) =>
  KvEventPublisherLive.pipe(
    Layer.provideMerge(MqServerLive),
    Layer.provideMerge(modulesOver(modules, RequestBarrier.layer)),
    Layer.provideMerge(ZmqSocketsLive)
  )

/**
 * The MQ side alone (no HTTP), for the configuration in context: the
 * MqServer, every module and storage, and `ZmqSockets` for clients in the
 * same program.
 */
export const MqSideLive = mqSideOver(BuiltinModulesLive)

/** `/api/status` blocks: the reaper's (liveness windows, instances), then every record's. */
const statusBlocksLive = (tag: typeof StatusBlocks) => Layer.effect(
  tag,
  Effect.gen(function*() {
    const reaper = yield* Reaper
    const modules = yield* ServerModules
    const tenancy = yield* Tenancy
    // Each instance row says its tenant (null with CURVE off).
    const liveness = Effect.flatMap(reaper.status(), (block) =>
      Array.isArray(block["instances"])
        ? Effect.map(
          Effect.forEach(block["instances"] as ReadonlyArray<Record<string, unknown>>, (i) =>
            Effect.map(
              typeof i["instance_id"] === "string" ? tenancy.tenantOf(BigInt(i["instance_id"]) as InstanceId) : Effect.succeed(undefined),
              (tenant) => ({ ...i, tenant: tenant ?? null })
            )),
          (instances) => ({ ...block, instances })
        )
        : Effect.succeed(block))
    return [liveness, tenancy.status(), ...modules.flatMap((m) => (m.status === undefined ? [] : [m.status()]))]
  })
)

const HTTP_LOAD_DELAY = Duration.millis(20)

/**
 * The HTTP frontend, loaded once the MQ side is up (issue 16: spawn → first
 * reply): its module pulls in node:http, zlib and the platform's HTTP server,
 * which the ROUTER's first answer does not need. A failing bind still fails
 * the launch (the platform's `ServeError`).
 */
const HttpSideLive = Layer.unwrap(
  // The load is synchronous work on the event loop: a short wait first lets the ROUTER take the
  // connections and requests already queued at its endpoint.
  Effect.sleep(HTTP_LOAD_DELAY).pipe(
    Effect.andThen(Effect.promise(() => import("./Http.ts"))),
    Effect.map((http) =>
      http.HttpLive.pipe(Layer.provide(Layer.mergeAll(statusBlocksLive(http.StatusBlocks), http.StartedAt.layer, Readiness.layer)))
    )
  )
)

/** The whole server for `config`: MQ side plus HTTP frontend. */
export const ServerLive = (config: ServerConfigShape) =>
  HttpSideLive.pipe(
    Layer.provideMerge(MqSideLive),
    Layer.provideMerge(ServerConfig.layer(config))
  )

/** What the test assemblies take. */
export interface ServerTestOptions {
  /** Overrides of the defaults (`ServerConfig.layerTest`); the endpoint defaults to `tcp://127.0.0.1:*`. */
  readonly config?: Partial<ServerConfigInput>
  /** Module records (test doubles) joined after the built-in ones (or alone, in `layerTestBare`). */
  readonly plugins?: ReadonlyArray<ServerModule>
}

const testConfig = (options: ServerTestOptions) =>
  ServerConfig.layerTest({ endpoint: "tcp://127.0.0.1:*", ...options.config })

const withPlugins = (options: ServerTestOptions) => Layer.succeed(PluginModules, options.plugins ?? [])

/**
 * The MQ side for tests and benches: the real graph on an ephemeral loopback
 * port (or `config.endpoint`), exposing the MqServer, the modules, storage,
 * the config and `ZmqSockets`. Fails like `MqSideLive` (bind, L1 pool).
 */
export const layerTest = (options: ServerTestOptions = {}) =>
  mqSideOver(BuiltinModulesLive.pipe(Layer.provide(withPlugins(options)))).pipe(Layer.provideMerge(testConfig(options)))

/**
 * `layerTest` with only the management module and `plugins`: no data path,
 * no L1, CLEAR drops nothing (dispatch tests whose doubles serve ops the
 * real modules serve, liveness benches with a target of their own).
 */
export const layerTestBare = (options: ServerTestOptions = {}) =>
  mqSideOver(NoBuiltinModulesLive.pipe(Layer.provide(withPlugins(options)))).pipe(Layer.provideMerge(testConfig(options)))

/** What the socket-less test assemblies take besides `ServerTestOptions`. */
export interface ModulesTestOptions extends ServerTestOptions {
  /** The request barrier the reaper waits on; default `RequestBarrier.layerNoop` (no MQ server feeds it). */
  readonly barrier?: Layer.Layer<RequestBarrier>
}

/**
 * Every module and the management module without sockets, for TestClock
 * tests and benches of the reaper.
 */
export const layerModulesTest = (options: ModulesTestOptions = {}) =>
  modulesOver(BuiltinModulesLive.pipe(Layer.provide(withPlugins(options))), options.barrier ?? RequestBarrier.layerNoop).pipe(
    Layer.provideMerge(testConfig(options))
  )

/** `layerModulesTest` with only the management module and `plugins` (their targets are the only ones). */
export const layerModulesTestBare = (options: ModulesTestOptions = {}) =>
  modulesOver(NoBuiltinModulesLive.pipe(Layer.provide(withPlugins(options))), options.barrier ?? RequestBarrier.layerNoop).pipe(
    Layer.provideMerge(testConfig(options))
  )
