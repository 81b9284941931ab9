/**
 * The worker adapter over cpu_memfd (issue 13 item 2): `registerPagedKvCache`
 * hands the cache's sealed memfds over before every REGISTER, so a
 * re-registration after the server lost the instance (a `not_registered`
 * answer) passes them again for a fresh token; the data path works on
 * both sides of it. Real sockets (ZeroMQ, the descriptor socket), real memfds.
 */
import { randomUUID } from "node:crypto"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { UnregisterKvCache } from "../../src/schema/Op.ts"
import { MqClient } from "../../src/services/client/MqClient.ts"
import { makePagedKvCache } from "../../src/services/client/PagedKvCache.ts"
import { makeWorkerAdapterWith } from "../../src/services/client/WorkerAdapter.ts"
import { LmcacheDrivenTransfer } from "../../src/services/server/LmcacheDrivenTransfer.ts"
import { verifyTokens, writeTokens } from "../support/KvData.ts"
import { testServer } from "../support/TestServer.ts"

const geometry = { numLayers: 2, numBlocks: 32, blockSizeTokens: 16, numHeads: 2, headSize: 16, dtype: "bfloat16" as const }
const tokenIds = Array.from({ length: 64 }, (_, i) => (i * 13 + 5) % 30000)

describe("WorkerAdapter over cpu_memfd", () => {
  it.live("registers a sealed memfd cache, and re-registers with a fresh token after the server lost it", () =>
    Effect.gen(function*() {
      const client = yield* MqClient
      const transfer = yield* LmcacheDrivenTransfer
      const cache = yield* makePagedKvCache({ namePrefix: `mpcache-memfd-rereg-${randomUUID().slice(0, 8)}`, ...geometry })
      assert.deepStrictEqual([cache.backing, cache.memfds.length, cache.descriptors.map((d) => [d.kind, d.fd_index, d.fd_token])], [
        "cpu_memfd",
        2,
        [["cpu_memfd", 0, undefined], ["cpu_memfd", 1, undefined]]
      ])
      const worker = yield* makeWorkerAdapterWith(client, { modelName: "m", worldSize: 1, kvRank: 0, heartbeatIntervalMs: 10_000 })
      // Plain registerKvCaches cannot send token-less memfd descriptors.
      const untokened = yield* Effect.flip(worker.registerKvCaches(cache.descriptors))
      assert.strictEqual(
        untokened.message,
        "kv_caches[0] is a cpu_memfd descriptor without a token: register a memfd cache with registerPagedKvCache (it hands the descriptors over)"
      )
      yield* worker.registerPagedKvCache(cache)
      const first = (yield* transfer.contextOf(worker.instanceId))!
      assert.deepStrictEqual(first.memfd?.segments.map((s) => [s.bytes, s.seals]), [
        [65536, ["seal", "shrink", "grow"]],
        [65536, ["seal", "shrink", "grow"]]
      ])
      assert.strictEqual(first.memfd?.pid, process.pid)
      yield* writeTokens(cache, 5, [1, 2, 3, 4])
      assert.isTrue(yield* worker.store({ requestId: "r1", tokenIds, start: 0, end: 64, blockIds: [1, 2, 3, 4] }))

      // The server forgets the instance; the next transfer is answered not_registered and the adapter re-registers.
      yield* client.request(UnregisterKvCache, [worker.instanceId])
      const lost = yield* Effect.flip(worker.retrieve({ requestId: "r1", tokenIds, start: 0, end: 64, blockIds: [9, 10, 11, 12] }))
      assert.strictEqual(lost._tag, "NotRegistered")
      assert.strictEqual(yield* worker.reregistrations, 1)
      const second = (yield* transfer.contextOf(worker.instanceId))!
      const tokenOf = (e: typeof first) => e.descriptors[0]!.fd_token!
      assert.notDeepEqual(Buffer.from(tokenOf(second)), Buffer.from(tokenOf(first)))
      assert.isTrue(yield* worker.retrieve({ requestId: "r1", tokenIds, start: 0, end: 64, blockIds: [9, 10, 11, 12] }))
      assert.deepStrictEqual(yield* verifyTokens(cache, 5, [9, 10, 11, 12]), [])
    }).pipe(Effect.scoped, Effect.provide(testServer({ config: { chunkSize: 64, fdSocket: join(tmpdir(), `mpcache-rereg-${randomUUID()}.fds`) } }))))

  // DESIGN §5: a REGISTER of the memory the server already holds for the id is a no-op refresh. A memfd's
  // token is new on every hand-over, so "the same memory" is the same passed files (st_dev:st_ino).
  it.live("a REGISTER of the same memfds while the server holds them is a no-op refresh; other memfds are refused", () =>
    Effect.gen(function*() {
      const client = yield* MqClient
      const transfer = yield* LmcacheDrivenTransfer
      const cache = yield* makePagedKvCache({ namePrefix: `mpcache-memfd-again-${randomUUID().slice(0, 8)}`, ...geometry })
      const worker = yield* makeWorkerAdapterWith(client, { modelName: "m", worldSize: 1, kvRank: 0, heartbeatIntervalMs: 10_000 })
      yield* worker.registerPagedKvCache(cache)
      const first = (yield* transfer.contextOf(worker.instanceId))!
      // The reply of the first REGISTER lost, say: the worker sends it again, with a fresh token.
      yield* worker.registerPagedKvCache(cache)
      const again = (yield* transfer.contextOf(worker.instanceId))!
      assert.strictEqual(again.scope, first.scope)
      assert.strictEqual(again.memoryIdentities.length, 2)
      assert.isTrue(again.memoryIdentities.every((m) => /^[0-9]+:[0-9]+$/.test(m)))
      // Same geometry, other files: not the memory the id holds.
      const other = yield* makePagedKvCache({ namePrefix: `mpcache-memfd-other-${randomUUID().slice(0, 8)}`, ...geometry })
      const refused = yield* Effect.flip(worker.registerPagedKvCache(other))
      assert.include(refused.message, "already registered with different memory or model")
      assert.strictEqual((yield* transfer.contextOf(worker.instanceId))!.scope, first.scope)
    }).pipe(Effect.scoped, Effect.provide(testServer({ config: { chunkSize: 64, fdSocket: join(tmpdir(), `mpcache-again-${randomUUID()}.fds`) } }))))
})
