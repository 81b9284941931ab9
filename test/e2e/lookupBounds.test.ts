/**
 * Issue 24 items 5 and 6, performed against a real `mpcache serve` child
 * process by raw DEALERs that send what the real client never would:
 *
 * - a huge `world_size` (REGISTER, engine-driven REGISTER, LOOKUP with
 *   `worker_id` nil): each a `bad_request` naming the field and its maximum;
 *   then LOOKUPs at the largest world size allowed, whose work is bounded by
 *   what L1 holds — another client's PING is answered meanwhile;
 * - LOOKUPs that keep state: an over-long `request_id` is a `bad_request`;
 *   3,000 LOOKUPs of a model nobody registered keep nothing; 3,000 LOOKUPs
 *   with fresh ids that hit, then more from two other peers, stay at the
 *   flags' bounds with the oldest released and counted exactly, while the
 *   worker that stored the chunk still retrieves it.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect, Exit, Fiber } from "effect"
import { decodeResponse, pack, type ReplyHeader } from "../../src/schema/Frame.ts"
import { MAX_REQUEST_ID_LENGTH, MAX_WORLD_SIZE } from "../../src/schema/Limits.ts"
import {
  CommitStore,
  EndSession,
  Lookup,
  type Op,
  Ping,
  PrepareRetrieve,
  PrepareStore,
  QueryPrefetchStatus,
  RegisterKvCache,
  RegisterKvCacheEngineDrivenContext,
  type ResponseOf
} from "../../src/schema/Op.ts"
import { runCli } from "../support/Cli.ts"
import { getText, ipcEndpoint, startServer, statusOf } from "../support/LiveFleet.ts"
import { type RawDealer, rawCall, rawDealer } from "../support/RawDealer.ts"

/** startServer's --chunk-size. */
const CHUNK = 64
/** The engine-driven layout the tests register: [2, 1 layer, 64 tokens, 1] uint8 = 128-byte chunk objects. */
const CHUNK_BYTES = 2 * CHUNK
const tokensOf = (n: number) => Array.from({ length: n }, (_, i) => (i * 7 + 3) % 32000)

const keyOf = (over: Record<string, unknown>) => ({
  model_name: "victim-model",
  world_size: 1,
  worker_id: 0,
  token_ids: tokensOf(CHUNK),
  start: 0,
  end: CHUNK,
  request_id: "worker-0",
  cache_salt: "",
  ...over
})

const contextOf = (instanceId: bigint, modelName: string, worldSize: number) => ({
  instance_id: instanceId,
  model_name: modelName,
  world_size: worldSize,
  block_size: CHUNK,
  num_layers: 1,
  hidden_dim_size: 1,
  dtype_str: "uint8",
  use_mla: false
})

/** The decoded response of a success reply (a failed assertion otherwise). */
const okOf = <O extends Op>(op: O, h: ReplyHeader): ResponseOf<O> => {
  if (h._tag === "Error") return assert.fail(`${op.name}: expected success, got ${h.error.code}: ${h.error.message}`)
  const r = decodeResponse(op, h.body)
  if (Exit.isFailure(r)) return assert.fail(`${op.name}: the response does not decode`)
  return r.value
}

/** The error of an error reply as `{code, message}` (a failed assertion otherwise). */
const errorOf = (h: ReplyHeader) =>
  h._tag === "Error" ? { code: h.error.code, message: h.error.message } : assert.fail("expected an error reply")

/** A client with its own uid counter. */
const clientOf = (raw: RawDealer) => {
  let uid = 0
  return {
    raw,
    call: (op: Op, values: ReadonlyArray<unknown>) => rawCall(raw, ++uid, op, values),
    /** Sends `count` requests of `op` (values of the i-th from `valuesAt`) in batches of 250, then reads their replies. */
    flood: (op: Op, count: number, valuesAt: (i: number) => ReadonlyArray<unknown>) =>
      Effect.gen(function*() {
        const tags: Record<string, number> = {}
        for (let sent = 0; sent < count; sent += 250) {
          const n = Math.min(250, count - sent)
          for (let i = 0; i < n; i++) yield* raw.send([pack(++uid), pack(op.id), ...valuesAt(sent + i).map((v) => pack(v))])
          for (let i = 0; i < n; i++) {
            const m = yield* raw.receive(30_000)
            if (m === undefined) return assert.fail(`${op.name}: reply ${sent + i} of ${count} did not arrive within 30 s`)
            const tag = m.length === 4 ? "error" : "ok"
            tags[tag] = (tags[tag] ?? 0) + 1
          }
        }
        return tags
      })
  }
}

/** Stores chunk 0 of `key` through engine-driven instance `id` (inline bytes). */
const storeChunk = (c: ReturnType<typeof clientOf>, id: bigint, key: Record<string, unknown>, fill: number) =>
  Effect.gen(function*() {
    const prepared = okOf(PrepareStore, yield* c.call(PrepareStore, [key, id]))
    assert.strictEqual(prepared.context.slots.length, 1)
    assert.isTrue(okOf(CommitStore, yield* c.call(CommitStore, [key, id, new Uint8Array(CHUNK_BYTES).fill(fill)])))
  })

const server = (flags: ReadonlyArray<string>) =>
  Effect.gen(function*() {
    const endpoint = ipcEndpoint()
    const { server, httpPort } = yield* startServer(endpoint, ["--no-l1-prefault", "--l1-size-gb", "0.0625", "--engine-driven-transport", "inline", ...flags])
    return { endpoint, server, httpPort }
  })

const sampleOf = (metrics: string, series: string) =>
  metrics.split("\n").find((l) => l.startsWith(`${series} `))?.slice(series.length + 1)

describe("a huge world_size (issue 24 item 5)", () => {
  it.live("REGISTER, engine-driven REGISTER and LOOKUP with world_size 100,000,000 are bad_requests naming the maximum; LOOKUPs at the largest world size do work bounded by L1 while another client's PING is answered", () =>
    Effect.scoped(Effect.gen(function*() {
      const { endpoint, httpPort } = yield* server([])
      const attacker = clientOf(yield* rawDealer(endpoint))
      const bystander = clientOf(yield* rawDealer(endpoint))
      const huge = 100_000_000
      const register = yield* attacker.call(RegisterKvCache, [
        11n,
        [{ kind: "cpu_shm", shm_name: "mpcache-issue24-tiny", device_uuid: "cpu", nbytes: 4096, dtype: "uint8", shape: [2, 1, 64, 1, 1], stride: [64, 64, 1, 1, 1], storage_offset: 0 }],
        "tiny",
        huge,
        "vllm",
        {},
        []
      ])
      assert.deepStrictEqual(errorOf(register), {
        code: "bad_request",
        message: "register_kv_cache: payload 3 (world_size): must be at most 1024 (kv ranks, MAX_WORLD_SIZE); actual: 100000000"
      })
      const engineDriven = errorOf(yield* attacker.call(RegisterKvCacheEngineDrivenContext, [contextOf(12n, "tiny", huge)]))
      assert.strictEqual(engineDriven.code, "bad_request")
      assert.include(engineDriven.message, "register_kv_cache_engine_driven_context: payload 0 (context): must be at most 1024 (kv ranks, MAX_WORLD_SIZE)")
      const lookup = errorOf(yield* attacker.call(Lookup, [keyOf({ model_name: "tiny", world_size: huge, worker_id: null }), huge]))
      assert.strictEqual(lookup.code, "bad_request")
      assert.include(lookup.message, "lookup: payload 0 (key): must be at most 1024 (kv ranks, MAX_WORLD_SIZE)")
      assert.isTrue(okOf(Ping, yield* bystander.call(Ping, [null])))

      // The largest world size allowed, a registered layout, chunk 0 stored for ranks 0..2 of 1024.
      okOf(RegisterKvCacheEngineDrivenContext, yield* attacker.call(RegisterKvCacheEngineDrivenContext, [contextOf(13n, "tiny", MAX_WORLD_SIZE)]))
      const wide = (over: Record<string, unknown>) => keyOf({ model_name: "tiny", world_size: MAX_WORLD_SIZE, ...over })
      for (const rank of [0, 1, 2]) yield* storeChunk(attacker, 13n, wide({ worker_id: rank, request_id: `store-${rank}` }), rank + 1)
      // 200 LOOKUPs over every rank of 1024 for a 64-chunk prompt, pipelined; the bystander's PING is answered
      // while they are queued (the deadline only bounds a hang).
      const prompt = tokensOf(64 * CHUNK)
      const flood = yield* Effect.forkChild(
        attacker.flood(Lookup, 200, (i) => [wide({ worker_id: null, token_ids: prompt, end: prompt.length, request_id: `wide-${i}` }), MAX_WORLD_SIZE])
      )
      assert.isTrue(okOf(Ping, yield* bystander.call(Ping, [null])))
      assert.deepStrictEqual(yield* Fiber.join(flood), { ok: 200 })
      // Chunk 0 lacks rank 3: no hit, nothing kept.
      assert.strictEqual(okOf(QueryPrefetchStatus, yield* attacker.call(QueryPrefetchStatus, ["wide-199"])), 0)
      const status = yield* statusOf(httpPort)
      assert.deepInclude(status.lookup, { sessions: 0, held_locks: 0, pending_jobs: 0, lookups: 200, looked_up_chunks: 200 * 64 * MAX_WORLD_SIZE, hit_chunks: 0 })
      assert.strictEqual(status.l1.objects, 3)
    })), 120_000)
})

describe("LOOKUPs that keep state (issue 24 item 6)", () => {
  it.live("over-long request ids are refused; 3,000 LOOKUPs of an unregistered model keep nothing; fresh ids from three peers stay at the bounds, oldest released first and counted, while the worker still retrieves", () =>
    Effect.scoped(Effect.gen(function*() {
      const { endpoint, httpPort } = yield* server(["--max-pending-lookups", "8", "--max-pending-lookups-per-peer", "5"])
      const worker = clientOf(yield* rawDealer(endpoint))
      const a = clientOf(yield* rawDealer(endpoint))
      const b = clientOf(yield* rawDealer(endpoint))
      const c = clientOf(yield* rawDealer(endpoint))
      okOf(RegisterKvCacheEngineDrivenContext, yield* worker.call(RegisterKvCacheEngineDrivenContext, [contextOf(21n, "victim-model", 1)]))
      yield* storeChunk(worker, 21n, keyOf({}), 42)

      // The attack used 1 MiB ids: refused, naming the field and the maximum.
      const long = errorOf(yield* a.call(Lookup, [keyOf({ request_id: "x".repeat(1 << 20) }), 1]))
      assert.strictEqual(long.code, "bad_request")
      assert.include(long.message, `lookup: payload 0 (key): must have at most ${MAX_REQUEST_ID_LENGTH} characters (MAX_REQUEST_ID_LENGTH)`)
      const longQuery = errorOf(yield* a.call(QueryPrefetchStatus, ["x".repeat(MAX_REQUEST_ID_LENGTH + 1)]))
      assert.strictEqual(longQuery.code, "bad_request")

      // 3,000 LOOKUPs with unique ids of the longest length allowed, for a model nobody registered: nothing kept.
      const idOf = (prefix: string, i: number) => `${prefix}-${i}-`.padEnd(MAX_REQUEST_ID_LENGTH, "x")
      assert.deepStrictEqual(yield* a.flood(Lookup, 3000, (i) => [keyOf({ model_name: "nobody", request_id: idOf("u", i) }), 1]), { ok: 3000 })
      assert.deepInclude((yield* statusOf(httpPort)).lookup, { sessions: 0, held_locks: 0, pending_jobs: 0, peers: 0, lookups: 3000 })

      // 3,000 that hit the worker's chunk, from peer a: 5 stay (--max-pending-lookups-per-peer), 2,995 released.
      assert.deepStrictEqual(yield* a.flood(Lookup, 3000, (i) => [keyOf({ request_id: idOf("a", i) }), 1]), { ok: 3000 })
      const afterA = (yield* statusOf(httpPort)).lookup
      assert.deepInclude(afterA, { sessions: 5, held_locks: 5, pending_jobs: 5, peers: 1, max_pending_lookups: 8, max_pending_lookups_per_peer: 5 })
      assert.deepStrictEqual(afterA.released, { ttl: 0, max_pending_lookups_per_peer: 2995, max_pending_lookups: 0, max_lookup_locks: 0 })
      // One at a time from here, so that which ones are oldest is exact: a's last 5, then b's 5 and c's 1.
      for (let i = 0; i < 5; i++) okOf(Lookup, yield* a.call(Lookup, [keyOf({ request_id: `a-last-${i}` }), 1]))
      for (let i = 0; i < 5; i++) okOf(Lookup, yield* b.call(Lookup, [keyOf({ request_id: `b-${i}` }), 1]))
      okOf(Lookup, yield* c.call(Lookup, [keyOf({ request_id: "c-0" }), 1]))
      const afterC = (yield* statusOf(httpPort)).lookup
      assert.deepInclude(afterC, { sessions: 8, held_locks: 8, pending_jobs: 8, peers: 3 })
      assert.deepStrictEqual(afterC.released, { ttl: 0, max_pending_lookups_per_peer: 3000, max_pending_lookups: 3, max_lookup_locks: 0 })
      const answers: Record<string, number | null> = {}
      for (const id of ["a-last-0", "a-last-2", "a-last-3", "a-last-4", "b-0", "b-4", "c-0"]) {
        answers[id] = okOf(QueryPrefetchStatus, yield* c.call(QueryPrefetchStatus, [id]))
      }
      assert.deepStrictEqual(answers, { "a-last-0": 0, "a-last-2": 0, "a-last-3": 1, "a-last-4": 1, "b-0": 1, "b-4": 1, "c-0": 1 })
      const metrics = yield* getText(`http://127.0.0.1:${httpPort}/metrics`)
      assert.strictEqual(sampleOf(metrics, 'mpcache_lookup_sessions_released_total{reason="max_pending_lookups_per_peer"}'), "3000")
      assert.strictEqual(sampleOf(metrics, 'mpcache_lookup_sessions_released_total{reason="max_pending_lookups"}'), "3")

      // Everyone else is still served: a PING, and the worker's retrieve of its chunk under a released id.
      assert.isTrue(okOf(Ping, yield* worker.call(Ping, [21n])))
      const got = okOf(PrepareRetrieve, yield* worker.call(PrepareRetrieve, [keyOf({ request_id: idOf("a", 7) }), 21n]))
      assert.isTrue(got.success)
      assert.deepStrictEqual(Buffer.from(got.data), Buffer.alloc(CHUNK_BYTES, 42))

      for (const id of ["a-last-3", "a-last-4", "b-0", "b-1", "b-2", "b-3", "b-4", "c-0"]) okOf(EndSession, yield* c.call(EndSession, [id]))
      const ended = yield* statusOf(httpPort)
      assert.deepInclude(ended.lookup, { sessions: 0, held_locks: 0, pending_jobs: 0, peers: 0 })
      assert.strictEqual(ended.l1.locked_objects, 0)
    })), 180_000)

  it.live("serve refuses a per-peer bound above the server's, and a bound of 0: exit 2 naming the flag", () =>
    Effect.gen(function*() {
      const over = yield* runCli(["serve", "--max-pending-lookups", "4", "--max-pending-lookups-per-peer", "5"])
      assert.strictEqual(over.code, 2)
      assert.include(over.stderr, "--max-pending-lookups-per-peer: must not exceed --max-pending-lookups (4; got 5)")
      const zero = yield* runCli(["serve", "--max-lookup-locks", "0"])
      assert.strictEqual(zero.code, 2)
      assert.include(zero.stderr, "--max-lookup-locks")
      assert.include(zero.stderr, "must be an integer of at least 1 (got 0)")
    }), 60_000)
})
