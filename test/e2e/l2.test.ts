/**
 * The L2 tier end to end (issue 15): real redis-server processes, two real
 * `mpcache serve` processes sharing one L2, and a worker in this process
 * (real shared memory, real ZeroMQ). Skipped, loudly, where redis-server is
 * not installed.
 */
import { assert, it } from "@effect/vitest"
import { Effect, Schedule } from "effect"
import { EndSession, Lookup, PollKvEvents, QueryPrefetchStatus, Retrieve, Store } from "../../src/schema/Op.ts"
import type { MqClientShape } from "../../src/services/client/MqClient.ts"
import { chunkHashes } from "../../src/services/kv/TokenHasher.ts"
import { HEADER_BYTES } from "../../src/services/server/l2/L2Value.ts"
import { runCli } from "../support/Cli.ts"
import { verifyTokens, writeTokens } from "../support/KvData.ts"
import { eventually, getText, statusOf } from "../support/LiveFleet.ts"
import { CHUNK, keyOf, l2KeyOfChunk, lookupPrefix, objectLayout, range, serverWithWorker, tokensOf, WorkerEnv } from "../support/L2Worker.ts"
import { startRedis, startRedisCluster } from "../support/RedisFleet.ts"
import { redisSuite } from "../support/RedisSuite.ts"

const EVENT = new Uint8Array([9])

const metric = (text: string, name: string) => {
  const line = text.split("\n").find((l) => l.startsWith(`${name} `) || l.startsWith(`${name}{`))
  return line === undefined ? undefined : Number(line.slice(line.lastIndexOf(" ") + 1))
}

/** A server's KV event log as [kind, medium, chunk index of `tokens`…] per record (issue 28 item 2). */
const eventsOf = (client: MqClientShape, tokens: ReadonlyArray<number>) =>
  Effect.map(client.request(PollKvEvents, ["tiny", 0, 100]), (p) => {
    const hex = chunkHashes(tokens, CHUNK, tokens.length / CHUNK).map((h) => Buffer.from(h).toString("hex"))
    return p.events.map((e) => [e.kind, e.medium, ...e.block_hashes.map((h) => hex.indexOf(Buffer.from(h).toString("hex")))])
  })

redisSuite("L2 on a real redis-server", () => {
  it.live("two servers share L2: STORE through A, LOOKUP and RETRIEVE byte-exact through B; a corrupt value is a miss, deleted and counted", () =>
    Effect.gen(function*() {
      const redis = yield* startRedis()
      const a = yield* serverWithWorker(redis.url, 1n)
      const b = yield* serverWithWorker(redis.url, 2n)
      const tokens = tokensOf(4 * CHUNK, 1)
      const blocksA = range(0, 16)
      yield* writeTokens(a.cache, 5, blocksA)
      assert.deepStrictEqual(yield* a.client.request(Store, [keyOf(tokens), a.id, [blocksA], EVENT]), [EVENT, true])
      const aStatus = yield* eventually(statusOf(a.httpPort), (s) => s.l2?.writes === 4, 10_000)
      assert.deepInclude(aStatus.l2, { url: redis.url, state: "ok", writes: 4, queue_depth: 0, inflight_bytes: 0 })
      assert.strictEqual(redis.cli("DBSIZE"), "4")
      assert.strictEqual(redis.cli("STRLEN", l2KeyOfChunk(tokens, 0)), String(HEADER_BYTES + objectLayout.chunkBytes))

      // B never saw these chunks: all four come from L2.
      const key = keyOf(tokens)
      assert.strictEqual(yield* lookupPrefix(b.client, key), 4)
      const blocksB = range(100, 16).reverse()
      assert.deepStrictEqual(yield* b.client.request(Retrieve, [key, b.id, [blocksB], EVENT, 0]), [EVENT, true])
      assert.deepStrictEqual(yield* verifyTokens(b.cache, 5, blocksB), [])
      yield* b.client.request(EndSession, [key.request_id])
      const bStatus = yield* statusOf(b.httpPort)
      assert.deepInclude(bStatus.l2, { state: "ok", hit_chunks: 4, corrupt_values: 0 })
      assert.deepInclude(bStatus.l1, { objects: 4, locked_objects: 0 })
      assert.strictEqual(bStatus.lookup.hit_chunks, 0) // none of them was in B's L1
      const summary = yield* runCli(["status", "--http-port", String(b.httpPort)])
      assert.include(summary.stdout, "hit ratio 0.0% (0 of 4 chunks) · L2 ok\n")
      assert.include(summary.stdout, `\nL2        ${redis.url} · ok · 0 B in flight (0 writes) · 0 written · 0 dropped · 4 hit chunks · 0 corrupt · not authenticated\n`)

      // A longer prompt through a third server: chunk 2 of its value is corrupted in Redis.
      const c = yield* serverWithWorker(redis.url, 3n)
      redis.cli("SETRANGE", l2KeyOfChunk(tokens, 2), String(HEADER_BYTES + 100), "X")
      assert.strictEqual(yield* lookupPrefix(c.client, keyOf(tokens)), 2)
      assert.strictEqual(redis.cli("EXISTS", l2KeyOfChunk(tokens, 2)), "0")
      assert.deepInclude((yield* statusOf(c.httpPort)).l2, { corrupt_values: 1, state: "ok" })
      const metrics = yield* getText(`http://127.0.0.1:${c.httpPort}/metrics`)
      assert.include(metrics, `mpcache_l2_corrupt_values_total{reason="checksum"} 1`)
      assert.strictEqual(metric(metrics, "mpcache_l2_hits_total"), 4)
      // C's prefetch GETs all four at once (the corrupt one is found when it arrives): bytes in, a latency sample
      // per GET and one per EXISTS batch.
      assert.strictEqual(metric(metrics, "mpcache_l2_bytes_in_total"), 4 * (HEADER_BYTES + objectLayout.chunkBytes))
      assert.include(metrics, `mpcache_l2_command_seconds_count{op="GET"} 4`)
      assert.include(metrics, `mpcache_l2_command_seconds_count{op="EXISTS"} 1`)
      const aMetrics = yield* getText(`http://127.0.0.1:${a.httpPort}/metrics`)
      assert.strictEqual(metric(aMetrics, "mpcache_l2_bytes_out_total"), 4 * (HEADER_BYTES + objectLayout.chunkBytes))
      assert.include(aMetrics, `mpcache_l2_command_seconds_count{op="SET"} 4`)
      // What the routers heard: A stored the chunks in CPU, then (each SET done) in STORAGE; B fetched them into
      // CPU; C fetched chunks 0, 1 and 3 into CPU and found chunk 2's value corrupt: it left STORAGE.
      const stored = (medium: string) => [0, 1, 2, 3].map((i) => ["stored", medium, i])
      assert.deepStrictEqual(yield* eventsOf(a.client, tokens), [...stored("CPU"), ...stored("STORAGE")])
      assert.deepStrictEqual(yield* eventsOf(b.client, tokens), stored("CPU"))
      assert.sameDeepMembers(yield* eventsOf(c.client, tokens), [["stored", "CPU", 0], ["stored", "CPU", 1], ["stored", "CPU", 3], ["removed", "STORAGE", 2]])
    }).pipe(Effect.scoped, Effect.provide(WorkerEnv)), 60_000)

  it.live("redis killed: LOOKUP answers from L1 at once, the breaker opens, STORE still succeeds; it closes when redis is back", () =>
    Effect.gen(function*() {
      const redis = yield* startRedis()
      const a = yield* serverWithWorker(redis.url, 1n, { flags: ["--l2-breaker-failures", "2", "--l2-breaker-probe-ms", "200"] })
      const tokens = tokensOf(6 * CHUNK, 2)
      yield* writeTokens(a.cache, 6, range(0, 24))
      yield* a.client.request(Store, [keyOf(tokens, { end: 4 * CHUNK }), a.id, [range(0, 16)], EVENT])
      yield* eventually(statusOf(a.httpPort), (s) => s.l2?.writes === 4, 10_000)
      yield* redis.kill
      // L1 holds 4 of the 6 chunks; L2 cannot answer: the prefix is L1's, and the job is done at once (never nil).
      for (let i = 0; i < 3; i++) {
        const key = keyOf(tokens)
        yield* a.client.request(Lookup, [{ ...key, worker_id: null }, 1])
        assert.strictEqual(yield* a.client.request(QueryPrefetchStatus, [key.request_id]), 4)
      }
      const open = yield* eventually(statusOf(a.httpPort), (s) => s.l2?.state !== "ok", 5_000)
      assert.notStrictEqual(open.l2?.state, "ok")
      assert.isTrue(open.l2 !== null && open.l2.breaker_opened >= 1 && open.l2.last_error !== null)
      // A STORE never waits for L2: it succeeds, its write is skipped (counted).
      const more = tokensOf(2 * CHUNK, 3)
      assert.deepStrictEqual(yield* a.client.request(Store, [keyOf(more), a.id, [range(16, 8)], EVENT]), [EVENT, true])
      assert.isTrue(((yield* statusOf(a.httpPort)).l2?.dropped_writes ?? 0) >= 2)
      yield* redis.restart
      const closed = yield* eventually(statusOf(a.httpPort), (s) => s.l2?.state === "ok", 15_000)
      assert.deepInclude(closed.l2, { state: "ok" })
      assert.isTrue(closed.l2 !== null && closed.l2.breaker_closed >= 1)
      // Writes resume: a new STORE reaches the (empty) restarted redis.
      const again = tokensOf(2 * CHUNK, 4)
      yield* a.client.request(Store, [keyOf(again), a.id, [range(16, 8)], EVENT])
      yield* eventually(Effect.sync(() => redis.cli("DBSIZE")), (n) => n === "2", 10_000)
      assert.strictEqual(redis.cli("DBSIZE"), "2")
    }).pipe(Effect.scoped, Effect.provide(WorkerEnv)), 60_000)

  it.live("eviction under maxmemory with allkeys-lru: the evicted chunks are misses, never errors", () =>
    Effect.gen(function*() {
      const redis = yield* startRedis(["--maxmemory-policy", "allkeys-lru"])
      const a = yield* serverWithWorker(redis.url, 1n)
      const b = yield* serverWithWorker(redis.url, 2n)
      // Room for about 64 values of 12 KiB beside what redis uses already; 8 prompts of 16 chunks are 128 values.
      const used = Number(/used_memory:(\d+)/.exec(redis.cli("INFO", "memory"))?.[1])
      redis.cli("CONFIG", "SET", "maxmemory", String(used + 64 * (HEADER_BYTES + objectLayout.chunkBytes)))
      const prompts = range(0, 8).map((p) => tokensOf(16 * CHUNK, 10 + p))
      for (const [p, tokens] of prompts.entries()) {
        yield* writeTokens(a.cache, p, range(0, 64))
        yield* a.client.request(Store, [keyOf(tokens), a.id, [range(0, 64)], EVENT])
        yield* eventually(statusOf(a.httpPort), (s) => s.l2?.queue_depth === 0, 10_000)
      }
      const s = yield* statusOf(a.httpPort)
      assert.strictEqual((s.l2?.writes ?? 0) + (s.l2?.failed_writes ?? 0), 128)
      assert.isBelow(Number(redis.cli("DBSIZE")), 128)
      const evicted = Number(/evicted_keys:(\d+)/.exec(redis.cli("INFO", "stats"))?.[1])
      assert.isAbove(evicted, 0)
      // The first prompt is the least recently used: B finds less of it than was stored, and says so as a shorter prefix.
      const prefix = yield* lookupPrefix(b.client, keyOf(prompts[0]!))
      assert.isBelow(prefix, 16)
      const bStatus = yield* statusOf(b.httpPort)
      assert.deepInclude(bStatus.l2, { state: "ok", last_error: null, corrupt_values: 0 })
    }).pipe(Effect.scoped, Effect.provide(WorkerEnv)), 90_000)

  it.live("a Cluster of 3 masters + 3 replicas: keys land on every master; kill -9 of a master during transfers: replica promoted, nothing corrupt, writes resume", () =>
    Effect.gen(function*() {
      const cluster = yield* startRedisCluster(3, 1)
      const a = yield* serverWithWorker(cluster.url, 1n)
      const b = yield* serverWithWorker(cluster.url, 2n)
      const tokens = tokensOf(16 * CHUNK, 20)
      yield* writeTokens(a.cache, 8, range(0, 64))
      yield* a.client.request(Store, [keyOf(tokens), a.id, [range(0, 64)], EVENT])
      yield* eventually(statusOf(a.httpPort), (s) => s.l2?.writes === 16, 10_000)
      const masters = cluster.masterPorts()
      assert.strictEqual(masters.length, 3)
      const perMaster = masters.map((port) => Number(cluster.nodes.find((n) => n.port === port)!.cli("DBSIZE")))
      assert.strictEqual(perMaster.reduce((x, y) => x + y, 0), 16)
      assert.isTrue(perMaster.every((n) => n > 0), `keys per master: ${perMaster.join(", ")}`)
      const key = keyOf(tokens)
      assert.strictEqual(yield* lookupPrefix(b.client, key), 16)
      yield* b.client.request(Retrieve, [key, b.id, [range(100, 64)], EVENT, 0])
      assert.deepStrictEqual(yield* verifyTokens(b.cache, 8, range(100, 64)), [])
      yield* b.client.request(EndSession, [key.request_id])

      // kill -9 one master while A stores and B looks up.
      const victim = cluster.nodes.find((n) => n.port === masters[0])!
      yield* victim.kill
      for (let p = 0; p < 4; p++) {
        const t = tokensOf(4 * CHUNK, 30 + p)
        yield* writeTokens(a.cache, 30 + p, range(0, 16))
        assert.deepStrictEqual(yield* a.client.request(Store, [keyOf(t), a.id, [range(0, 16)], EVENT]), [EVENT, true])
        const n = yield* lookupPrefix(b.client, keyOf(tokens))
        assert.isTrue(n >= 0 && n <= 16)
      }
      // Its replica takes over (cluster-node-timeout 2 s; tens of seconds on a loaded machine, hence up to 100 tries);
      // then a new prompt goes all the way through again.
      let attempt = 0
      const c = yield* Effect.gen(function*() {
        const before = (yield* statusOf(a.httpPort)).l2?.writes ?? 0
        // A new prompt each attempt: a prompt already in L1 is not stored (nor written through) again.
        const t = tokensOf(4 * CHUNK, 40 + attempt++)
        yield* writeTokens(a.cache, 40, range(0, 16))
        yield* a.client.request(Store, [keyOf(t), a.id, [range(0, 16)], EVENT])
        yield* eventually(statusOf(a.httpPort), (s) => s.l2?.queue_depth === 0, 10_000)
        const after = (yield* statusOf(a.httpPort)).l2?.writes ?? 0
        return after - before === 4 ? t : yield* Effect.fail(new Error(`${after - before} of 4 written`))
      }).pipe(Effect.retry({ schedule: Schedule.spaced("500 millis"), times: 100 }), Effect.orDie)
      const cKey = keyOf(c)
      // c is new to B: all four chunks come from L2.
      assert.strictEqual(yield* lookupPrefix(b.client, cKey), 4)
      yield* b.client.request(Retrieve, [cKey, b.id, [range(200, 16)], EVENT, 0])
      assert.deepStrictEqual(yield* verifyTokens(b.cache, 40, range(200, 16)), [])
      assert.strictEqual((yield* statusOf(b.httpPort)).l2?.corrupt_values, 0)
      assert.strictEqual(cluster.masterPorts().length, 3)
    }).pipe(Effect.scoped, Effect.provide(WorkerEnv)), 120_000)

  it.live("an unreachable L2 at start: a WARNING, and the server serves from L1; an ACL user limited to the prefix works, its password never shown", () =>
    Effect.gen(function*() {
      const redis = yield* startRedis()
      const port = redis.port
      yield* redis.kill
      const a = yield* serverWithWorker(`redis://127.0.0.1:${port}`, 1n)
      yield* a.server.waitForStderr(/L2 redis:\/\/127\.0\.0\.1:\d+ is unreachable \(.+\); serving from L1 only, connecting in the background/, 10_000)
      // Honest from the start: the breaker probes at once, and its failed first PING opens it (never "ok" while unreachable).
      const down = (yield* eventually(statusOf(a.httpPort), (s) => s.l2?.state === "open", 10_000)).l2
      assert.isTrue(down !== null && down.state === "open" && !down.connected && /ECONNREFUSED/.test(down.last_error ?? ""), JSON.stringify(down))
      assert.deepInclude(down, { breaker_opened: 1, breaker_closed: 0 })
      const tokens = tokensOf(2 * CHUNK, 50)
      yield* writeTokens(a.cache, 50, range(0, 8))
      assert.deepStrictEqual(yield* a.client.request(Store, [keyOf(tokens), a.id, [range(0, 8)], EVENT]), [EVENT, true])
      assert.strictEqual(yield* lookupPrefix(a.client, keyOf(tokens)), 2)

      // A user that may touch mpc:* only (and PING), over another redis.
      const acl = yield* startRedis()
      acl.cli("ACL", "SETUSER", "mpcache", "on", ">s3cret", "~mpc:*", "+ping", "+exists", "+get", "+set", "+del")
      const b = yield* serverWithWorker(`redis://mpcache:s3cret@127.0.0.1:${acl.port}`, 2n)
      yield* writeTokens(b.cache, 51, range(0, 8))
      yield* b.client.request(Store, [keyOf(tokens), b.id, [range(0, 8)], EVENT])
      const s = yield* eventually(statusOf(b.httpPort), (s) => s.l2?.writes === 2, 10_000)
      assert.deepInclude(s.l2, { url: `redis://mpcache:***@127.0.0.1:${acl.port}`, state: "ok", connected: true, writes: 2, failed_writes: 0, last_error: null })
      assert.strictEqual(acl.cli("DBSIZE"), "2")
      assert.notInclude(b.server.stderr(), "s3cret")
    }).pipe(Effect.scoped, Effect.provide(WorkerEnv)), 60_000)
})
