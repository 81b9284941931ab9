/**
 * What `mpcache replay` does before and after the run (issue 18): it adds up
 * what it will need and refuses a run the machine cannot hold, before it
 * starts anything; it skips requests longer than `--max-input-tokens`; and
 * interrupted (SIGINT, SIGTERM) it stops its workers and server and removes
 * what it created. Its workers' KV caches are memfds (issue 13 item 2), so
 * workers it SIGKILLs (--kill-every-requests) leave nothing in /dev/shm.
 */
import { execFileSync } from "node:child_process"
import { existsSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { randomUUID } from "node:crypto"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Fiber, Schedule } from "effect"
import type { ReplaySummary } from "../../src/replay/Driver.ts"
import { runCli, startCli } from "../support/Cli.ts"

/** /dev/shm names a replay of process `pid` created (its workers' KV caches). */
const replaySegments = (pid: number) => readdirSync("/dev/shm").filter((n) => n.startsWith(`mpcache-replay-${pid}-`))

/** The live child processes of `pid`. */
const childrenOf = (pid: number): ReadonlyArray<number> => {
  try {
    return execFileSync("pgrep", ["-P", String(pid)], { encoding: "utf8" }).trim().split("\n").filter((l) => l !== "").map(Number)
  } catch {
    return []
  }
}

/** Whether process `pid` still exists. */
const isAlive = (pid: number) => {
  try {
    process.kill(pid, 0)
    return true
  } catch {
    return false
  }
}

/** The value after `flag` on process `pid`'s command line. */
const argOf = (pid: number, flag: string): string | undefined => {
  const argv = readFileSync(`/proc/${pid}/cmdline`, "utf8").split("\0")
  const i = argv.indexOf(flag)
  return i < 0 ? undefined : argv[i + 1]
}

describe("mpcache replay guards", () => {
  it.live("a run the machine cannot hold is refused before anything starts, with the figures and the flags that change them", () =>
    Effect.gen(function*() {
      // llama3-8b: 2 workers × ~10.6 GiB for an 87k-token request + 4 GiB of L1: more than this machine kind has in all.
      const r = yield* runCli(["replay", "--model", "llama3-8b", "--requests", "20", "--max-rate", "--l1-size-gb", "4"], 60_000)
      assert.strictEqual(r.code, 1, r.stderr)
      assert.match(r.stderr, /mpcache replay: this replay needs 25\.9 GiB of memory \(2 worker\(s\) × 10\.6 GiB of KV cache for the longest request, 87040 tokens; 4\.0 GiB of L1/)
      assert.include(r.stderr, "Lower --workers, --max-input-tokens (skips longer requests), --requests or --l1-size-gb, or use --model small.")
      assert.notInclude(r.stderr, "MQ server listening")
    }), 60_000)

  it.live("--max-input-tokens skips and counts the longer requests", () =>
    Effect.gen(function*() {
      const trace = join(tmpdir(), `mpcache-trace-${randomUUID()}.jsonl`)
      const line = (ts: number, n: number, ids: ReadonlyArray<number>) =>
        JSON.stringify({ timestamp: ts, input_length: n, output_length: 10, hash_ids: ids })
      writeFileSync(trace, [line(0, 600, [1, 2]), line(1, 5_000, [1, 3, 4, 5, 6, 7, 8, 9, 10, 11]), line(2, 700, [1, 2])].join("\n") + "\n")
      try {
        const r = yield* runCli(["replay", "--json", "--trace", trace, "--max-rate", "--max-input-tokens", "1000"], 60_000)
        assert.strictEqual(r.code, 0, r.stderr.slice(-3000))
        const s = JSON.parse(r.stdout) as ReplaySummary
        assert.strictEqual(s.requests, 2)
        assert.deepStrictEqual(s.skipped_long_requests, { count: 1, max_input_tokens: 1000 })
        assert.strictEqual(s.data_mismatches, 0)
        const all = yield* runCli(["replay", "--trace", trace, "--max-rate", "--max-input-tokens", "100"], 60_000)
        assert.strictEqual(all.code, 1)
        assert.include(all.stderr, "every one of the 3 request(s) is longer than --max-input-tokens 100; nothing to replay")
      } finally {
        rmSync(trace, { force: true })
      }
    }), 120_000)

  for (const signal of ["SIGINT", "SIGTERM"] as const) {
    it.live(`${signal} mid-run stops the workers and the server and removes their segments and socket`, () =>
      Effect.scoped(Effect.gen(function*() {
        // Far more requests than the run lasts before the signal: its end never races the test's look (a 300-request
        // run at --max-rate can end within a second of its first progress line on a fast machine).
        const replay = yield* startCli(["replay", "--requests", "10000", "--max-rate", "--workers", "2"])
        const pid = replay.child.pid!
        yield* replay.waitForStderr(/\] \d+\/10000 requests/, 60_000)
        // Its server and its 2 workers (waited for: the first progress line may come before the workers are up);
        // the server's ipc socket file.
        for (let i = 0; i < 600 && childrenOf(pid).length < 3; i++) yield* Effect.sleep("50 millis")
        const children = childrenOf(pid)
        assert.strictEqual(children.length, 3)
        // The workers' KV caches are memfds (issue 13 item 2): mapped by them and the server, nothing in /dev/shm.
        const memfdMappings = children.flatMap((c) =>
          readFileSync(`/proc/${c}/maps`, "utf8").split("\n").filter((l) => l.includes(`/memfd:mpcache-replay-${pid}-`))
        )
        assert.isAbove(memfdMappings.length, 0)
        assert.deepStrictEqual(replaySegments(pid), [])
        const sockets = children.flatMap((c) => {
          const endpoint = argOf(c, "--endpoint")
          return endpoint === undefined ? [] : [endpoint.slice("ipc://".length)]
        })
        assert.strictEqual(sockets.length, 1)
        assert.isTrue(existsSync(sockets[0]!))
        const exited = yield* replay.stop(signal)
        assert.deepStrictEqual(exited, { code: 0, signal: null })
        assert.deepStrictEqual(replaySegments(pid), [])
        assert.deepStrictEqual(children.filter(isAlive), [])
        assert.isFalse(existsSync(sockets[0]!))
        assert.isFalse(existsSync(`${sockets[0]!}.fds`))
      })), 90_000)
  }

  it.live("--kill-every-requests 20: SIGKILLed workers' KV caches never appear in /dev/shm (cpu_memfd), and nothing leaks", () =>
    Effect.scoped(Effect.gen(function*() {
      const replay = yield* startCli(["replay", "--requests", "60", "--workers", "2", "--kill-every-requests", "20"])
      const pid = replay.child.pid!
      // Sampled all along: a cpu_shm cache would be listed while its worker lives.
      const seen = new Set<string>()
      const sampler = yield* Effect.forkScoped(
        Effect.sync(() => replaySegments(pid).forEach((n) => seen.add(n))).pipe(Effect.repeat(Schedule.spaced("100 millis")))
      )
      yield* replay.waitForStdout(/data mismatches\s+0 ✓/, 240_000)
      yield* Fiber.interrupt(sampler)
      const out = replay.stdout()
      const reaped = Number(/reaped\s+timeout \d+ · grace \d+ · disconnect (\d+)/.exec(out)?.[1] ?? -1)
      assert.isAtLeast(reaped, 1, out.slice(-2000))
      assert.match(out, /leaked contexts\s+0 ✓/)
      assert.deepStrictEqual([...seen], [])
    })), 300_000)
})
