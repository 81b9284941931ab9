/**
 * A worker process bench:soak SIGKILLs: registers a real POSIX-shm KV cache
 * (PagedKvCache, the soak's tiny model of bench/soak/shape.ts) through the
 * WorkerAdapter, heartbeat every second, prints one line
 * `{"event":"registered","instanceId","pid"}` on stdout and waits to be
 * killed. SIGKILL skips every cleanup: the soak unlinks its segments and the
 * server must reap it (disconnect grace) and unmap them.
 *
 *   node bench/soak/worker.ts <endpoint> <namePrefix>
 */
import { NodeRuntime } from "@effect/platform-node"
import { Effect } from "effect"
import { ClientLive } from "../../src/layers/Client.ts"
import { makePagedKvCache } from "../../src/services/client/PagedKvCache.ts"
import { makeWorkerAdapter } from "../../src/services/client/WorkerAdapter.ts"
import { KV_GEOMETRY, MODEL_LM } from "./shape.ts"

const endpoint = process.argv[2]!
const namePrefix = process.argv[3]!

const program = Effect.gen(function*() {
  const cache = yield* makePagedKvCache({ namePrefix, ...KV_GEOMETRY })
  const worker = yield* makeWorkerAdapter({ endpoint, modelName: MODEL_LM, worldSize: 1, kvRank: 0, heartbeatIntervalMs: 1_000, requestTimeoutMs: 10_000 })
  yield* worker.registerPagedKvCache(cache)
  yield* Effect.sync(() => void process.stdout.write(`${JSON.stringify({ event: "registered", instanceId: worker.instanceId.toString(), pid: process.pid })}\n`))
  // Bounded even if no one kills it: a stray worker exits (unregistering) after 10 minutes.
  yield* Effect.sleep("10 minutes")
})

NodeRuntime.runMain(program.pipe(Effect.scoped, Effect.provide(ClientLive)))
