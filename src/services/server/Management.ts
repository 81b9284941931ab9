/**
 * The management module (DESIGN §3.1, §5; upstream `ManagementModule`):
 * PING, PING_REGISTERED, NOOP, GET_CHUNK_SIZE, CLEAR.
 *
 * PING is where liveness signals enter: it touches every liveness target
 * for a named instance and nothing for nil (the scheduler and untracked
 * probers, upstream #3754); it never inserts. PING runs on the NORMAL pool
 * on purpose: if that pool cannot answer within the client's timeout the
 * worker should go degraded (back-pressure). PING_REGISTERED (upstream
 * #4732) touches the same way and answers which expected kinds the server
 * does not hold, so a worker notices a server restart or its own reap.
 *
 * The reaper, and the liveness blocks of `/api/status`, are the liveness
 * room's (src/services/liveness/Reaper.ts): they drive the same targets.
 *
 * PING, NOOP and GET_CHUNK_SIZE also have a fast answer (`FastHandler`): a
 * pre-encoded response frame and a batched counter, no Effect (issue 16). A
 * named PING (issue 25 item 4) is answered the same way once its peer is
 * bound to the instance: every target touched synchronously
 * (`touchInstanceNow`, the registry's `touchNow`); the first PING of a
 * connection, an id in a rarer encoding, or a target that cannot touch now
 * take the pooled path, which binds and touches in its transaction. The
 * chain from the receive loop to `last_seen`, counted before and after, is
 * written down in internal/FastPath.ts ("The PING path").
 */
import { Clock, Context, Effect, Layer, Metric } from "effect"
import { decodeInstanceIdFrame, encodeFrame } from "../../schema/Frame.ts"
import { ServerConfig, type ServerConfigInput } from "./ServerConfig.ts"
import type { InstanceId } from "../../schema/InstanceId.ts"
import { Clear, GetChunkSize, Noop, Ping, PingRegistered } from "../../schema/Op.ts"
import type { RegistrationKind } from "../../schema/Registration.ts"
import { CacheControl, type MemoryCache } from "./CacheControl.ts"
import { type FastHandler, row, type ServerModule } from "./Handler.ts"
import { makeMetricBatch } from "./internal/MetricBatch.ts"
import { type LivenessTarget, LivenessTargets } from "../liveness/LivenessTarget.ts"
import { byLabel } from "../metrics/Series.ts"

const pingsTotal = Metric.counter("mpcache_pings_total", {
  description: "PING / PING_REGISTERED received, by form",
  incremental: true
})
const pingsBy = byLabel(pingsTotal, "form", ["instance", "nil", "ping_registered"])
const pingsNamed = pingsBy.instance
const pingsNil = pingsBy.nil
const pingsRegistered = pingsBy.ping_registered

/** MessagePack nil: the PING payload of a scheduler or an untracked prober. */
const NIL = 0xc0

/** The management module's operations and its handler rows. */
export class Management extends Context.Service<Management, {
  /** PING `[instance_id | nil] → true`: touches every target for a named id (never inserts). */
  readonly ping: (id: InstanceId | null) => Effect.Effect<true>
  /** PING_REGISTERED: touches like PING; answers the `expected` kinds the server does not hold for `id`. */
  readonly pingRegistered: (id: InstanceId, expected: ReadonlyArray<RegistrationKind>) => Effect.Effect<ReadonlyArray<RegistrationKind>>
  /** NOOP → "OK". */
  readonly noop: () => Effect.Effect<"OK">
  /** GET_CHUNK_SIZE → tokens per chunk (`--chunk-size`). */
  readonly getChunkSize: () => Effect.Effect<number>
  /** CLEAR: drops cached objects (see CacheControl for `force`). */
  readonly clear: (force: boolean) => Effect.Effect<void>
  /** Rows: PING NORMAL, PING_REGISTERED NORMAL, NOOP SYNC, GET_CHUNK_SIZE SYNC, CLEAR NORMAL (DESIGN §3.1). */
  readonly module: ServerModule
}>()("mpcache/services/Management") {
  static readonly layer = Layer.effect(this, Effect.suspend(() => make))
  /**
   * For tests: the real module over `ServerConfig.layerTest(config)`,
   * `targets` (in-memory ones: `heldTarget`; default none) and
   * `CacheControl.layerTest(cache)`.
   */
  static readonly layerTest = (options: {
    readonly config?: Partial<ServerConfigInput>
    readonly targets?: ReadonlyArray<LivenessTarget>
    readonly cache?: MemoryCache
  } = {}) =>
    this.layer.pipe(Layer.provide(Layer.mergeAll(
      ServerConfig.layerTest(options.config),
      LivenessTargets.layer(options.targets ?? []),
      CacheControl.layerTest(options.cache)
    )))
}

const make = Effect.gen(function*() {
  const config = yield* ServerConfig
  const targets = yield* LivenessTargets
  const cache = yield* CacheControl

  const touchAll = (id: InstanceId) => Effect.forEach(targets, (t) => t.touchInstance(id), { discard: true })

  const ping = (id: InstanceId | null) =>
    id === null
      ? Metric.update(pingsNil, 1).pipe(Effect.as(true as const))
      : touchAll(id).pipe(Effect.andThen(Metric.update(pingsNamed, 1)), Effect.as(true as const))

  const pingRegistered = (id: InstanceId, expected: ReadonlyArray<RegistrationKind>) =>
    Effect.gen(function*() {
      yield* touchAll(id)
      yield* Metric.update(pingsRegistered, 1)
      const missing: Array<RegistrationKind> = []
      for (const kind of new Set(expected)) {
        const owners = targets.filter((t) => t.kind === kind)
        const holds = yield* Effect.forEach(owners, (t) => t.holdsInstance(id))
        if (!holds.some(Boolean)) missing.push(kind)
      }
      return missing
    })

  const clear = (force: boolean) =>
    cache.clear(force).pipe(
      Effect.flatMap((dropped) => Effect.logInfo(`cache cleared: ${dropped} object(s) dropped`, { force }))
    )

  // The fast answers: the frames their handlers' responses encode to, built once.
  const batch = makeMetricBatch(yield* Effect.context<never>())
  const pingsNilBatched = batch.counter(pingsTotal, { form: "nil" })
  const pingsNamedBatched = batch.counter(pingsTotal, { form: "instance" })
  // The clock the pools' fibers read (they are forked from this context): a TestClock in tests.
  const clock = yield* Clock.Clock
  const trueFrame = yield* Effect.orDie(encodeFrame(Ping.response, true, "ping: response"))
  const okFrame = yield* Effect.orDie(encodeFrame(Noop.response, "OK", "noop: response"))
  const chunkSizeFrame = yield* Effect.orDie(encodeFrame(GetChunkSize.response, config.chunkSizeTokens, "get_chunk_size: response"))
  const fastPing: FastHandler = (message, start, isBound) => {
    const frame = message[start]!
    if (frame.length === 1 && frame[0] === NIL) {
      pingsNilBatched.add(1)
      return trueFrame
    }
    const id = decodeInstanceIdFrame(frame)
    if (id === undefined || !isBound(message[0]!, id)) return undefined
    // `touchAll`, synchronously (inline: the chain to last_seen is counted). Where a target cannot, the pooled
    // path runs instead and touches again those before it, which changes nothing (last_seen only moves forward).
    const nowMs = clock.currentTimeMillisUnsafe()
    for (const t of targets) if (t.touchInstanceNow(id, nowMs) === undefined) return undefined
    pingsNamedBatched.add(1)
    return trueFrame
  }

  const module: ServerModule = {
    name: "management",
    rows: [
      row(Ping, "NORMAL", ([id]) => ping(id), fastPing),
      row(PingRegistered, "NORMAL", ([id, expected]) => pingRegistered(id, expected)),
      row(Noop, "SYNC", () => Effect.succeed("OK" as const), () => okFrame),
      row(GetChunkSize, "SYNC", () => Effect.succeed(config.chunkSizeTokens), () => chunkSizeFrame),
      row(Clear, "NORMAL", ([force]) => clear(force))
    ]
  }
  return {
    ping,
    pingRegistered,
    noop: () => Effect.succeed("OK" as const),
    getChunkSize: () => Effect.succeed(config.chunkSizeTokens),
    clear,
    module
  }
})
