/**
 * The server assembly: configuration → native memory and storage → modules
 * → the merged handler table → MQ server → HTTP frontend. Every module's
 * rows are joined here in one visible list; a duplicate op refuses to start.
 *
 * Teardown runs in reverse: HTTP stops; the MQ server stops receiving and
 * drains in-flight requests; the transfer module releases every context
 * through the same finalizer as UNREGISTER; lookup releases its locks; the
 * native backend closes anything still mapped.
 */
import { Context, Effect, Layer } from "effect"
import { NativeMemory } from "../native/Native.ts"
import { Blend } from "../services/server/Blend.ts"
import { EngineDrivenTransfer } from "../services/server/EngineDrivenTransfer.ts"
import { makeTable, type ServerModule } from "../services/server/Handler.ts"
import { L1Store } from "../services/server/L1Store.ts"
import { LayoutRegistry } from "../services/server/LayoutRegistry.ts"
import { LivenessTargets } from "../services/liveness/LivenessTarget.ts"
import { LmcacheDrivenTransfer } from "../services/server/LmcacheDrivenTransfer.ts"
import { Lookup } from "../services/server/Lookup.ts"
import { Management } from "../services/server/Management.ts"
import { Handlers, MqServer } from "../services/server/MqServer.ts"
import { Connections } from "../services/liveness/Connections.ts"
import { RequestBarrier } from "../services/liveness/RequestBarrier.ts"
import { HttpLive, StartedAt, StatusBlocks } from "./Http.ts"
import { NativeMemoryLive } from "./NativeMemory.ts"
import { ZmqSocketsLive } from "./Zmq.ts"
import { ServerConfig, type ServerConfigShape } from "../services/server/ServerConfig.ts"

/**
 * Out-of-tree server modules (upstream: runtime plugins), joined after the
 * built-in ones. Empty unless a program provides some.
 */
export const PluginModules = Context.Reference<ReadonlyArray<ServerModule>>("mpcache/layers/PluginModules", {
  defaultValue: () => []
})

/** L1, layouts and the native memory backend. */
const StorageLive = Layer.mergeAll(L1Store.layer, LayoutRegistry.layer).pipe(Layer.provideMerge(NativeMemoryLive))

/** The data-path modules: lookup/prefetch, LMCache-driven and engine-driven transfers, and blend. */
const DataPathLive = Blend.layer.pipe(
  Layer.provideMerge(Layer.mergeAll(LmcacheDrivenTransfer.layer, EngineDrivenTransfer.layer)),
  Layer.provideMerge(Lookup.layer),
  Layer.provideMerge(StorageLive)
)

/** Every module holding per-instance state, for PING and the reaper. */
const TargetsLive = Layer.effect(
  LivenessTargets,
  Effect.gen(function*() {
    const transfer = yield* LmcacheDrivenTransfer
    const engineDriven = yield* EngineDrivenTransfer
    const blend = yield* Blend
    return [transfer.target, engineDriven.target, blend.target]
  })
)

/** Server modules and what they need; the management module (and its reaper) last, so it stops first. */
const ModulesLive = Management.layer.pipe(
  Layer.provideMerge(Connections.layer),
  Layer.provideMerge(Layer.mergeAll(TargetsLive, L1Store.layerCacheControl, RequestBarrier.layer)),
  Layer.provideMerge(DataPathLive)
)

/** The merged handler table: one row list per module. */
const HandlersLive = Layer.effect(
  Handlers,
  Effect.gen(function*() {
    const management = yield* Management
    const lookup = yield* Lookup
    const transfer = yield* LmcacheDrivenTransfer
    const engineDriven = yield* EngineDrivenTransfer
    const blend = yield* Blend
    const plugins = yield* PluginModules
    return yield* makeTable([management.module, lookup.module, transfer.module, engineDriven.module, blend.module, ...plugins])
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
).pipe(Layer.provide(Connections.layerPeerEvents))

/**
 * The MQ side alone (no HTTP): what integration tests start. Exposes the
 * MqServer, the modules and storage.
 */
export const MqSideLive = MqServerLive.pipe(
  Layer.provideMerge(HandlersLive),
  Layer.provideMerge(ModulesLive),
  Layer.provideMerge(ZmqSocketsLive)
)

/** `/api/status` blocks of the modules: registered instances, native mappings, L1, lookup sessions. */
const StatusBlocksLive = Layer.effect(
  StatusBlocks,
  Effect.gen(function*() {
    const management = yield* Management
    const native = yield* NativeMemory
    const l1 = yield* L1Store
    const lookup = yield* Lookup
    const blend = yield* Blend
    const engineDriven = yield* EngineDrivenTransfer
    return [
      management.status(),
      blend.status(),
      engineDriven.status(),
      Effect.sync(() => {
        const n = native.stats()
        const s = l1.stats()
        const k = lookup.stats()
        return {
          // Mappings of workers' memory; the server's own L1 pool is reported under l1.
          native: {
            open_mappings: n.openMappings - (l1.pool === undefined ? 0 : 1),
            mapped_bytes: n.mappedBytes - (l1.pool?.sizeBytes ?? 0)
          },
          l1: {
            pool: l1.pool?.shmName ?? null,
            capacity_bytes: s.capacityBytes,
            prefaulted_bytes: l1.pool?.prefaultedBytes() ?? 0,
            used_bytes: s.usedBytes,
            objects: s.objects,
            reserved_objects: s.reservedObjects,
            locked_objects: s.lockedObjects,
            evictions: s.evictions
          },
          lookup: { sessions: k.sessions, held_locks: k.heldLocks, pending_jobs: k.pendingJobs }
        }
      })
    ]
  })
)

/** The whole server for `config`: MQ side plus HTTP frontend. */
export const ServerLive = (config: ServerConfigShape) =>
  HttpLive.pipe(
    Layer.provide(Layer.mergeAll(StatusBlocksLive, StartedAt.layer)),
    Layer.provideMerge(MqSideLive),
    Layer.provideMerge(ServerConfig.layer(config))
  )
