/**
 * Child program of bench:ping: the worker whose instance the named PINGs
 * name. Registers a small real KV cache (memfd segments, PagedKvCache)
 * through the WorkerAdapter, as an engine worker does (heartbeat every
 * second), prints one line `{"registered":"<decimal instance id>"}` on
 * stdout, and stays registered until its stdin closes or it gets SIGTERM;
 * then it unregisters and exits.
 *
 *   node bench/ping/worker.ts ENDPOINT
 */
import { NodeRuntime } from "@effect/platform-node"
import { Deferred, Effect } from "effect"
import { ClientLive } from "../../src/layers/Client.ts"
import { formatInstanceId } from "../../src/schema/InstanceId.ts"
import { makePagedKvCache } from "../../src/services/client/PagedKvCache.ts"
import { makeWorkerAdapter } from "../../src/services/client/WorkerAdapter.ts"

const endpoint = process.argv[2]
if (endpoint === undefined) {
  process.stderr.write("usage: node bench/ping/worker.ts ENDPOINT\n")
  process.exit(2)
}

const program = Effect.gen(function*() {
  const cache = yield* makePagedKvCache({
    namePrefix: `mpcache-bench-ping-${process.pid}`,
    numLayers: 1,
    numBlocks: 4,
    blockSizeTokens: 16,
    numHeads: 2,
    headSize: 16,
    dtype: "float16"
  })
  const worker = yield* makeWorkerAdapter({
    endpoint,
    modelName: "bench-ping",
    worldSize: 1,
    kvRank: 0,
    heartbeatIntervalMs: 1_000,
    requestTimeoutMs: 10_000
  })
  yield* worker.registerPagedKvCache(cache)
  process.stdout.write(`${JSON.stringify({ registered: formatInstanceId(worker.instanceId) })}\n`)
  const stop = yield* Deferred.make<void>()
  const done = () => Deferred.doneUnsafe(stop, Effect.void)
  process.stdin.on("close", done)
  process.stdin.resume()
  process.once("SIGTERM", done)
  yield* Deferred.await(stop)
})

NodeRuntime.runMain(program.pipe(Effect.scoped, Effect.provide(ClientLive)))
