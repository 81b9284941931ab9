/**
 * examples/kv_events_subscriber.py, vLLM's way of reading KV events, against a real server's PUB and replay
 * ROUTER (issue 28 item 5): run by Debian's /usr/bin/python3 (python3-zmq, python3-msgpack; msgspec with vLLM's
 * struct definitions when installed, which Debian 12 does not package: the decoder used is checked and named).
 * The subscriber joins after a STORE was published, so it catches up by replay, then reads a second STORE and a
 * CLEAR live (a batch its SUB missed while joining shows as a gap and is replayed): every event exact, in order.
 * Without python3-zmq and python3-msgpack the test is skipped, said on stderr.
 */
import { spawn, spawnSync } from "node:child_process"
import { randomUUID } from "node:crypto"
import { mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { fileURLToPath } from "node:url"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { makeInstanceId } from "../../src/schema/InstanceId.ts"
import { Clear, RegisterKvCache, Store } from "../../src/schema/Op.ts"
import { MqClient } from "../../src/services/client/MqClient.ts"
import { makePagedKvCache } from "../../src/services/client/PagedKvCache.ts"
import { chunkHashes, hashHex } from "../../src/services/kv/TokenHasher.ts"
import { writeTokens } from "../support/KvData.ts"
import { testServer } from "../support/TestServer.ts"

const EXAMPLE = fileURLToPath(new URL("../../examples/kv_events_subscriber.py", import.meta.url))
const PYTHON = "/usr/bin/python3"

const pythonReady = (() => {
  const probe = spawnSync(PYTHON, ["-c", "import zmq, msgpack"], { encoding: "utf8" })
  if (probe.status === 0) return true
  process.stderr.write(
    `SKIPPED test/e2e/pythonKvEvents.test.ts: ${PYTHON} cannot import zmq and msgpack (apt-get install python3-zmq python3-msgpack): ${probe.error?.message ?? probe.stderr.trim().split("\n").pop()}\n`
  )
  return false
})()
const hasMsgspec = spawnSync(PYTHON, ["-c", "import msgspec"]).status === 0

const CHUNK = 32
const geometry = { numLayers: 3, numBlocks: 64, blockSizeTokens: 16, numHeads: 2, headSize: 8, dtype: "float16" as const }
const first = Array.from({ length: 128 }, (_, i) => (i * 7 + 3) % 5000)
const second = Array.from({ length: 64 }, (_, i) => 9000 + i)
const EVENT = new Uint8Array([1])

describe.skipIf(!pythonReady)("a Python subscriber with vLLM's definitions reads the PUB", () => {
  const dir = mkdtempSync(join(tmpdir(), "mpcache-pykv-"))
  const pub = `ipc://${join(dir, "pub")}`
  const replay = `ipc://${join(dir, "replay")}`

  it.live("catch-up by replay, then live: AllBlocksCleared, 4 + 2 BlockStored, one BlockRemoved of 6, exact", () =>
    Effect.gen(function*() {
      const client = yield* MqClient
      const cache = yield* makePagedKvCache({ backing: "cpu_shm", namePrefix: `mpcache-test-${randomUUID()}`, ...geometry })
      yield* client.request(RegisterKvCache, [makeInstanceId(1n), cache.descriptors, "tiny", 1, "vllm", {}, []])
      yield* writeTokens(cache, 1, [1, 2, 3, 4, 5, 6, 7, 8])
      const store = (ids: ReadonlyArray<number>, request: string) =>
        client.request(Store, [
          { model_name: "tiny", world_size: 1, worker_id: 0, token_ids: ids, start: 0, end: ids.length, request_id: request, cache_salt: "" },
          makeInstanceId(1n),
          [[1, 2, 3, 4, 5, 6, 7, 8].slice(0, ids.length / 16)],
          EVENT
        ])
      yield* store(first, "r1")

      let stdout = ""
      let stderr = ""
      const child = yield* Effect.acquireRelease(
        Effect.sync(() => spawn(PYTHON, [EXAMPLE, "--pub", pub, "--replay", replay, "--count", "8"], { stdio: ["ignore", "pipe", "pipe"] })),
        (c) => Effect.sync(() => c.exitCode === null && c.kill("SIGKILL"))
      )
      child.stdout.on("data", (d: Buffer) => (stdout += d.toString()))
      child.stderr.on("data", (d: Buffer) => (stderr += d.toString()))
      const exited = new Promise<number | null>((resolve) => child.on("close", resolve))
      // Its catch-up is done when it has printed batch 0 and the first STORE (5 lines).
      yield* Effect.promise(() =>
        new Promise<void>((resolve, reject) => {
          const t = setInterval(() => {
            if (stdout.split("\n").filter((l) => l !== "").length >= 5) (clearInterval(t), resolve())
            else if (child.exitCode !== null) (clearInterval(t), reject(new Error(`subscriber exited: ${stderr}`)))
          }, 20)
        })
      )
      yield* store(second, "r2")
      yield* client.request(Clear, [false])
      const code = yield* Effect.promise(() => exited)
      assert.strictEqual(code, 0, stderr)
      assert.include(stderr, `decoder: ${hasMsgspec ? "msgspec" : "msgpack"}`)

      const events = stdout.trim().split("\n").map((l) => JSON.parse(l) as Record<string, unknown>)
      const h1 = chunkHashes(first, CHUNK).map(hashHex)
      const h2 = chunkHashes(second, CHUNK).map(hashHex)
      const stored = (hashes: ReadonlyArray<string>, ids: ReadonlyArray<number>, i: number) => ({
        type: "BlockStored",
        block_hashes: [hashes[i]],
        parent_block_hash: i === 0 ? null : hashes[i - 1],
        token_ids: ids.slice(i * CHUNK, (i + 1) * CHUNK),
        block_size: CHUNK,
        medium: "CPU"
      })
      assert.deepStrictEqual(events.map(({ seq: _, ...e }) => e), [
        { type: "AllBlocksCleared" },
        ...[0, 1, 2, 3].map((i) => stored(h1, first, i)),
        ...[0, 1].map((i) => stored(h2, second, i)),
        { type: "BlockRemoved", block_hashes: [...h1, ...h2], medium: "CPU" }
      ])
      // Sequence numbers never go back and start at 0.
      const seqs = events.map((e) => e["seq"] as number)
      assert.strictEqual(seqs[0], 0)
      assert.isTrue(seqs.every((s, i) => i === 0 || s >= seqs[i - 1]!))
    }).pipe(Effect.scoped, Effect.provide(testServer({ config: { chunkSize: CHUNK, kvEventsEndpoint: pub, kvEventsReplayEndpoint: replay } }))))
})
