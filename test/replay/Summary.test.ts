/**
 * The replay's summary (src/replay/internal/Summary.ts) from a tally: hit
 * ratios overall and by tier (L2 hits come from the servers' counters, L1 is
 * the rest), per-server shares, the perfect-LRU references of one server's
 * and the servers' combined capacity, churn and the long requests skipped.
 * And the tally's `record` (Tally.ts): chunks, bytes and mismatches of a
 * finished request; a stage without chunks adds no latency sample.
 */
import { assert, describe, it } from "@effect/vitest"
import type { Node } from "../../src/replay/internal/Fleet.ts"
import { summarize } from "../../src/replay/internal/Summary.ts"
import { Tally } from "../../src/replay/internal/Tally.ts"
import type { Done } from "../../src/replay/Messages.ts"
import type { ReplayOptions } from "../../src/replay/ReplayOptions.ts"
import type { TraceRequest } from "../../src/replay/Trace.ts"

const request = (index: number, hashIds: Array<number>): TraceRequest =>
  ({ index, line: index + 1, timestampMs: index * 10, inputLength: hashIds.length * 16, outputLength: 1, hashIds })

const done = (over: Partial<Done>): Done => ({
    _tag: "Done",
    index: 0,
    retrieveOk: true,
    storeOk: true,
    reregistrations: 0,
    healthy: true,
    storedChunks: 0,
    retrievedChunks: 0,
    storedBytes: 0,
    retrievedBytes: 0,
    unservedRetrieveChunks: { notSent: 0, failed: 0 },
    storeMs: 0,
    retrieveMs: 0,
    computeMs: 1,
    mismatchedChunks: [],
    ...over
  })

const node = (index: number, requests: number, lookedUp: number, hit: number): Node =>
  ({ index, endpoint: `ipc://n${index}`, httpUrl: `http://n${index}`, requests, lookedUp, hit, workers: [] }) as unknown as Node

const options = {
  tracePath: "trace.jsonl",
  workers: 2,
  l2Url: "redis://:secret@localhost:6379",
  transferMode: "lmcache",
  model: { name: "tiny" },
  maxInputTokens: 64
} as unknown as ReplayOptions

describe("replay Summary", () => {
  it("record counts chunks, bytes and mismatches; a request without stored chunks adds no STORE latency", () => {
    const t = new Tally()
    t.record(request(0, [1, 2]), done({ storedChunks: 2, storedBytes: 2000, storeMs: 5 }))
    t.record(request(1, [1, 2]), done({ retrievedChunks: 2, retrievedBytes: 2000, retrieveMs: 3, mismatchedChunks: [1] }))
    assert.deepStrictEqual([t.stored, t.retrieved, t.bytesStored, t.bytesRetrieved], [2, 2, 2000, 2000])
    assert.deepStrictEqual(t.mismatches, [{ request: 1, line: 2, chunks: [1] }])
    assert.strictEqual(t.lat.store.mean(), 5)
    assert.strictEqual(t.lat.retrieve.mean(), 3)
    assert.strictEqual(t.lat.compute.mean(), 1)
  })

  it("record counts the hit chunks of retrieves not sent (degraded mode) apart from those that failed", () => {
    const t = new Tally()
    t.record(request(0, [1, 2]), done({ retrieveOk: false, unservedRetrieveChunks: { notSent: 3, failed: 0 } }))
    t.record(request(1, [1, 2]), done({ retrieveOk: false, unservedRetrieveChunks: { notSent: 0, failed: 2 } }))
    t.record(request(2, [1, 2]), done({ retrievedChunks: 4, retrievedBytes: 4000, retrieveMs: 2 }))
    assert.deepStrictEqual([t.retrieved, t.retrieveNotSent, t.retrieveFailed], [4, 3, 2])
    // A retrieve that brought nothing adds no RETRIEVE latency.
    assert.strictEqual(t.lat.retrieve.mean(), 2)
  })

  it("splits hits by tier, shares per server and compares with the perfect LRU of one and of the combined capacity", () => {
    const t = new Tally()
    t.lookedUp = 8
    t.hit = 4
    t.killed = 1
    const requests = [request(0, [1, 2, 3, 4]), request(1, [1, 2, 3, 4])]
    const { lruSteps, summary } = summarize(t, {
      options,
      requests,
      sliceLength: 3,
      issues: [],
      nodes: [node(0, 1, 4, 0), node(1, 1, 4, 4)],
      chunk: 16,
      capacityChunks: 2,
      l2Hits: [0, 1],
      durationSeconds: 2,
      reaped: { timeout: 0, grace: 0, disconnect: 1 },
      leaked: 0,
      openMappings: 0,
      router: { policy: "kv-aware", audit: [{ server: 1, l1_chunks: 4, router_chunks: 4, missing: 0, extra: 0 }], server_restarts: 1 }
    })
    assert.strictEqual(summary.hit_ratio, 0.5)
    assert.deepStrictEqual(summary.hits_by_tier, { l1: 3, l2: 1 })
    assert.strictEqual(summary.hit_ratio_l1, 0.375)
    assert.strictEqual(summary.hit_ratio_l2, 0.125)
    // One server holds 2 of the 4 chunks: LRU order evicts each before its reuse. Two servers hold all 4.
    assert.strictEqual(summary.perfect_lru_hit_ratio, 0)
    assert.strictEqual(summary.perfect_lru_combined_hit_ratio, 0.5)
    assert.deepStrictEqual(lruSteps[lruSteps.length - 1], [8, 0])
    assert.deepStrictEqual(summary.per_server, [
      { requests: 1, looked_up: 4, hit: 0, l2_hit: 0 },
      { requests: 1, looked_up: 4, hit: 4, l2_hit: 1 }
    ])
    assert.strictEqual(summary.l2_url, "redis://:***@localhost:6379")
    assert.strictEqual(summary.requests_per_second, 1)
    assert.deepStrictEqual(summary.churn, { killed: 1, paused: 0, replaced: 0 })
    assert.deepStrictEqual(summary.skipped_long_requests, { count: 1, max_input_tokens: 64 })
    assert.deepStrictEqual(summary.router, { policy: "kv-aware", audit: [{ server: 1, l1_chunks: 4, router_chunks: 4, missing: 0, extra: 0 }], server_restarts: 1 })
  })
})
