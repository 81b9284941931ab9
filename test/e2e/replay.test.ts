/**
 * `mpcache replay` on the shipped Mooncake conversation trace, as a user
 * runs it: a server process, worker processes, real shared memory, real
 * signals.
 */
import { randomUUID } from "node:crypto"
import { writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import type { ReplaySummary } from "../../src/replay/Driver.ts"
import { runCli } from "../support/Cli.ts"
import { buildFakeCudart, readFakeState, removeFakeCudart } from "../support/FakeCudart.ts"

const replay = (args: ReadonlyArray<string>, env: Record<string, string> = {}) =>
  Effect.map(runCli(["replay", "--json", ...args], 120_000, env), (r) => ({
    ...r,
    summary: r.code === 0 || r.stdout.startsWith("{") ? JSON.parse(r.stdout) as ReplaySummary : undefined
  }))

describe("mpcache replay", () => {
  it.live("the first 200 conversation requests with 2 workers: 0 mismatches, 0 leaked, hit ratio within 2 points of a perfect LRU", () =>
    Effect.gen(function*() {
      // The replay's own server prefaults its L1 here, as by default (the other tests' skip it: test/support/Cli.ts).
      const r = yield* replay(["--requests", "200", "--workers", "2", "--max-rate", "--l1-prefault"])
      assert.strictEqual(r.code, 0, r.stderr.slice(-3000))
      const s = r.summary!
      assert.strictEqual(s.requests, 200)
      assert.strictEqual(s.failed_requests, 0)
      assert.strictEqual(s.data_mismatches, 0)
      assert.strictEqual(s.leaked_contexts, 0)
      assert.strictEqual(s.open_mappings_after_shutdown, 0)
      assert.isAbove(s.chunks.hit, 0)
      // Every hit chunk came back but those a worker in degraded mode did not ask for (a heartbeat timed out on a
      // busy machine: it recomputes, DESIGN §6); none was asked for and lost.
      assert.strictEqual(s.chunks.retrieve_failed, 0)
      assert.strictEqual(s.chunks.retrieved + s.chunks.retrieve_not_sent, s.chunks.hit)
      assert.isAtMost(Math.abs(s.hit_ratio - s.perfect_lru_hit_ratio), 0.02)
    }), 120_000)

  it.live("with workers SIGKILLed mid-run: still 0 mismatches, the killed instances reaped on disconnect, nothing leaked or mapped", () =>
    Effect.gen(function*() {
      // Kills by progress (after requests 50, 100 and 150), so a fast machine kills as often as a slow one.
      const r = yield* replay(["--requests", "200", "--workers", "2", "--max-rate", "--kill-every-requests", "50"])
      assert.strictEqual(r.code, 0, r.stderr.slice(-3000))
      const s = r.summary!
      assert.strictEqual(s.churn.killed, 3)
      assert.strictEqual(s.churn.replaced, s.churn.killed)
      assert.strictEqual(s.reaped["disconnect"], s.churn.killed)
      assert.strictEqual(s.data_mismatches, 0)
      assert.strictEqual(s.leaked_contexts, 0)
      assert.strictEqual(s.open_mappings_after_shutdown, 0)
      assert.strictEqual(s.requests, 200)
      assert.strictEqual(s.failed_requests, 0)
    }), 120_000)

  it.live("engine-driven with --kill-every-requests: 0 mismatches, killed instances reaped on disconnect, 0 leaked, 0 open mappings", () =>
    Effect.gen(function*() {
      const r = yield* replay(["--requests", "200", "--workers", "2", "--max-rate", "--kill-every-requests", "50", "--transfer-mode", "engine-driven"])
      assert.strictEqual(r.code, 0, r.stderr.slice(-3000))
      const s = r.summary!
      assert.strictEqual(s.transfer_mode, "engine-driven")
      assert.strictEqual(s.churn.killed, 3)
      assert.strictEqual(s.churn.replaced, s.churn.killed)
      assert.strictEqual(s.reaped["disconnect"], s.churn.killed)
      assert.strictEqual(s.data_mismatches, 0)
      assert.strictEqual(s.leaked_contexts, 0)
      // The workers map the server's pool in their own processes; the server maps no worker memory.
      assert.strictEqual(s.open_mappings_after_shutdown, 0)
      assert.strictEqual(s.requests, 200)
      assert.strictEqual(s.failed_requests, 0)
      assert.isAbove(s.chunks.hit, 0)
      // Every hit chunk came back but those a worker in degraded mode did not ask for (a heartbeat timed out on a
      // busy machine: it recomputes, DESIGN §6); none was asked for and lost.
      assert.strictEqual(s.chunks.retrieve_failed, 0)
      assert.strictEqual(s.chunks.retrieved + s.chunks.retrieve_not_sent, s.chunks.hit)
    }), 120_000)

  it.live("--device cuda: workers keep their KV cache in (fake) device memory shared by CUDA IPC; every byte verified", () =>
    Effect.gen(function*() {
      const fake = buildFakeCudart()
      const r = yield* replay(["--requests", "40", "--workers", "2", "--max-rate", "--device", "cuda"], { MPCACHE_CUDART: fake.library })
      assert.strictEqual(r.code, 0, r.stderr.slice(-3000))
      const s = r.summary!
      assert.strictEqual(s.requests, 40)
      assert.strictEqual(s.failed_requests, 0)
      assert.isAbove(s.chunks.retrieved, 0)
      assert.strictEqual(s.data_mismatches, 0)
      assert.strictEqual(s.leaked_contexts, 0)
      assert.strictEqual(s.open_mappings_after_shutdown, 0)
      const state = readFakeState(fake)
      removeFakeCudart(fake)
      assert.isAbove(state.ipcOpens, 0)
      assert.strictEqual(state.ipcCloses, state.ipcOpens, "every IPC handle the server opened was closed")
      assert.strictEqual(state.violations, 0)
    }), 120_000)

  it.live("malformed trace lines are reported with their line numbers and the rest is replayed", () =>
    Effect.gen(function*() {
      const path = join(tmpdir(), `mpcache-trace-${randomUUID()}.jsonl`)
      writeFileSync(path, [
        JSON.stringify({ timestamp: 0, input_length: 600, output_length: 5, hash_ids: [1, 2] }),
        "{not json",
        JSON.stringify({ timestamp: 1, input_length: 600, output_length: 5, hash_ids: [1] }),
        "",
        JSON.stringify({ timestamp: 2, input_length: 1100, output_length: 5, hash_ids: [1, 3, 4] })
      ].join("\n"))
      const r = yield* replay(["--trace", path, "--workers", "1", "--max-rate"])
      assert.strictEqual(r.code, 0, r.stderr.slice(-3000))
      const s = r.summary!
      assert.strictEqual(s.requests, 2)
      assert.deepStrictEqual(s.trace_issues.map((i) => i.line), [2, 3])
      assert.include(s.trace_issues[0]!.message, "not JSON")
      assert.include(s.trace_issues[1]!.message, "hash_ids has 1 ids; input_length 600 needs ceil(600 / 512) = 2")
      assert.strictEqual(s.chunks.hit, 2)
    }), 60_000)

  it.live("a trace with nothing usable stops with a clear message", () =>
    Effect.gen(function*() {
      const path = join(tmpdir(), `mpcache-trace-${randomUUID()}.jsonl`)
      writeFileSync(path, "nope\n{\"timestamp\": -1}\n")
      const r = yield* runCli(["replay", "--trace", path])
      assert.strictEqual(r.code, 1)
      assert.include(r.stderr, "has no usable request (2 malformed line(s); first at line 1: not JSON")
    }), 60_000)
})
