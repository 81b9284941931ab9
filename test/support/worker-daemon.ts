/**
 * A long-running worker process for liveness end-to-end tests: registers a
 * shared-memory KV cache through the WorkerAdapter (heartbeat on), stores a
 * fresh chunk every `storeEveryMs`, and prints one JSON line per event on
 * stdout. SIGTERM/SIGINT: the adapter stops its heartbeat, unregisters and
 * closes.
 *
 *   node test/support/worker-daemon.ts '{"endpoint":…,"namePrefix":…,"heartbeatIntervalMs":…,"storeEveryMs":…}'
 */
import { fstatSync } from "node:fs"
import { NodeRuntime } from "@effect/platform-node"
import { Effect, Schedule } from "effect"
import { ClientLive } from "../../src/layers/Client.ts"
import { makePagedKvCache } from "../../src/services/client/PagedKvCache.ts"
import { makeWorkerAdapter } from "../../src/services/client/WorkerAdapter.ts"
import type { DealerCurve } from "../../src/services/zmq/Sockets.ts"
import { writeTokens } from "./KvData.ts"

interface Args {
  readonly endpoint: string
  readonly namePrefix: string
  readonly heartbeatIntervalMs: number
  readonly storeEveryMs: number
  /** Default cpu_shm (the liveness tests read /dev/shm); cpu_memfd hands sealed memfds over. */
  readonly backing?: "cpu_memfd" | "cpu_shm"
  /** Blocks of the 2-layer cache (default 16; 2 KiB each). */
  readonly numBlocks?: number
  /**
   * Write every block of the cache before registering (the server touches only the blocks it copies, issue 24
   * item 12, so a test that needs the whole cache resident has the worker fill it); cpu_memfd: then prints
   * `{"event":"populated","bytes":…}`, the bytes its memfds hold (fstat st_blocks × 512).
   */
  readonly populate?: boolean
  /** CURVE keys of this worker (test/support/CurveMode.ts); absent: no CURVE. */
  readonly curve?: DealerCurve
  /**
   * Print each new registration and health event of the adapter's session log as it appears (read every 50 ms):
   * `{"event":"session","tag":"Registered"|"RegisterFailed"|"Unhealthy"|"Healthy","reason":…}`.
   */
  readonly reportSession?: boolean
}

const args = JSON.parse(process.argv[2] ?? "{}") as Args
const say = (event: Record<string, unknown>) => Effect.sync(() => void process.stdout.write(`${JSON.stringify(event)}\n`))

const program = Effect.gen(function*() {
  const cache = yield* makePagedKvCache({
    backing: args.backing ?? "cpu_shm",
    namePrefix: args.namePrefix,
    numLayers: 2,
    numBlocks: args.numBlocks ?? 16,
    blockSizeTokens: 16,
    numHeads: 1,
    headSize: 16,
    dtype: "float16"
  })
  const worker = yield* makeWorkerAdapter({
    endpoint: args.endpoint,
    modelName: "liveness-e2e",
    worldSize: 1,
    kvRank: 0,
    heartbeatIntervalMs: args.heartbeatIntervalMs,
    // 10 s: a bound on a hang, not a timing; a busy machine (every core taken, servers starting beside it)
    // can take seconds to answer a registration's first request.
    requestTimeoutMs: 10_000,
    ...(args.curve === undefined ? {} : { curve: args.curve })
  })
  if (args.populate === true) {
    const { numLayers, numBlocks, blockBytes } = cache.geometry
    const fill = Buffer.alloc(numBlocks * blockBytes, 0x5a)
    for (let l = 0; l < numLayers; l++) for (const kv of [0, 1] as const) yield* cache.writeBlocks(l, kv, 0, fill)
    yield* say({ event: "populated", bytes: cache.memfds.reduce((n, fd) => n + fstatSync(fd).blocks * 512, 0) })
  }
  yield* worker.registerPagedKvCache(cache)
  yield* say({ event: "registered", instanceId: worker.instanceId.toString(), pid: process.pid })
  if (args.reportSession === true) {
    let seen = 0
    yield* Effect.forkScoped(Effect.gen(function*() {
      const events = yield* worker.events
      for (const e of events.slice(seen)) {
        if (e._tag === "Registered" || e._tag === "RegisterFailed" || e._tag === "Unhealthy") yield* say({ event: "session", tag: e._tag, reason: e.reason })
        else if (e._tag === "Healthy") yield* say({ event: "session", tag: e._tag })
      }
      seen = events.length
    }).pipe(Effect.repeat(Schedule.spaced("50 millis"))))
  }
  const blockIds = [1, 2, 3, 4]
  yield* writeTokens(cache, 1, blockIds)
  let n = 0
  yield* Effect.gen(function*() {
    n++
    const tokenIds = Array.from({ length: worker.chunkSizeTokens }, (_, i) => (n * 7919 + i) % 30000)
    const ok = yield* worker.store({ requestId: `s${n}`, tokenIds, start: 0, end: worker.chunkSizeTokens, blockIds }).pipe(
      Effect.catch((e) => Effect.as(say({ event: "store_error", n, message: e.message }), false))
    )
    yield* say({ event: "store", n, ok, healthy: yield* worker.isHealthy, reregistrations: yield* worker.reregistrations })
  }).pipe(Effect.repeat(Schedule.spaced(`${args.storeEveryMs} millis`)))
})

NodeRuntime.runMain(program.pipe(Effect.scoped, Effect.provide(ClientLive)), {
  teardown: (exit, onExit) => onExit(exit._tag === "Success" || exit.cause.reasons.every((r) => r._tag === "Interrupt") ? 0 : 1)
})
