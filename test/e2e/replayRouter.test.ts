/**
 * `mpcache replay --servers N --router kv-aware|round-robin` (issue 28 item 6): N real servers, a router fed only
 * by each server's KV event stream (its PUB and replay ROUTER), and the index audit — after the run, the router's
 * view of each server against that server's actual L1 (`GET /api/l1/chunks`). On a hand-made trace whose every
 * hit is known, both policies run in one invocation: round-robin reuses only what a conversation left on the
 * server its next turn lands on, kv-aware sends each turn to the server holding its prefix and matches the perfect
 * LRU. On a slice of the Mooncake trace with workers SIGKILLed and servers restarted by the run's progress, the
 * audit finds 0 chunks missing and 0 extra on every server.
 */
import { randomUUID } from "node:crypto"
import { readFileSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import type { ReplaySummary } from "../../src/replay/Driver.ts"
import { runCli } from "../support/Cli.ts"
import { startRedis } from "../support/RedisFleet.ts"
import { redisSuite } from "../support/RedisSuite.ts"

// Two conversations, 256-token chunks (2 per 512-token block), one turn every 3 s of trace time (1.5 s at --rate 2:
// each turn's STORE is heard by the router before the next turn is routed).
const TRACE = [
  { input_length: 1024, hash_ids: [1, 2] }, // 4 chunks
  { input_length: 1536, hash_ids: [1, 2, 3] }, // 6: r0's 4 are a prefix
  { input_length: 2048, hash_ids: [1, 2, 3, 4] }, // 8: r1's 6 are a prefix
  { input_length: 1024, hash_ids: [5, 6] }, // 4: a new conversation
  { input_length: 1536, hash_ids: [5, 6, 7] } // 6: r3's 4 are a prefix
].map((r, i) => ({ timestamp: 3000 * i, output_length: 1, ...r }))

const replay = (args: ReadonlyArray<string>) =>
  runCli(["replay", "--json", "--chunk-size", "256", "--l1-size-gb", "0.25", "--servers", "2", ...args], 180_000)

describe("mpcache replay --router", () => {
  it.live("kv-aware and round-robin on one trace: kv-aware follows each conversation (14 of 28 chunks, the perfect LRU), round-robin reuses 4; the audit is exact", () =>
    Effect.gen(function*() {
      const trace = join(tmpdir(), `mpcache-router-trace-${randomUUID()}.jsonl`)
      writeFileSync(trace, TRACE.map((r) => JSON.stringify(r)).join("\n"))
      const report = `${trace}.html`
      const r = yield* replay(["--trace", trace, "--rate", "2", "--workers", "1", "--router", "kv-aware,round-robin", "--report", report]).pipe(
        Effect.ensuring(Effect.sync(() => rmSync(trace, { force: true })))
      )
      assert.strictEqual(r.code, 0, r.stderr.slice(-3000))
      const { runs } = JSON.parse(r.stdout) as { readonly runs: ReadonlyArray<ReplaySummary> }
      const [kv, rr] = runs
      for (const s of [kv!, rr!]) {
        assert.deepStrictEqual([s.requests, s.failed_requests, s.data_mismatches, s.leaked_contexts, s.open_mappings_after_shutdown], [5, 0, 0, 0, 0])
        assert.deepStrictEqual([s.chunks.looked_up, s.perfect_lru_combined_hit_ratio], [28, 0.5])
      }
      // kv-aware: r0 to server 1 (nothing anywhere: the lowest index), r1 and r2 after it; r3 holds no prefix
      // anywhere and goes to server 2 (fewer requests so far), r4 after it.
      assert.deepStrictEqual(kv!.router, {
        policy: "kv-aware",
        audit: [
          { server: 1, l1_chunks: 8, router_chunks: 8, missing: 0, extra: 0 },
          { server: 2, l1_chunks: 6, router_chunks: 6, missing: 0, extra: 0 }
        ],
        server_restarts: 0
      })
      assert.deepStrictEqual([kv!.chunks.hit, kv!.hit_ratio], [14, 0.5])
      assert.deepStrictEqual(kv!.per_server, [
        { requests: 3, looked_up: 18, hit: 10, l2_hit: 0 },
        { requests: 2, looked_up: 10, hit: 4, l2_hit: 0 }
      ])
      // round-robin: each turn on the other server; only r2 finds r0's chunks.
      assert.deepStrictEqual(rr!.router, { policy: "round-robin", audit: null, server_restarts: 0 })
      assert.deepStrictEqual([rr!.chunks.hit, rr!.hit_ratio], [4, 0.1429])
      // The text report of both is not printed with --json; the HTML report compares them.
      const html = readFileSync(report, "utf8")
      rmSync(report, { force: true })
      assert.include(
        html,
        "<dt>routers compared</dt><dd>routers (same trace, same servers&#39; capacity; perfect LRU of the combined capacity 50.00%):\n" +
          "  kv-aware     hit ratio 50.00% (L1 50.00% · L2 0.00%) · audit 0 missing, 0 extra\n" +
          "  round-robin  hit ratio 14.29% (L1 14.29% · L2 0.00%)</dd>"
      )
      assert.include(
        html,
        "<dt>router</dt><dd>kv-aware: each request to the server whose KV event stream holds its longest prefix · index audit 14 chunks in L1, 0 missing, 0 extra</dd>"
      )
    }), 180_000)

  it.live("with workers SIGKILLed every 25 requests and a server restarted every 60, the index audit finds 0 missing and 0 extra", () =>
    Effect.gen(function*() {
      const r = yield* replay([
        "--requests", "150", "--max-rate", "--workers", "2", "--router", "kv-aware", "--kill-every-requests", "25", "--restart-server-every-requests", "60"
      ])
      assert.strictEqual(r.code, 0, r.stderr.slice(-3000))
      const s = JSON.parse(r.stdout) as ReplaySummary
      assert.deepStrictEqual([s.requests, s.data_mismatches, s.leaked_contexts, s.open_mappings_after_shutdown], [150, 0, 0, 0])
      assert.strictEqual(s.churn.killed, 5)
      assert.strictEqual(s.router.server_restarts, 2)
      assert.strictEqual(s.router.audit!.length, 2)
      for (const a of s.router.audit!) {
        assert.deepStrictEqual([a.missing, a.extra, a.router_chunks], [0, 0, a.l1_chunks])
        assert.isAbove(a.l1_chunks, 0)
      }
      assert.include(r.stderr, "restarted server 1 (now http://127.0.0.1:")
      assert.include(r.stderr, "restarted server 2 (now http://127.0.0.1:")
    }), 180_000)

  it.live("with --curve (per-run keys, the servers' L1 listing behind a per-run HTTP token) the audit reads through the token: 0 missing, 0 extra", () =>
    Effect.gen(function*() {
      const r = yield* replay(["--requests", "30", "--max-rate", "--workers", "1", "--router", "kv-aware", "--curve"])
      assert.strictEqual(r.code, 0, r.stderr.slice(-3000))
      const s = JSON.parse(r.stdout) as ReplaySummary
      assert.deepStrictEqual([s.requests, s.failed_requests, s.data_mismatches, s.leaked_contexts], [30, 0, 0, 0])
      assert.deepStrictEqual(s.router.audit!.map((a) => [a.missing, a.extra, a.router_chunks === a.l1_chunks]), [[0, 0, true], [0, 0, true]])
      assert.isAbove(s.router.audit!.reduce((n, a) => n + a.l1_chunks, 0), 0)
    }), 180_000)

  it.live("--router names its policies exactly; kv-aware and server restarts need the replay's own servers", () =>
    Effect.gen(function*() {
      const bad = yield* runCli(["replay", "--router", "kv-aware,random"])
      assert.strictEqual(bad.code, 2)
      assert.include(bad.stderr, `must be round-robin or kv-aware, or a comma list of them (got "random")`)
      const twice = yield* runCli(["replay", "--router", "kv-aware,kv-aware"])
      assert.strictEqual(twice.code, 2)
      assert.include(twice.stderr, `names a policy twice (got "kv-aware,kv-aware")`)
      const running = yield* runCli(["replay", "--server", "ipc:///tmp/nowhere.sock", "--router", "kv-aware"])
      assert.strictEqual(running.code, 2)
      assert.include(running.stderr, "--router kv-aware and --restart-server-every-requests apply to the servers the replay starts, not to --server")
    }), 60_000)
})

redisSuite("mpcache replay --router with --l2-url (real redis-server)", () => {
  it.live("over a shared L2 both policies find 14 chunks: kv-aware all from L1, round-robin 10 of them from L2 (each policy under its own key prefix)", () =>
    Effect.scoped(Effect.gen(function*() {
      const redis = yield* startRedis()
      const trace = join(tmpdir(), `mpcache-router-l2-trace-${randomUUID()}.jsonl`)
      writeFileSync(trace, TRACE.map((r) => JSON.stringify(r)).join("\n"))
      // A lookup timeout for a loaded machine: a timed-out EXISTS is a (correct) miss, not what this tests.
      const r = yield* replay([
        "--trace", trace, "--rate", "2", "--workers", "1", "--router", "kv-aware,round-robin", "--l2-url", redis.url, "--l2-lookup-timeout-ms", "2000"
      ]).pipe(Effect.ensuring(Effect.sync(() => rmSync(trace, { force: true }))))
      assert.strictEqual(r.code, 0, r.stderr.slice(-3000))
      const [kv, rr] = (JSON.parse(r.stdout) as { readonly runs: ReadonlyArray<ReplaySummary> }).runs
      assert.deepStrictEqual([kv!.chunks.hit, kv!.hits_by_tier], [14, { l1: 14, l2: 0 }])
      assert.deepStrictEqual(kv!.router.audit!.map((a) => [a.l1_chunks, a.missing, a.extra]), [[8, 0, 0], [6, 0, 0]])
      // Round-robin under a key prefix of its own: kv-aware's writes do not help it; the L2 holds its own.
      assert.deepStrictEqual([rr!.chunks.hit, rr!.hits_by_tier], [14, { l1: 4, l2: 10 }])
      assert.deepStrictEqual(rr!.per_server, [
        { requests: 3, looked_up: 18, hit: 10, l2_hit: 6 },
        { requests: 2, looked_up: 10, hit: 4, l2_hit: 4 }
      ])
    })), 180_000)
})
