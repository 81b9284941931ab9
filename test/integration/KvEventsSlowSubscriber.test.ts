/**
 * A subscriber that never reads does not slow the server (issue 28 item 4; docs/kv-events.md): with a PUB
 * high-water mark of 4 batches, a SUB that holds one message and a 4 KiB receive buffer and never reads stays
 * connected while 300 STOREs of 32 chunks each (about 1.4 MB of batches) go through. No timing is measured:
 * every STORE answers, a second subscriber (mpcache/client's stream, filling its own gaps by replay) ends with
 * every chunk the server holds, and the silent subscriber, once it reads, sees gaps in the sequence numbers —
 * libzmq dropped its copies past the high-water mark instead of making the server wait.
 */
import { randomUUID } from "node:crypto"
import { mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Stream } from "effect"
import * as zmq from "zeromq"
import { makeInstanceId } from "../../src/schema/InstanceId.ts"
import { RegisterKvCache, Store } from "../../src/schema/Op.ts"
import { seqOf } from "../../src/schema/VllmKvEvents.ts"
import { makeKvIndex, subscribeKvIndexUpdates } from "../../src/services/client/KvEventSubscriber.ts"
import { MqClient } from "../../src/services/client/MqClient.ts"
import { makePagedKvCache } from "../../src/services/client/PagedKvCache.ts"
import { ServerModules } from "../../src/layers/Server.ts"
import { writeTokens } from "../support/KvData.ts"
import { testServer } from "../support/TestServer.ts"

const CHUNK = 32
const TOKENS = 1024 // 32 chunks a STORE: 64 blocks of 16 tokens
const STORES = 300
const geometry = { numLayers: 1, numBlocks: 64, blockSizeTokens: 16, numHeads: 1, headSize: 8, dtype: "float16" as const }
const EVENT = new Uint8Array([1])
const blocks = Array.from({ length: 64 }, (_, i) => i)

type PublisherStatus = { readonly subscribers: number; readonly next_seq: number; readonly batches_published: number }
const kvStatus = Effect.gen(function*() {
  const module = (yield* ServerModules).find((m) => m.name === "kv_events")!
  return (yield* module.status!())["kv_events"] as { readonly newest_seq: number; readonly publisher: PublisherStatus }
})
/** Polls the status until `holds`; a bound on a hang (10 s), not a timing. */
const statusWhen = (holds: (s: Effect.Success<typeof kvStatus>) => boolean) =>
  Effect.gen(function*() {
    const deadline = Date.now() + 10_000
    for (;;) {
      const s = yield* kvStatus
      if (holds(s)) return s
      if (Date.now() > deadline) return assert.fail(`KV events status never got there: ${JSON.stringify(s)}`)
      yield* Effect.sleep("5 millis")
    }
  })

describe("a KV event subscriber that never reads", () => {
  const dir = mkdtempSync(join(tmpdir(), "mpcache-kvslow-"))
  const pubAt = `ipc://${join(dir, "pub")}`
  const replayAt = `ipc://${join(dir, "replay")}`

  it.live("does not hold STOREs up: all 300 answer, another subscriber gets every chunk, the silent one sees gaps", () =>
    Effect.gen(function*() {
      const client = yield* MqClient
      const silent = yield* Effect.acquireRelease(
        Effect.sync(() => new zmq.Subscriber({ linger: 0, receiveHighWaterMark: 1, receiveBufferSize: 4096 })),
        (s) => Effect.sync(() => s.close())
      )
      silent.connect(pubAt)
      silent.subscribe("kv-events")
      const index = makeKvIndex()
      yield* Effect.forkScoped(Stream.runForEach(subscribeKvIndexUpdates({ endpoint: pubAt, replayEndpoint: replayAt }), (u) =>
        Effect.sync(() => index.apply(u))))
      yield* statusWhen((s) => s.publisher.subscribers === 2)

      const cache = yield* makePagedKvCache({ backing: "cpu_shm", namePrefix: `mpcache-test-${randomUUID()}`, ...geometry })
      yield* client.request(RegisterKvCache, [makeInstanceId(1n), cache.descriptors, "tiny", 1, "vllm", {}, []])
      yield* writeTokens(cache, 3, blocks)
      const store = (n: number) =>
        client.request(Store, [
          {
            model_name: "tiny",
            world_size: 1,
            worker_id: 0,
            token_ids: Array.from({ length: TOKENS }, (_, t) => n * TOKENS + t),
            start: 0,
            end: TOKENS,
            request_id: `r${n}`,
            cache_salt: ""
          },
          makeInstanceId(1n),
          [blocks],
          EVENT
        ])
      for (let n = 0; n < STORES; n++) assert.deepStrictEqual(yield* store(n), [EVENT, true])

      // Every record was published, and the reading subscriber holds every chunk (live, or replayed over its gaps).
      const chunks = STORES * (TOKENS / CHUNK)
      const done = yield* statusWhen((s) => s.newest_seq === chunks && s.publisher.batches_published === s.publisher.next_seq && index.hashes().length === chunks)
      assert.strictEqual(index.hashes().length, chunks)

      // The silent one reads now (a bound of 10 s a message against a hang): what it was sent until its queue
      // filled, then, as its queue empties, the batches of further STOREs, one at a time, until one of them arrives.
      silent.receiveTimeout = 10_000
      const seqs: Array<number> = []
      yield* Effect.forkScoped(Effect.forever(Effect.promise(() => silent.receive()).pipe(
        Effect.map((m) => void seqs.push(seqOf(m[1]!)!))
      )))
      let last = done.publisher.next_seq - 1
      for (let n = STORES; seqs.length === 0 || seqs[seqs.length - 1]! < last; n++) {
        if (n > STORES + 1000) return assert.fail(`the silent subscriber never caught up: ${seqs.length} batches read, the last ${seqs[seqs.length - 1]}`)
        assert.deepStrictEqual(yield* store(n), [EVENT, true])
        last = (yield* statusWhen((s) => s.publisher.next_seq > last + 1)).publisher.next_seq - 1
        yield* Effect.sleep("10 millis") // lets the reading fiber run; the loop ends on what it read, not on time
      }
      for (let i = 1; i < seqs.length; i++) assert.isAbove(seqs[i]!, seqs[i - 1]!)
      // Fewer than were published: the PUB dropped its copies rather than wait for it.
      assert.isBelow(seqs.length, last + 1, `the silent subscriber got all ${last + 1} batches: its queue never filled`)
      console.log(`a subscriber that never read got ${seqs.length} of ${last + 1} batches; the others were dropped for it`)
    }).pipe(
      Effect.scoped,
      Effect.provide(testServer({ config: { chunkSize: CHUNK, l1SizeGb: 0.125, kvEventsEndpoint: pubAt, kvEventsReplayEndpoint: replayAt, kvEventsHwm: 4 } }))
    ), 120_000)
})
