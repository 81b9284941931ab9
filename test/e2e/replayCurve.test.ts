/**
 * `mpcache replay` speaking CURVE (issue 14 item 1), as a user runs it: with
 * `--curve` its own server runs with per-run keys that are gone afterwards;
 * with `--server` and key files it replays against a running CURVE server.
 * Real processes, real shared memory.
 */
import { existsSync } from "node:fs"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import type { ReplaySummary } from "../../src/replay/Driver.ts"
import { runCli } from "../support/Cli.ts"
import { makeTestKeys } from "../support/CurveKeys.ts"
import { ipcEndpoint, startServer, statusOf } from "../support/LiveFleet.ts"

const replay = (args: ReadonlyArray<string>) =>
  Effect.map(runCli(["replay", "--json", "--requests", "30", "--workers", "2", "--max-rate", ...args], 120_000), (r) => ({
    ...r,
    summary: r.code === 0 ? JSON.parse(r.stdout) as ReplaySummary : undefined
  }))

/** What must be zero or equal in a clean run of the 30 requests. */
const clean = (s: ReplaySummary) => ({
  requests: s.requests,
  failed_requests: s.failed_requests,
  data_mismatches: s.data_mismatches,
  leaked_contexts: s.leaked_contexts,
  open_mappings_after_shutdown: s.open_mappings_after_shutdown,
  // Every hit chunk came back, but those a worker in degraded mode did not ask for; none failed.
  retrieved_is_hit: s.chunks.retrieve_failed === 0 && s.chunks.retrieved + s.chunks.retrieve_not_sent === s.chunks.hit
})
const CLEAN = { requests: 30, failed_requests: 0, data_mismatches: 0, leaked_contexts: 0, open_mappings_after_shutdown: 0, retrieved_is_hit: true }

describe("mpcache replay with CURVE", () => {
  it.live("--curve: its own server speaks CURVE with per-run keys; the run is clean and the keys are removed", () =>
    Effect.gen(function*() {
      const r = yield* replay(["--curve"])
      assert.strictEqual(r.code, 0, r.stderr.slice(-3000))
      assert.deepStrictEqual(clean(r.summary!), CLEAN)
      const dir = r.stderr.match(/the replay's server speaks CURVE with per-run keys in (\S+)/)?.[1]
      assert.isDefined(dir, r.stderr.slice(-3000))
      assert.isFalse(existsSync(dir!), "the per-run keys are removed")
    }), 150_000)

  it.live("--server with key files: replays engine-driven against a running CURVE server as its tenant; nothing left registered", () =>
    Effect.scoped(Effect.gen(function*() {
      const keys = makeTestKeys({ replay: "replayers" })
      const endpoint = ipcEndpoint()
      const { httpPort } = yield* startServer(endpoint, [
        "--curve-secret-key-file", keys.serverSecretFile, "--curve-authorized-keys", keys.authorizedKeysFile
      ], 45_000)
      const r = yield* replay([
        "--transfer-mode", "engine-driven",
        "--server", endpoint, "--http-url", `http://127.0.0.1:${httpPort}`,
        "--curve-server-public-key-file", keys.serverPublicFile, "--curve-secret-key-file", keys.clients["replay"]!.secretFile
      ])
      assert.strictEqual(r.code, 0, r.stderr.slice(-3000))
      assert.deepStrictEqual(clean(r.summary!), CLEAN)
      assert.deepStrictEqual((yield* statusOf(httpPort)).instances, [])
    })), 150_000)

  it.live("key flags without --server, and --curve with --server, are refused naming the flags", () =>
    Effect.gen(function*() {
      const keys = makeTestKeys({ replay: "replayers" })
      const own = yield* runCli(["replay", "--curve-server-public-key-file", keys.serverPublicFile, "--curve-secret-key-file", keys.clients["replay"]!.secretFile])
      assert.strictEqual(own.code, 2)
      assert.include(own.stdout + own.stderr, "--curve-server-public-key-file and --curve-secret-key-file apply to --server (a running CURVE server); for the replay's own server use --curve")
      const both = yield* runCli(["replay", "--curve", "--server", "ipc:///nonexistent.sock"])
      assert.strictEqual(both.code, 2)
      assert.include(both.stdout + both.stderr, "--curve makes keys for the replay's own server")
    }), 60_000)
})
