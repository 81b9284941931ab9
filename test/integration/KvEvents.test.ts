/**
 * The KV event log over real sockets and real shared memory (issue 28 items 1–3; docs/kv-events.md): the exact
 * records POLL_KV_EVENTS answers for a store (LMCache-driven and engine-driven), a re-store, CLEAR, an eviction
 * under pressure and an aborted PREPARE; a log that overflows answers `lost`; a cursor this log never issued
 * answers `lost`; events off; a new server is a new incarnation; under tenancy each tenant reads only its own
 * salt group's records while an admin reads all.
 */
import { randomUUID } from "node:crypto"
import { mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Fiber, Stream } from "effect"
import * as zmq from "zeromq"
import type { CacheKey } from "../../src/schema/CacheKey.ts"
import { makeInstanceId } from "../../src/schema/InstanceId.ts"
import {
  Clear,
  CommitStore,
  GetServerInfo,
  PollKvEvents,
  PrepareStore,
  RegisterKvCache,
  RegisterKvCacheEngineDrivenContext,
  Store
} from "../../src/schema/Op.ts"
import { decodeKvEventBatch, KvEventBatchInvalid, seqFrame, seqOf, type VllmKvEvent } from "../../src/schema/VllmKvEvents.ts"
import { InvalidArgument } from "../../src/schema/WireError.ts"
import { makeEngineDrivenWorkerAdapter } from "../../src/services/client/EngineDrivenWorkerAdapter.ts"
import { type KvIndexUpdate, makeKvIndex, pollKvIndexUpdates, subscribeKvIndexUpdates } from "../../src/services/client/KvEventSubscriber.ts"
import { makeMqClient, MqClient } from "../../src/services/client/MqClient.ts"
import { makePagedKvCache, type PagedKvCache } from "../../src/services/client/PagedKvCache.ts"
import { chunkHashes, hashHex } from "../../src/services/kv/TokenHasher.ts"
import { MqServer } from "../../src/services/server/MqServer.ts"
import { layerTest, ServerModules } from "../../src/layers/Server.ts"
import type { DealerCurve } from "../../src/services/zmq/Sockets.ts"
import { makeTestKeys } from "../support/CurveKeys.ts"
import { writeTokens } from "../support/KvData.ts"
import { testServer } from "../support/TestServer.ts"

const CHUNK = 32
const geometry = { numLayers: 3, numBlocks: 64, blockSizeTokens: 16, numHeads: 2, headSize: 8, dtype: "float16" as const }
/** One L1 object: 2 × 3 layers × 32 tokens × 16 × 2 bytes. */
const CHUNK_BYTES = 6144
const tokens = Array.from({ length: 200 }, (_, i) => (i * 7 + 3) % 5000)
const other = Array.from({ length: 200 }, (_, i) => 9000 + i)
const EVENT = new Uint8Array([1, 2, 3])

const key = (over: Partial<CacheKey> = {}): CacheKey => ({
  model_name: "tiny",
  world_size: 1,
  worker_id: 0,
  token_ids: tokens,
  start: 0,
  end: 128,
  request_id: "r1",
  cache_salt: "",
  ...over
})

const env = (config = {}) => testServer({ config: { chunkSize: CHUNK, ...config } })

const newCache = () => makePagedKvCache({ backing: "cpu_shm", namePrefix: `mpcache-test-${randomUUID()}`, ...geometry })

const register = (id: bigint, cache: PagedKvCache) =>
  Effect.flatMap(MqClient, (c) => c.request(RegisterKvCache, [makeInstanceId(id), cache.descriptors, "tiny", 1, "vllm", {}, []]))

/** Stores chunks [0, end / 32) of `ids` from blocks 1 … 8 of a registered cache. */
const storeFrom = (id: bigint, ids: ReadonlyArray<number>, end = 128) =>
  Effect.flatMap(MqClient, (c) => c.request(Store, [key({ token_ids: ids, end }), makeInstanceId(id), [[1, 2, 3, 4, 5, 6, 7, 8].slice(0, end / 16)], EVENT]))

const poll = (cursor: number, model = "tiny", max = 100) => Effect.flatMap(MqClient, (c) => c.request(PollKvEvents, [model, cursor, max]))

const hex = (h: Uint8Array | null) => (h === null ? null : hashHex(h))

/** A stored record as the test expects it: chunk `i` of `ids`. */
const stored = (seq: number, ids: ReadonlyArray<number>, i: number, model = "tiny", saltGroup = "") => {
  const hashes = chunkHashes(ids, CHUNK)
  return {
    seq,
    kind: "stored",
    medium: "CPU",
    model_name: model,
    block_hashes: [hex(hashes[i]!)],
    parent_block_hash: i === 0 ? null : hex(hashes[i - 1]!),
    token_ids: ids.slice(i * CHUNK, (i + 1) * CHUNK),
    salt_group: saltGroup
  }
}
const removed = (seq: number, hashes: ReadonlyArray<Uint8Array>, model = "tiny", saltGroup = "") => ({
  seq,
  kind: "removed",
  medium: "CPU",
  model_name: model,
  block_hashes: hashes.map(hex),
  parent_block_hash: null,
  token_ids: [],
  salt_group: saltGroup
})

/** A poll's records with hashes as hex, for deepStrictEqual. */
const plain = (events: ReadonlyArray<{ readonly block_hashes: ReadonlyArray<Uint8Array>; readonly parent_block_hash: Uint8Array | null }>) =>
  events.map((e) => ({ ...e, block_hashes: e.block_hashes.map(hex), parent_block_hash: hex(e.parent_block_hash) }))

/** The `kv_events` block of `/api/status`, as the module reports it. */
const kvStatus = Effect.gen(function*() {
  const module = (yield* ServerModules).find((m) => m.name === "kv_events")!
  return (yield* module.status!())["kv_events"] as Record<string, unknown>
})

describe("KV events (LMCache-driven store, real sockets and shared memory)", () => {
  it.live("a STORE announces each chunk once with its hash, parent and tokens; a re-store adds nothing; CLEAR removes them in one record", () =>
    Effect.gen(function*() {
      const a = yield* newCache()
      yield* register(1n, a)
      yield* writeTokens(a, 7, [1, 2, 3, 4, 5, 6, 7, 8])
      const first = yield* poll(0)
      assert.deepStrictEqual({ ...first, incarnation: first.incarnation > 0 }, {
        enabled: true,
        incarnation: true,
        next_cursor: 0,
        lost: false,
        events: []
      })
      assert.deepStrictEqual(yield* storeFrom(1n, tokens), [EVENT, true])
      const after = yield* poll(0)
      assert.deepStrictEqual(plain(after.events), [0, 1, 2, 3].map((i) => stored(i + 1, tokens, i)))
      assert.deepStrictEqual([after.next_cursor, after.lost, after.incarnation], [4, false, first.incarnation])
      // Another model's consumer sees none of them, and its cursor moves past them all the same.
      const otherModel = yield* poll(0, "other")
      assert.deepStrictEqual([otherModel.events.length, otherModel.next_cursor, otherModel.lost], [0, 4, false])
      // A bounded read: two records, then the rest from its cursor.
      const two = yield* poll(0, "tiny", 2)
      assert.deepStrictEqual([two.events.map((e) => e.seq), two.next_cursor], [[1, 2], 2])
      assert.deepStrictEqual((yield* poll(2)).events.map((e) => e.seq), [3, 4])

      // Every chunk is cached: a second STORE commits nothing, so nothing is announced.
      assert.deepStrictEqual(yield* storeFrom(1n, tokens), [EVENT, true])
      assert.deepStrictEqual(yield* poll(4), { enabled: true, incarnation: first.incarnation, next_cursor: 4, lost: false, events: [] })

      yield* Effect.flatMap(MqClient, (c) => c.request(Clear, [false]))
      const cleared = yield* poll(4)
      assert.deepStrictEqual(plain(cleared.events), [removed(5, chunkHashes(tokens, CHUNK, 4))])
      assert.deepStrictEqual(yield* kvStatus, {
        enabled: true,
        capacity: 32768,
        incarnation: first.incarnation,
        depth: 5,
        oldest_seq: 1,
        newest_seq: 5,
        records: { stored: 4, removed: 1 },
        dropped: 0,
        lost_answers: 0,
        held_chunks: 0,
        publisher: null
      })
    }).pipe(Effect.scoped, Effect.provide(env())))

  it.live("an eviction under pressure: the four chunks evicted are removed (oldest first), then the four new ones stored", () =>
    Effect.gen(function*() {
      const a = yield* newCache()
      yield* register(1n, a)
      yield* writeTokens(a, 1, [1, 2, 3, 4, 5, 6, 7, 8])
      yield* storeFrom(1n, tokens)
      yield* storeFrom(1n, other)
      const all = yield* poll(0)
      const old = chunkHashes(tokens, CHUNK, 4)
      assert.deepStrictEqual(plain(all.events), [
        ...[0, 1, 2, 3].map((i) => stored(i + 1, tokens, i)),
        ...[0, 1, 2, 3].map((i) => removed(5 + i, [old[i]!])),
        ...[0, 1, 2, 3].map((i) => stored(9 + i, other, i))
      ])
      assert.strictEqual((yield* kvStatus).held_chunks, 4)
    }).pipe(Effect.scoped, Effect.provide(env({ l1SizeGb: (4 * CHUNK_BYTES) / 2 ** 30 }))))

  it.live("a log of 3 records that took 4 answers `lost` from cursor 0 with what it kept; a cursor it never issued is `lost` too", () =>
    Effect.gen(function*() {
      const a = yield* newCache()
      yield* register(1n, a)
      yield* writeTokens(a, 1, [1, 2, 3, 4, 5, 6, 7, 8])
      yield* storeFrom(1n, tokens)
      const lost = yield* poll(0)
      assert.deepStrictEqual([lost.lost, lost.next_cursor, lost.events.map((e) => e.seq)], [true, 4, [2, 3, 4]])
      // Caught up: no longer lost.
      assert.deepStrictEqual([(yield* poll(4)).lost, (yield* poll(4)).events.length], [false, 0])
      // A cursor ahead of the newest record (another incarnation's): lost, and the consumer starts over.
      const ahead = yield* poll(99)
      assert.deepStrictEqual([ahead.lost, ahead.next_cursor, ahead.events.map((e) => e.seq)], [true, 4, [2, 3, 4]])
      const s = yield* kvStatus
      assert.deepStrictEqual([s.depth, s.oldest_seq, s.newest_seq, s.lost_answers], [3, 2, 4, 2])
    }).pipe(Effect.scoped, Effect.provide(env({ kvEventLogSize: 3 }))))

  it.live("--kv-event-log-size 0: POLL answers enabled false, GET_SERVER_INFO does not advertise kv_events, nothing is counted", () =>
    Effect.gen(function*() {
      const a = yield* newCache()
      yield* register(1n, a)
      yield* writeTokens(a, 1, [1, 2, 3, 4, 5, 6, 7, 8])
      yield* storeFrom(1n, tokens)
      const off = yield* poll(0)
      assert.deepStrictEqual({ ...off, incarnation: 0 }, { enabled: false, incarnation: 0, next_cursor: 0, lost: false, events: [] })
      const info = yield* Effect.flatMap(MqClient, (c) => c.request(GetServerInfo, []))
      assert.isFalse(info.features.includes("kv_events"))
      const s = yield* kvStatus
      assert.deepStrictEqual([s.enabled, s.capacity, s.depth, s.records, s.held_chunks], [false, 0, 0, { stored: 0, removed: 0 }, 0])
    }).pipe(Effect.scoped, Effect.provide(env({ kvEventLogSize: 0 }))))

  it.live("each server start is a new incarnation; GET_SERVER_INFO advertises kv_events", () =>
    Effect.gen(function*() {
      const once = Effect.gen(function*() {
        const info = yield* Effect.flatMap(MqClient, (c) => c.request(GetServerInfo, []))
        assert.isTrue(info.features.includes("kv_events"))
        return (yield* poll(0)).incarnation
      }).pipe(Effect.scoped, Effect.provide(env()))
      const a = yield* once
      const b = yield* once
      assert.notStrictEqual(a, b)
      assert.isTrue(Number.isSafeInteger(a) && Number.isSafeInteger(b) && a > 0 && b > 0)
    }))
})

describe("KV events (engine-driven store)", () => {
  const CONTEXT_CHUNK_BYTES = 2 * 3 * CHUNK * 16 * 2
  const adapter = Effect.gen(function*() {
    const server = yield* MqServer
    return yield* makeEngineDrivenWorkerAdapter({
      endpoint: server.endpoint,
      modelName: "edm",
      worldSize: 1,
      kvRank: 0,
      blockSizeTokens: 16,
      numLayers: 3,
      hiddenDimSize: 16,
      dtype: "bfloat16",
      instanceId: makeInstanceId(5n),
      requestTimeoutMs: 5_000
    })
  })

  it.live("an aborted PREPARE_STORE (a chunk of the wrong length) announces nothing; the committed retry announces 4 chunks", () =>
    Effect.gen(function*() {
      const w = yield* adapter
      yield* w.register
      const request = { requestId: "e1", tokenIds: tokens, start: 0, end: 150 }
      const failed = yield* Effect.flip(w.store(request, (i) => new Uint8Array(i === 2 ? 7 : CONTEXT_CHUNK_BYTES)))
      assert.instanceOf(failed, InvalidArgument)
      assert.deepStrictEqual((yield* poll(0, "edm")).events, [])
      assert.isTrue(yield* w.store(request, () => new Uint8Array(CONTEXT_CHUNK_BYTES)))
      const after = yield* poll(0, "edm")
      assert.deepStrictEqual(plain(after.events), [0, 1, 2, 3].map((i) => stored(i + 1, tokens, i, "edm")))
    }).pipe(Effect.scoped, Effect.provide(env({ engineDrivenTransport: "inline", l1SizeGb: (64 * CONTEXT_CHUNK_BYTES) / 2 ** 30 }))))
})

describe("KV events under tenancy (CURVE on)", () => {
  const keys = makeTestKeys({ a: "tenantA", b: "tenantB", admin: "ops admin" })
  const server = layerTest({
    config: { engineDrivenTransport: "inline", curveSecretKeyFile: keys.serverSecretFile, curveAuthorizedKeys: keys.authorizedKeysFile }
  })
  const clientFor = (curve: DealerCurve | undefined) =>
    Effect.flatMap(MqServer, (s) => makeMqClient({ endpoint: s.endpoint, requestTimeoutMs: 5_000, lingerMs: 0, ...(curve === undefined ? {} : { curve }) }))
  const ids = Array.from({ length: 256 }, (_, i) => i)
  /** One 256-token chunk stored inline by `client` as instance `id`. */
  const storeOne = (client: MqClient["Service"], id: bigint) =>
    Effect.gen(function*() {
      yield* client.request(RegisterKvCacheEngineDrivenContext, [{
        instance_id: makeInstanceId(id),
        model_name: "m",
        world_size: 1,
        block_size: 16,
        num_layers: 2,
        hidden_dim_size: 8,
        dtype_str: "float16",
        use_mla: false
      }])
      const k: CacheKey = { model_name: "m", world_size: 1, worker_id: 0, token_ids: ids, start: 0, end: 256, request_id: `r${id}`, cache_salt: "" }
      const { context } = yield* client.request(PrepareStore, [k, makeInstanceId(id)])
      assert.strictEqual(context.slots.length, 1)
      assert.isTrue(yield* client.request(CommitStore, [k, makeInstanceId(id), new Uint8Array(context.slots[0]!.length)]))
    })

  const dir = mkdtempSync(join(tmpdir(), "mpcache-kvpub-curve-"))
  const pubAt = `ipc://${join(dir, "pub")}`
  const curvePub = layerTest({
    config: {
      engineDrivenTransport: "inline",
      curveSecretKeyFile: keys.serverSecretFile,
      curveAuthorizedKeys: keys.authorizedKeysFile,
      kvEventsEndpoint: pubAt
    }
  })
  /** A CURVE SUB with `curve`'s keys and the outcome of its first handshake (the monitor's event type). */
  const subscriber = (curve: DealerCurve) =>
    Effect.gen(function*() {
      const sub = yield* Effect.acquireRelease(
        Effect.sync(() => new zmq.Subscriber({ linger: 0, curveServerKey: curve.serverPublicKey, curveSecretKey: curve.secretKey, curvePublicKey: curve.publicKey })),
        (s) => Effect.sync(() => s.close())
      )
      const events = sub.events
      sub.connect(pubAt)
      sub.subscribe("")
      const outcome = yield* Effect.promise(async () => {
        for (;;) {
          const e = await events.receive()
          if (e.type === "handshake" || e.type.startsWith("handshake:error")) return e.type
        }
      })
      return { sub, outcome }
    })

  it.live("the PUB is admins' only: an admin's SUB completes its handshake and reads the stream, tenant A's is refused by ZAP", () =>
    Effect.gen(function*() {
      const admin = yield* subscriber(keys.clients["admin"]!)
      assert.strictEqual(admin.outcome, "handshake")
      const refused = yield* subscriber(keys.clients["a"]!)
      assert.strictEqual(refused.outcome, "handshake:error:auth")
      const a = yield* clientFor(keys.clients["a"])
      yield* storeOne(a, 21n)
      // The admin hears the store (batch 0, sent before it joined, is the replay's).
      const [, seq, payload] = yield* Effect.promise(() => admin.sub.receive())
      const batch = decodeKvEventBatch(payload!)
      assert.notInstanceOf(batch, KvEventBatchInvalid)
      assert.deepStrictEqual([seqOf(seq!), (batch as { events: ReadonlyArray<VllmKvEvent> }).events.map((e) => e._tag)], [1, ["BlockStored"]])
    }).pipe(Effect.scoped, Effect.provide(curvePub)))

  it.live("tenant A reads only its salt group's record, tenant B only its own, an admin both", () =>
    Effect.gen(function*() {
      const a = yield* clientFor(keys.clients["a"])
      const b = yield* clientFor(keys.clients["b"])
      const admin = yield* clientFor(keys.clients["admin"])
      yield* storeOne(a, 11n)
      yield* storeOne(b, 12n)
      const read = (c: MqClient["Service"]) =>
        Effect.map(c.request(PollKvEvents, ["m", 0, 100]), (p) => ({ cursor: p.next_cursor, records: p.events.map((e) => [e.seq, e.salt_group]) }))
      const ofA = yield* read(a)
      const ofB = yield* read(b)
      const all = yield* read(admin)
      // Same tokens, two salt groups: two chunks, each announced to its own tenant.
      assert.strictEqual(ofA.records.length, 1)
      assert.strictEqual(ofB.records.length, 1)
      assert.notStrictEqual(ofA.records[0]![1], ofB.records[0]![1])
      assert.deepStrictEqual(all, { cursor: 2, records: [ofA.records[0]!, ofB.records[0]!] })
      assert.deepStrictEqual([ofA.cursor, ofB.cursor], [2, 2])
    }).pipe(Effect.scoped, Effect.provide(server)))
})

describe("KV events on vLLM's PUB and replay ROUTER (real ZeroMQ sockets)", () => {
  const dir = mkdtempSync(join(tmpdir(), "mpcache-kvpub-"))
  const pubAt = `ipc://${join(dir, "pub")}`
  const replayAt = `ipc://${join(dir, "replay")}`

  /** The next message of `sub` as [topic, seq, batch]. */
  const next = (sub: zmq.Subscriber) =>
    Effect.promise(() => sub.receive()).pipe(Effect.map(([topic, seq, payload]) => {
      const batch = decodeKvEventBatch(payload!)
      if (batch instanceof KvEventBatchInvalid) throw batch
      return { topic: topic!.toString(), seq: seqOf(seq!), batch }
    }))

  it.live("batch 0 says AllBlocksCleared, a STORE's four chunks arrive as BlockStored in one batch, and a replay from 0 sends both then END_SEQ", () =>
    Effect.gen(function*() {
      const sub = yield* Effect.acquireRelease(Effect.sync(() => new zmq.Subscriber({ linger: 0 })), (s) => Effect.sync(() => s.close()))
      sub.connect(pubAt)
      sub.subscribe("kv-events")
      const a = yield* newCache()
      yield* register(1n, a)
      yield* writeTokens(a, 1, [1, 2, 3, 4, 5, 6, 7, 8])
      // A SUB joins asynchronously: batch 0 went out before it; it learns of it by the gap and replays.
      yield* storeFrom(1n, tokens)
      // The drain publishes what it finds when it wakes: one batch or several, numbered on from 1.
      const live: Array<VllmKvEvent> = []
      const seqs: Array<number | undefined> = []
      while (live.length < 4) {
        const m = yield* next(sub)
        assert.strictEqual(m.topic, "kv-events")
        seqs.push(m.seq)
        live.push(...m.batch.events)
      }
      assert.deepStrictEqual(seqs, seqs.map((_, i) => i + 1))
      const hashes = chunkHashes(tokens, CHUNK, 4)
      assert.deepStrictEqual(
        live,
        [0, 1, 2, 3].map((i) => ({
          _tag: "BlockStored",
          blockHashes: [Buffer.from(hashes[i]!)],
          parentBlockHash: i === 0 ? null : Buffer.from(hashes[i - 1]!),
          tokenIds: tokens.slice(i * CHUNK, (i + 1) * CHUNK),
          blockSize: CHUNK,
          loraId: null,
          medium: "CPU"
        }))
      )
      const replay = yield* Effect.acquireRelease(Effect.sync(() => new zmq.Dealer({ linger: 0 })), (s) => Effect.sync(() => s.close()))
      replay.connect(replayAt)
      yield* Effect.promise(() => replay.send([Buffer.alloc(0), seqFrame(0)]))
      const got: Array<number | undefined> = []
      const replayed: Array<VllmKvEvent> = []
      for (;;) {
        const [, seq, payload] = yield* Effect.promise(() => replay.receive())
        if (payload!.length === 0) {
          assert.strictEqual(seqOf(seq!), -1)
          break
        }
        const b = decodeKvEventBatch(payload!)
        if (b instanceof KvEventBatchInvalid) throw b
        got.push(seqOf(seq!))
        replayed.push(...b.events)
      }
      assert.deepStrictEqual(got, [0, ...seqs])
      assert.deepStrictEqual(replayed, [{ _tag: "AllBlocksCleared" }, ...live])
      const n = seqs.length + 1
      const status = (yield* kvStatus)["publisher"] as Record<string, unknown>
      assert.deepStrictEqual(
        { ...status, subscribers: (status["subscribers"] as number) >= 1 },
        {
          endpoint: pubAt,
          replay_endpoint: replayAt,
          topic: "kv-events",
          subscribers: true,
          batches_published: n,
          next_seq: n,
          replay_buffer: { batches: n, bytes: (status["replay_buffer"] as { bytes: number }).bytes, oldest_seq: 0 },
          replays_served: 1,
          replay_batches_sent: n,
          replays_cut: 0,
          malformed_replays: 0,
          log_overflows: 0
        }
      )
    }).pipe(Effect.scoped, Effect.provide(env({ kvEventsEndpoint: pubAt, kvEventsReplayEndpoint: replayAt }))))
})

describe("the client's KV index streams (mpcache/client)", () => {
  const dir = mkdtempSync(join(tmpdir(), "mpcache-kvstream-"))
  const pubAt = `ipc://${join(dir, "pub")}`
  const replayAt = `ipc://${join(dir, "replay")}`

  /** Runs `updates` until its first Removed, while a STORE of 4 chunks and a CLEAR happen; the updates seen. */
  const storeAndClear = (updates: Stream.Stream<KvIndexUpdate, unknown>) =>
    Effect.gen(function*() {
      const a = yield* newCache()
      yield* register(1n, a)
      yield* writeTokens(a, 1, [1, 2, 3, 4, 5, 6, 7, 8])
      const index = makeKvIndex()
      const seen = yield* Effect.forkChild(
        updates.pipe(Stream.tap((u) => Effect.sync(() => index.apply(u))), Stream.takeUntil((u) => u._tag === "Removed"), Stream.runCollect)
      )
      yield* storeFrom(1n, tokens)
      // The index follows the server: the four chunks, before the CLEAR.
      const hashes = chunkHashes(tokens, CHUNK, 4).map(hashHex)
      yield* Effect.flatMap(MqClient, (c) => c.request(Clear, [false]))
      const all = yield* Fiber.join(seen)
      return { all, index, hashes }
    })

  it.live("over POLL_KV_EVENTS: 4 Stored with their parents, then one Removed of all four; the index ends empty", () =>
    Effect.gen(function*() {
      const client = yield* MqClient
      const { all, index, hashes } = yield* storeAndClear(pollKvIndexUpdates(client, { model: "tiny", intervalMs: 10 }))
      assert.deepStrictEqual(all.map((u) => u._tag === "Reset" ? "Reset" : `${u._tag}:${u.hashes.map((h) => hashHex(h as Uint8Array)).join(",")}`), [
        ...hashes.map((h) => `Stored:${h}`),
        `Removed:${hashes.join(",")}`
      ])
      assert.deepStrictEqual(index.hashes(), [])
    }).pipe(Effect.scoped, Effect.provide(env())))

  it.live("over POLL_KV_EVENTS a `lost` answer resyncs: Reset first, then what the log kept", () =>
    Effect.gen(function*() {
      const a = yield* newCache()
      yield* register(1n, a)
      yield* writeTokens(a, 1, [1, 2, 3, 4, 5, 6, 7, 8])
      yield* storeFrom(1n, tokens)
      const client = yield* MqClient
      const first = yield* pollKvIndexUpdates(client, { model: "tiny", intervalMs: 10 }).pipe(Stream.take(4), Stream.runCollect)
      const hashes = chunkHashes(tokens, CHUNK, 4).map(hashHex)
      assert.deepStrictEqual(first.map((u) => u._tag === "Stored" ? hashHex(u.hashes[0] as Uint8Array) : u._tag), ["Reset", ...hashes.slice(1)])
    }).pipe(Effect.scoped, Effect.provide(env({ kvEventLogSize: 3 }))))

  it.live("over the PUB and its replay: Reset (batch 0), 4 Stored, one Removed; the index ends empty", () =>
    Effect.gen(function*() {
      const { all, index, hashes } = yield* storeAndClear(subscribeKvIndexUpdates({ endpoint: pubAt, replayEndpoint: replayAt }))
      assert.deepStrictEqual(all.map((u) => u._tag === "Reset" ? "Reset" : `${u._tag}:${u.hashes.map((h) => hashHex(h as Uint8Array)).join(",")}`), [
        "Reset",
        ...hashes.map((h) => `Stored:${h}`),
        `Removed:${hashes.join(",")}`
      ])
      assert.deepStrictEqual(index.hashes(), [])
    }).pipe(Effect.scoped, Effect.provide(env({ kvEventsEndpoint: pubAt, kvEventsReplayEndpoint: replayAt }))))
})
