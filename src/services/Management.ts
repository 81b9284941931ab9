/**
 * The management module (DESIGN §3.1, §5; upstream `ManagementModule`):
 * PING, NOOP, GET_CHUNK_SIZE and CLEAR. PING is where liveness signals
 * enter: it touches every liveness target for a named instance and nothing
 * for nil (the scheduler and untracked probers, upstream #3754). PING runs
 * on the NORMAL pool on purpose: if that pool cannot answer within the
 * client's timeout the worker should go degraded (back-pressure).
 */
import { Context, Effect, Layer, Metric } from "effect"
import type { InstanceId } from "../schema/InstanceId.ts"
import { Clear, GetChunkSize, Noop, Ping } from "../schema/Op.ts"
import { ServerConfig } from "../layers/ServerConfig.ts"
import { CacheControl } from "./CacheControl.ts"
import { row, type ServerModule } from "./Handler.ts"
import { LivenessTargets } from "./LivenessTarget.ts"

const pingsTotal = Metric.counter("mpcache_pings_total", {
  description: "PINGs received, by whether they named an instance",
  incremental: true
})
const pingsNamed = Metric.withAttributes(pingsTotal, { instance: "named" })
const pingsNil = Metric.withAttributes(pingsTotal, { instance: "nil" })

/** The management module's operations and its handler rows. */
export class Management extends Context.Service<Management, {
  /** PING `[instance_id | nil] → true`: touches every target for a named id (never inserts). */
  readonly ping: (id: InstanceId | null) => Effect.Effect<true>
  /** NOOP → "OK". */
  readonly noop: () => Effect.Effect<"OK">
  /** GET_CHUNK_SIZE → tokens per chunk (`--chunk-size`). */
  readonly getChunkSize: () => Effect.Effect<number>
  /** CLEAR: drops cached objects (see CacheControl for `force`). */
  readonly clear: (force: boolean) => Effect.Effect<void>
  /** Rows: PING NORMAL, NOOP SYNC, GET_CHUNK_SIZE SYNC, CLEAR NORMAL (DESIGN §3.1). */
  readonly module: ServerModule
}>()("mpcache/services/Management") {
  static readonly layer = Layer.effect(
    this,
    Effect.gen(function*() {
      const config = yield* ServerConfig
      const targets = yield* LivenessTargets
      const cache = yield* CacheControl

      const ping = (id: InstanceId | null) =>
        id === null
          ? Metric.update(pingsNil, 1).pipe(Effect.as(true as const))
          : Effect.forEach(targets, (t) => t.touchInstance(id), { discard: true }).pipe(
            Effect.andThen(Metric.update(pingsNamed, 1)),
            Effect.as(true as const)
          )
      const noop = () => Effect.succeed("OK" as const)
      const getChunkSize = () => Effect.succeed(config.chunkSizeTokens)
      const clear = (force: boolean) =>
        cache.clear(force).pipe(
          Effect.flatMap((dropped) => Effect.logInfo(`cache cleared: ${dropped} object(s) dropped`, { force }))
        )

      const module: ServerModule = {
        name: "management",
        rows: [
          row(Ping, "NORMAL", ([id]) => ping(id)),
          row(Noop, "SYNC", () => noop()),
          row(GetChunkSize, "SYNC", () => getChunkSize()),
          row(Clear, "NORMAL", ([force]) => clear(force))
        ]
      }
      return { ping, noop, getChunkSize, clear, module }
    })
  )
}

