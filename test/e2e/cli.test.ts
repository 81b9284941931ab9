/**
 * The `mpcache` command as a user runs it: child processes, real sockets,
 * real signals.
 */
import { randomUUID } from "node:crypto"
import { readFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { VERSION } from "../../src/version.ts"
import { runCli, startCli } from "../support/Cli.ts"
import { eventually, ipcEndpoint as fleetEndpoint, startServer, startWorker, statusOf } from "../support/LiveFleet.ts"

const ipcEndpoint = () => `ipc://${join(tmpdir(), `mpcache-test-${randomUUID()}.sock`)}`

describe("mpcache serve flags", () => {
  it.live("a server that cannot create its L1 pool says why on its last line (the size, the free space) and exits 1", () =>
    Effect.gen(function*() {
      // More than /dev/shm holds on any machine of this kind (24 GiB in all).
      const r = yield* runCli(["serve", "--l1-size-gb", "4096", "--endpoint", ipcEndpoint(), "--http-port", "0", "--log-format", "json"])
      assert.strictEqual(r.code, 1)
      const last = JSON.parse(r.stderr.trim().split("\n").pop()!) as { message: string; level: string }
      assert.strictEqual(last.level, "ERROR")
      assert.match(
        last.message,
        /^mpcache cannot start: --l1-size-gb 4096: the L1 pool needs 4398046511104 bytes of \/dev\/shm but only \d+ are free; lower --l1-size-gb or enlarge \/dev\/shm$/
      )
    }))

  it.live("a reap timeout of 10 is refused: exit 2, naming the flag and the rule", () =>
    Effect.gen(function*() {
      const r = yield* runCli(["serve", "--worker-reap-timeout-seconds", "10"])
      assert.strictEqual(r.code, 2)
      assert.include(r.stderr, "--worker-reap-timeout-seconds")
      assert.include(r.stderr, "must be 0 (disabled) or at least 30 seconds (got 10)")
    }))

  it.live("a registration grace below the reap timeout is refused: exit 2", () =>
    Effect.gen(function*() {
      const r = yield* runCli(["serve", "--worker-registration-grace-seconds", "60"])
      assert.strictEqual(r.code, 2)
      assert.include(r.stderr, "--worker-registration-grace-seconds")
      assert.include(r.stderr, "worker registration grace must be at least the worker reap timeout (120 s; got 60)")
    }))

  it.live("a queued-reply bound under 64 KiB and an HTTP idle timeout of 0 are refused: exit 2, naming each flag (issue 24)", () =>
    Effect.gen(function*() {
      const bytes = yield* runCli(["serve", "--max-queued-reply-bytes-per-peer", "1000"])
      assert.strictEqual(bytes.code, 2)
      assert.include(bytes.stderr, "--max-queued-reply-bytes-per-peer")
      assert.include(bytes.stderr, "must be a number of bytes of at least 65536 (got 1000)")
      const idle = yield* runCli(["serve", "--http-idle-timeout-seconds", "0"])
      assert.strictEqual(idle.code, 2)
      assert.include(idle.stderr, "--http-idle-timeout-seconds")
      assert.include(idle.stderr, "must be a number of seconds from 0.1 to 300 (got 0)")
    }))

  it.live("a port that is not a number, and an endpoint that is not ZeroMQ, are refused: exit 2", () =>
    Effect.gen(function*() {
      const port = yield* runCli(["serve", "--port", "abc"])
      assert.strictEqual(port.code, 2)
      assert.include(port.stderr, "--port")
      const endpoint = yield* runCli(["serve", "--endpoint", "http://x"])
      assert.strictEqual(endpoint.code, 2)
      assert.include(endpoint.stderr, "--endpoint")
      assert.include(endpoint.stderr, "must be a ZeroMQ endpoint")
    }))
})

describe("mpcache --help and invalid invocations (issue 29 item 3)", () => {
  /** The flag lines of a command's --help: its FLAGS section, one line per flag. */
  const flagLines = (help: string): ReadonlyArray<string> => {
    const section = help.split("\nFLAGS\n")[1]?.split("\n\n")[0] ?? ""
    return section.split("\n").filter((l) => l.startsWith("  --"))
  }

  it.live("every flag of every command shows its default, and the figures are the real ones", () =>
    Effect.gen(function*() {
      const counts: Record<string, number> = {}
      for (const command of ["serve", "replay", "ping", "noop", "get-chunk-size", "clear", "end-session", "status"]) {
        const r = yield* runCli([command, "--help"])
        assert.strictEqual(r.code, 0, r.stderr)
        const lines = flagLines(r.stdout)
        counts[command] = lines.length
        assert.deepStrictEqual(lines.filter((l) => !/\[default: [^\]]+\]/.test(l)), [], `${command}: flags without a default`)
        if (command === "serve") {
          assert.match(r.stdout, /--port integer +TCP port of the ZeroMQ endpoint, 1 to 65535 \[default: 5555\]\n/)
          assert.match(r.stdout, /--worker-reap-timeout-seconds number +.*; 0 disables, else >= 30 \[default: 120\]\n/)
          assert.match(r.stdout, /--l1-prefault +.* \[default: on\]\n/)
          assert.match(r.stdout, /--l2-key-prefix string +.* \[default: mpc\]\n/)
          assert.match(r.stdout, /--max-segments-per-register integer +.* \[default: 1024\]\n/)
        }
        if (command === "replay") assert.match(r.stdout, /--workers integer +Engine worker processes, 1 to 64 \[default: 2\]\n/)
        if (command === "status") assert.include(r.stdout, "not the ZeroMQ --port")
      }
      // Every flag was seen: the section parser cannot pass by finding none.
      assert.isAtLeast(counts["serve"]!, 55)
      assert.isAtLeast(counts["replay"]!, 25)
      assert.strictEqual(counts["ping"], 7)
    }))

  it.live("a wrong value prints the error first (flag, value, rule) and one pointer to --help, nothing else; exit 2", () =>
    Effect.gen(function*() {
      const r = yield* runCli(["serve", "--port", "99999"])
      assert.strictEqual(r.code, 2)
      assert.strictEqual(r.stdout, "")
      assert.strictEqual(
        r.stderr,
        [
          `mpcache serve: Invalid value for flag --port: "99999". Expected: must be an integer from 1 to 65535 (got 99999)`,
          "Run 'mpcache serve --help' for every flag, its default and its rule.",
          ""
        ].join("\n")
      )
      const unknown = yield* runCli(["status", "--port", "5555"])
      assert.strictEqual(unknown.code, 2)
      assert.strictEqual(unknown.stdout, "")
      assert.strictEqual(unknown.stderr.split("\n")[0], "mpcache status: Unrecognized flag: --port in command mpcache status")
      assert.strictEqual(unknown.stderr.split("\n").length, 3)
    }))
})

describe("mpcache serve and the client commands", () => {
  it.live("serve answers ping/noop/get-chunk-size/clear, and SIGTERM exits 0 after draining", () =>
    Effect.scoped(Effect.gen(function*() {
      const endpoint = ipcEndpoint()
      const server = yield* startCli(["serve", "--endpoint", endpoint, "--http-port", "0", "--chunk-size", "512"])
      yield* server.waitForStderr(/MQ server listening on/)
      const ping = yield* runCli(["ping", "--endpoint", endpoint])
      assert.deepStrictEqual([ping.code, ping.stdout], [0, "true\n"])
      const pingId = yield* runCli(["ping", "--endpoint", endpoint, "--instance-id", "9223372036854775807"])
      assert.deepStrictEqual([pingId.code, pingId.stdout], [0, "true\n"])
      const noop = yield* runCli(["noop", "--endpoint", endpoint])
      assert.deepStrictEqual([noop.code, noop.stdout], [0, "OK\n"])
      const chunk = yield* runCli(["get-chunk-size", "--endpoint", endpoint])
      assert.deepStrictEqual([chunk.code, chunk.stdout], [0, "512\n"])
      const clear = yield* runCli(["clear", "--endpoint", endpoint])
      assert.deepStrictEqual([clear.code, clear.stdout], [0, "Cache cleared successfully.\n"])
      const exit = yield* server.stop("SIGTERM")
      assert.deepStrictEqual(exit, { code: 0, signal: null })
      // Both ends of the shutdown, in order, the last line saying it stopped and how long the drain took.
      const lines = server.stderr().trimEnd().split("\n")
      const shutdown = lines.findIndex((l) => l.includes("shutting down: receiving stops, in-flight requests drain"))
      assert.isAtLeast(shutdown, 0, server.stderr())
      assert.match(lines.at(-1)!, /INFO \(#\d+\): stopped: in-flight requests drained and every resource released in \d+ ms$/)
    })))

  it.live("status --json prints /api/status from the HTTP frontend; the L1 pool's prefault ends with every byte touched", () =>
    Effect.scoped(Effect.gen(function*() {
      const endpoint = ipcEndpoint()
      const server = yield* startCli(["serve", "--endpoint", endpoint, "--http-port", "0", "--log-format", "json", "--l1-size-gb", "0.25", "--l1-prefault"])
      const [, port] = yield* server.waitForStderr(/HTTP frontend listening on http:\/\/127\.0\.0\.1:(\d+)/)
      const status = yield* runCli(["status", "--http-port", port!, "--json"])
      assert.strictEqual(status.code, 0)
      const doc = JSON.parse(status.stdout) as Record<string, unknown>
      assert.strictEqual(doc["version"], VERSION)
      assert.strictEqual(doc["endpoint"], endpoint)
      assert.strictEqual(doc["chunk_size"], 256)
      assert.deepStrictEqual(doc["pools"], {
        sync: { queued: 0 },
        normal: { workers: 4, queued: 0 },
        affinity: { lanes: 4, queued: [0, 0, 0, 0], pinnedPeers: 0 }
      })
      // The prefault runs in the background from the start (--l1-prefault): it ends with the whole pool touched.
      const { l1 } = yield* eventually(statusOf(Number(port)), (d) => d.l1.prefaulted_bytes === d.l1.capacity_bytes, 30_000)
      assert.deepStrictEqual([l1.capacity_bytes, l1.prefaulted_bytes], [0.25 * 2 ** 30, 0.25 * 2 ** 30])
      const sigint = yield* server.stop("SIGINT")
      assert.deepStrictEqual(sigint, { code: 0, signal: null })
    })))

  it.live("status prints a summary by default: server, readiness, liveness and L1 lines, reaps, one row per instance with its state", () =>
    Effect.scoped(Effect.gen(function*() {
      const endpoint = fleetEndpoint()
      const { httpPort } = yield* startServer(endpoint, ["--worker-disconnect-grace-seconds", "1"])
      const idle = yield* runCli(["status", "--http-port", String(httpPort)])
      assert.strictEqual(idle.code, 0, idle.stderr)
      const idleLines = idle.stdout.split("\n")
      assert.match(idleLines[0]!, new RegExp(`^mpcache ${VERSION.replace(/\./g, "\\.")} \\(protocol \\d+\\) · ${endpoint} · up \\d+s · 0 peers$`))
      assert.strictEqual(idleLines[1], "readiness ready · mq_bound, l1_pool, reaper, fd_socket, l2 ok")
      assert.strictEqual(
        idleLines[2],
        "liveness  reaper on · reap timeout 120 s · registration grace 3600 s · disconnect grace 1 s · 0 tracked"
      )
      assert.strictEqual(idleLines[3], "L1        0 B of 1.0 GiB (0.0%) · 0 objects · 0 evictions · hit ratio — (no lookups yet) · L2 off")
      assert.strictEqual(
        idleLines[4],
        "events    on · 0 / 32768 records · seq — (empty) · 0 stored, 0 removed · 0 dropped · 0 lost answers · 0 chunks held · PUB off"
      )
      assert.strictEqual(idleLines[5], "reaps     0 recent")
      assert.strictEqual(idleLines[7], "no registered instances")

      const a = yield* startWorker(endpoint, 500, 60_000)
      const b = yield* startWorker(endpoint, 500, 60_000)
      yield* eventually(statusOf(httpPort), (d) => d.instances.filter((i) => i.state === "active").length === 2, 5_000)
      a.worker.child.kill("SIGKILL")
      yield* eventually(statusOf(httpPort), (d) => d.recent_reaps.length === 1 && d.instances.length === 1, 10_000)
      const r = yield* runCli(["status", "--http-port", String(httpPort)])
      assert.strictEqual(r.code, 0, r.stderr)
      const lines = r.stdout.trimEnd().split("\n")
      // Both workers stored the same first chunk: one `stored`, and it is still held.
      assert.strictEqual(
        lines[4],
        "events    on · 1 / 32768 records · seq 1 … 1 · 1 stored, 0 removed · 0 dropped · 0 lost answers · 1 chunks held · PUB off"
      )
      assert.match(lines[5]!, new RegExp(`^reaps     1 recent · last: ${a.instanceId} disconnect after \\d+\\.\\d s silent \\(window 1 s\\)$`))
      assert.match(lines[7]!, /^INSTANCE ID +KIND +TENANT +MODEL +STATE +LAST SEEN +FLAGS$/)
      assert.strictEqual(lines.length, 9)
      assert.deepStrictEqual(lines[8]!.split(/ {2,}/).filter((c, i) => i !== 5), [b.instanceId, "kv_cache", "—", "liveness-e2e", "active", "ping,transfer"])
      assert.match(lines[8]!.split(/ {2,}/)[5]!, /^\d+\.\d s$/)
    })), 60_000)

  it.live("a client command with no server exits 1 and says what timed out", () =>
    Effect.gen(function*() {
      const r = yield* runCli(["ping", "--endpoint", ipcEndpoint(), "--timeout-seconds", "0.5"])
      assert.strictEqual(r.code, 1)
      assert.strictEqual(r.stdout, "")
      assert.include(r.stderr, "ping to ipc://")
      assert.include(r.stderr, "no reply within 500 ms")
    }))
})

describe("package", () => {
  it("VERSION matches package.json", () => {
    const pkg = JSON.parse(readFileSync(new URL("../../package.json", import.meta.url), "utf8")) as { version: string }
    assert.strictEqual(VERSION, pkg.version)
  })
})
