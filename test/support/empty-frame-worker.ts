/**
 * A worker whose own socket sends lone empty frames — what ZMQ_ROUTER_NOTIFY's
 * connect/disconnect notifications look like — every `everyMs`, for the test
 * that such a peer is never made `suspect` (issue 14). It registers a real
 * shared-memory KV cache over a raw DEALER (the MQ client never sends such
 * frames), prints `{"event":"registered","instanceId":…}` and runs until killed.
 *
 *   node test/support/empty-frame-worker.ts '{"endpoint":…,"namePrefix":…,"everyMs":100}'
 */
import { NodeRuntime } from "@effect/platform-node"
import { Effect, Exit } from "effect"
import * as zmq from "zeromq"
import { ClientLive } from "../../src/layers/Client.ts"
import { decodeReplyHeader, encodeRequest } from "../../src/schema/Frame.ts"
import { makeInstanceId } from "../../src/schema/InstanceId.ts"
import { RegisterKvCache } from "../../src/schema/Op.ts"
import { makePagedKvCache } from "../../src/services/client/PagedKvCache.ts"

const args = JSON.parse(process.argv[2] ?? "{}") as { endpoint: string; namePrefix: string; everyMs: number }
const instanceId = makeInstanceId(BigInt(process.pid) * 1_000_003n)

const program = Effect.gen(function*() {
  const cache = yield* makePagedKvCache({
    backing: "cpu_shm",
    namePrefix: args.namePrefix,
    numLayers: 1,
    numBlocks: 4,
    blockSizeTokens: 16,
    numHeads: 1,
    headSize: 16,
    dtype: "float16"
  })
  const dealer = yield* Effect.acquireRelease(
    Effect.sync(() => {
      const d = new zmq.Dealer({ linger: 0 })
      d.connect(args.endpoint)
      return d
    }),
    (d) => Effect.sync(() => d.close())
  )
  const frames = encodeRequest(RegisterKvCache, 1, [instanceId, cache.descriptors, "empty-frames", 1, "vllm", {}, []])
  if (Exit.isFailure(frames)) return yield* Effect.die(new Error("cannot encode REGISTER"))
  yield* Effect.promise(() => dealer.send(frames.value))
  const reply = decodeReplyHeader(yield* Effect.promise(() => dealer.receive()))
  if (reply?._tag !== "Ok") return yield* Effect.die(new Error(`REGISTER failed: ${JSON.stringify(reply)}`))
  process.stdout.write(`${JSON.stringify({ event: "registered", instanceId: instanceId.toString() })}\n`)
  // Drain whatever comes back (the server answers a spoofed notification with an empty frame of its own).
  void (async () => {
    for (;;) await dealer.receive()
  })().catch(() => {})
  // The first frame after `everyMs`, not at once: a worker with a long period stays silent after registering.
  for (;;) {
    yield* Effect.sleep(`${args.everyMs} millis`)
    yield* Effect.promise(() => dealer.send([""]))
  }
})

NodeRuntime.runMain(program.pipe(Effect.scoped, Effect.provide(ClientLive)))
