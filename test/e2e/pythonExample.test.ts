/**
 * examples/memfd_worker.py (issue 13 item 2: "a Python client can do the
 * same with os.memfd_create and socket.send_fds") against a real
 * `mpcache serve`, run by Debian's /usr/bin/python3 (python3-zmq,
 * python3-msgpack; the `python3` on PATH may be a pyenv shim without them).
 * Without those modules the tests are skipped, said on stderr.
 *
 * - its JSON line, exact; while it holds its registration, /api/status
 *   shows the instance with the Python process's SO_PEERCRED pid/uid/gid
 *   and its two sealed memfds, and the server maps them (/memfd:… in
 *   /proc/<server>/maps); after UNREGISTER the instance and the mappings
 *   are gone; the worker never maps anything from /dev/shm and leaves no
 *   name there;
 * - SIGKILLed while registered, on an abstract descriptor socket (`@name`):
 *   the disconnect reap removes the instance and the server's mappings;
 * - an error reply (a REGISTER the server refuses) and a server without a
 *   descriptor socket end it with exit 1 and the reason on stderr.
 */
import { spawn, spawnSync } from "node:child_process"
import { randomUUID } from "node:crypto"
import { mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { fileURLToPath } from "node:url"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { startCli } from "../support/Cli.ts"
import { eventually, getJson, getText, startServer, statusOf } from "../support/LiveFleet.ts"

const EXAMPLE = fileURLToPath(new URL("../../examples/memfd_worker.py", import.meta.url))
const PYTHON = "/usr/bin/python3"

/** Whether Debian's python3 has pyzmq and msgpack; the reason on stderr when not. */
const pythonReady = (() => {
  const probe = spawnSync(PYTHON, ["-c", "import zmq, msgpack"], { encoding: "utf8" })
  if (probe.status === 0) return true
  process.stderr.write(
    `SKIPPED test/e2e/pythonExample.test.ts: ${PYTHON} cannot import zmq and msgpack (apt-get install python3-zmq python3-msgpack): ${probe.error?.message ?? probe.stderr.trim().split("\n").pop()}\n`
  )
  return false
})()

/** An ipc endpoint in a fresh temp folder (the descriptor socket defaults to `<path>.fds` beside it), removed with the scope. */
const tempEndpoint = Effect.acquireRelease(
  Effect.sync(() => mkdtempSync(join(tmpdir(), "mpcache-py-"))),
  (dir) => Effect.sync(() => rmSync(dir, { recursive: true, force: true }))
).pipe(Effect.map((dir) => `ipc://${join(dir, "mq.sock")}`))

interface PythonRun {
  readonly pid: number
  readonly stderr: () => string
  /** Writes one line to its stdin (ends `--hold`). */
  readonly release: () => void
  readonly exited: Promise<{ readonly code: number | null; readonly stdout: string; readonly stderr: string }>
  readonly kill: () => void
}

/** The example as a child process, killed when the scope closes if still alive. */
const startExample = (args: ReadonlyArray<string>) =>
  Effect.acquireRelease(
    Effect.sync((): PythonRun => {
      const child = spawn(PYTHON, [EXAMPLE, ...args], { stdio: ["pipe", "pipe", "pipe"] })
      let stdout = ""
      let stderr = ""
      child.stdout.on("data", (d: Buffer) => (stdout += d.toString()))
      child.stderr.on("data", (d: Buffer) => (stderr += d.toString()))
      const exited = new Promise<{ code: number | null; stdout: string; stderr: string }>((resolve) =>
        child.on("close", (code) => resolve({ code, stdout, stderr }))
      )
      const kill = () => {
        if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL")
      }
      return { pid: child.pid!, stderr: () => stderr, release: () => child.stdin.end("\n"), exited, kill }
    }),
    (run) => Effect.sync(run.kill)
  )

/** Waits until `read()` matches `pattern` (polls every 20 ms; a failure after `timeoutMs`). */
const waitFor = (read: () => string, pattern: RegExp, timeoutMs: number) =>
  Effect.promise(() =>
    new Promise<RegExpMatchArray | undefined>((resolve) => {
      const started = Date.now()
      const poll = () => {
        const m = read().match(pattern)
        if (m !== null || Date.now() - started > timeoutMs) return resolve(m ?? undefined)
        setTimeout(poll, 20)
      }
      poll()
    })
  )

/** The lines of /proc/<pid>/maps that contain `text`. */
const mapsWith = (pid: number, text: string) => readFileSync(`/proc/${pid}/maps`, "utf8").split("\n").filter((l) => l.includes(text))

/** The raw /api/status document (for the blocks the decoded schema does not name: an instance's `memfd`, `fd_socket`). */
const rawStatus = (port: number) => getJson(`http://127.0.0.1:${port}/api/status`).pipe(Effect.map((d) => d as Record<string, unknown>))

/** An instance's `memfd` block in /api/status: the sender's SO_PEERCRED and each passed memfd. */
interface MemfdDetail {
  readonly pid: number
  readonly uid: number
  readonly gid: number
  readonly segments: ReadonlyArray<{ readonly segment: string; readonly bytes: number; readonly seals: ReadonlyArray<string> }>
}

const SERVER_FLAGS = ["--l1-size-gb", "0.25"]

describe.skipIf(!pythonReady)("examples/memfd_worker.py", () => {
  it.live("registers sealed memfds, stores and retrieves byte-exact; the status shows its pid/uid; nothing in /dev/shm", () =>
    Effect.scoped(Effect.gen(function*() {
      const endpoint = yield* tempEndpoint
      const { server, httpPort } = yield* startServer(endpoint, SERVER_FLAGS, 60_000)
      const serverPid = server.child.pid!
      const example = yield* startExample([endpoint, "--hold"])
      const memfdName = `mpcache-py-${example.pid}-L`

      const held = yield* waitFor(example.stderr, /holding instance (\d+) \(pid (\d+)\)/, 30_000)
      assert.isDefined(held, `the example never held its registration: ${example.stderr()}`)
      const id = held![1]!
      assert.strictEqual(Number(held![2]), example.pid)

      // Registered: the instance, its sender's credentials (SO_PEERCRED) and both passed memfds.
      const status = yield* statusOf(httpPort)
      assert.deepStrictEqual(status.instances.map((i) => [i.instance_id, i.kind]), [[id, "kv_cache"]])
      assert.deepStrictEqual(status.native, { open_mappings: 2, mapped_bytes: 2 * 32768 })
      const raw = yield* rawStatus(httpPort)
      const instance = (raw["instances"] as ReadonlyArray<Record<string, unknown>>)[0]!
      const memfd = instance["memfd"] as MemfdDetail
      const first = memfd.segments[0]?.segment ?? ""
      assert.match(first, /^memfd:[0-9a-f]{32}:0$/)
      assert.deepStrictEqual(memfd, {
        pid: example.pid,
        uid: process.getuid!(),
        gid: process.getgid!(),
        segments: [
          { segment: first, bytes: 32768, seals: ["seal", "shrink", "grow"] },
          { segment: first.replace(/:0$/, ":1"), bytes: 32768, seals: ["seal", "shrink", "grow"] }
        ]
      })
      // The token was claimed by the REGISTER: nothing pending on the descriptor socket.
      assert.deepStrictEqual((raw["fd_socket"] as Record<string, unknown>)["pending_tokens"], 0)
      // The server maps the memfds themselves; the worker maps nothing from /dev/shm.
      assert.strictEqual(mapsWith(serverPid, `/memfd:${memfdName}`).length, 2)
      assert.deepStrictEqual(mapsWith(example.pid, "/dev/shm/"), [])

      example.release()
      const done = yield* Effect.promise(() => example.exited)
      assert.strictEqual(done.code, 0, done.stderr)
      assert.deepStrictEqual(JSON.parse(done.stdout), {
        instance_id: id,
        pid: example.pid,
        chunk_size: 64,
        layers: 2,
        blocks: 16,
        memfd_bytes: 32768,
        seals_seen_by_server: [7, 7],
        stored_tokens: 128,
        store_ok: true,
        hit_tokens: 128,
        retrieve_ok: true,
        bytes_verified: 65536,
        bytes_differing: 0
      })

      // UNREGISTER released the mappings; the kernel frees the memfds with the last reference.
      const after = yield* statusOf(httpPort)
      assert.deepStrictEqual(after.instances, [])
      assert.deepStrictEqual(after.native, { open_mappings: 0, mapped_bytes: 0 })
      // The server's own count of what the example did: 2 chunks stored, looked up, hit and retrieved (2 layers × K+V × 4 blocks × 1 KiB each).
      assert.strictEqual(after.l1.objects, 2)
      assert.deepStrictEqual(after.lookup, {
        sessions: 0,
        held_locks: 0,
        pending_jobs: 0,
        peers: 0,
        max_pending_lookups: 16384,
        max_pending_lookups_per_peer: 4096,
        max_lookup_locks: 1048576,
        released: { ttl: 0, max_pending_lookups_per_peer: 0, max_pending_lookups: 0, max_lookup_locks: 0 },
        capped_lookups: 0,
        lookups: 1,
        looked_up_chunks: 2,
        hit_chunks: 2
      })
      const metrics = yield* getText(`http://127.0.0.1:${httpPort}/metrics`)
      const sample = (name: string) => metrics.match(new RegExp(`^${name}(?:\\{[^}]*\\})? (\\S+)$`, "m"))?.[1]
      assert.deepStrictEqual(
        ["stored_chunks", "stored_bytes", "retrieved_chunks", "retrieved_bytes"].map((m) => sample(`mpcache_${m}_total`)),
        ["2", "32768", "2", "32768"]
      )
      assert.deepStrictEqual(mapsWith(serverPid, `/memfd:${memfdName}`), [])
      // Other tests share /dev/shm: no name of this worker's (it creates none: memfds have no name there).
      assert.deepStrictEqual(readdirSync("/dev/shm").filter((n) => n.includes("mpcache-py") || n.includes(String(example.pid))), [])
    })), 90_000)

  it.live("SIGKILLed while registered (abstract descriptor socket): the disconnect reap unmaps its memfds", () =>
    Effect.scoped(Effect.gen(function*() {
      const endpoint = yield* tempEndpoint
      const fdSocket = `@mpcache-py-${randomUUID()}`
      const { server, httpPort } = yield* startServer(endpoint, [...SERVER_FLAGS, "--fd-socket", fdSocket, "--worker-disconnect-grace-seconds", "1"], 60_000)
      const raw = yield* rawStatus(httpPort)
      assert.deepStrictEqual((raw["fd_socket"] as Record<string, unknown>)["path"], fdSocket)
      const example = yield* startExample([endpoint, "--hold"])
      const held = yield* waitFor(example.stderr, /holding instance (\d+)/, 30_000)
      assert.isDefined(held, `the example never held its registration: ${example.stderr()}`)
      const id = held![1]!
      assert.strictEqual(mapsWith(server.child.pid!, `/memfd:mpcache-py-${example.pid}-L`).length, 2)

      example.kill()
      const done = yield* Effect.promise(() => example.exited)
      assert.strictEqual(done.stdout, "")
      const reaped = yield* eventually(statusOf(httpPort), (s) => s.recent_reaps.length > 0, 20_000)
      assert.deepStrictEqual(reaped.recent_reaps.map((r) => [r.instance_id, r.reason]), [[id, "disconnect"]])
      assert.deepStrictEqual(reaped.instances, [])
      assert.deepStrictEqual(reaped.native, { open_mappings: 0, mapped_bytes: 0 })
      // The server held the last mapping: with it gone the kernel frees the memory; no name was ever in /dev/shm.
      assert.deepStrictEqual(mapsWith(server.child.pid!, `/memfd:mpcache-py-${example.pid}-L`), [])
      assert.deepStrictEqual(readdirSync("/dev/shm").filter((n) => n.includes("mpcache-py") || n.includes(String(example.pid))), [])
    })), 90_000)

  it.live("an error reply ends it with exit 1 and the server's message", () =>
    Effect.scoped(Effect.gen(function*() {
      const endpoint = yield* tempEndpoint
      // A chunk of 24 tokens (startServer's is 64): the example's 16-token blocks do not divide it, so REGISTER is refused.
      const server = yield* startCli(["serve", "--endpoint", endpoint, "--http-port", "0", "--chunk-size", "24", ...SERVER_FLAGS])
      const [, port] = yield* server.waitForStderr(/HTTP frontend listening on http:\/\/127\.0\.0\.1:(\d+)/, 60_000)
      yield* server.waitForStderr(/MQ server listening on/, 60_000)
      const httpPort = Number(port)
      const example = yield* startExample([endpoint])
      const done = yield* Effect.promise(() => example.exited)
      assert.strictEqual(done.code, 1)
      assert.strictEqual(done.stdout, "")
      assert.strictEqual(
        done.stderr,
        "memfd_worker: invalid_argument: register_kv_cache: kv_caches[0].shape[2]: the block size (16 tokens) must divide the server's chunk size (24 tokens)\n"
      )
      // The refused REGISTER claimed the token first: its descriptors are closed, none pending.
      const raw = yield* rawStatus(httpPort)
      assert.deepStrictEqual((raw["fd_socket"] as Record<string, unknown>)["pending_tokens"], 0)
    })), 90_000)

  it.live("a server without a descriptor socket: exit 1, saying so", () =>
    Effect.scoped(Effect.gen(function*() {
      const endpoint = yield* tempEndpoint
      yield* startServer(endpoint, [...SERVER_FLAGS, "--fd-socket", "off"], 60_000)
      const example = yield* startExample([endpoint])
      const done = yield* Effect.promise(() => example.exited)
      assert.strictEqual(done.code, 1)
      assert.strictEqual(
        done.stderr,
        "memfd_worker: the server takes no memfd descriptors (features: named_segments, kv_events); start it with --fd-socket\n"
      )
    })), 90_000)
})
