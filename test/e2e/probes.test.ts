/**
 * Probes that mean something, end to end (issue 27 item 3; Readiness.ts): a
 * real `mpcache serve` child answers `/livez` and `/readyz` with every check
 * named, without the bearer token that guards every other route
 * (docs/security.md "Probes"); `mpcache status` prints readiness; SIGSTOP then
 * SIGCONT: `/livez` tells the stall the event-loop ticker saw; the
 * `--fd-socket` file removed: `/readyz` 503 naming fd_socket, and `mpcache
 * status` prints the failing check; an L2 on a closed port: `/readyz` still
 * 200, the breaker reported open, not fatal.
 */
import { mkdtempSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Schema } from "effect"
import { decodeStatusDocument, LivenessProbe, StatusReadiness } from "../../src/schema/Status.ts"
import { runCli } from "../support/Cli.ts"
import { quietPort } from "../support/QuietPort.ts"
import { eventually, ipcEndpoint, startServer } from "../support/LiveFleet.ts"

const TOKEN = "e2e-probe-token-abcdefghijkl"

/** GET `url` (with `authorization` when given): the HTTP status and the body parsed as JSON (text when it is not). */
const get = (url: string, authorization?: string) =>
  Effect.promise(async () => {
    const r = await fetch(url, authorization === undefined ? {} : { headers: { authorization } })
    const text = await r.text()
    let body: unknown = text
    try {
      body = JSON.parse(text)
    } catch {
      // not JSON: the 401 text
    }
    return { status: r.status, body }
  })

const readyz = (port: number) =>
  get(`http://127.0.0.1:${port}/readyz`).pipe(
    Effect.flatMap((r) => Effect.map(Schema.decodeUnknownEffect(StatusReadiness)(r.body), (body) => ({ status: r.status, body }))),
    Effect.orDie
  )
const livez = (port: number) =>
  get(`http://127.0.0.1:${port}/livez`).pipe(
    Effect.flatMap((r) => Effect.map(Schema.decodeUnknownEffect(LivenessProbe)(r.body), (body) => ({ status: r.status, body }))),
    Effect.orDie
  )

/** A TCP port nothing listens on, below the ephemeral range so no file beside this one starts listening on it. */
const closedPort = Effect.promise(quietPort)

const READY_NAMES = ["mq_bound", "l1_pool", "reaper", "fd_socket", "l2"]

describe("probes (real server)", () => {
  it.live("/livez and /readyz 200 with every check, without the token; status prints readiness; SIGSTOP → /livez tells the stall; fd socket gone → 503", () =>
    Effect.scoped(Effect.gen(function*() {
      const dir = mkdtempSync(join(tmpdir(), "mpcache-probes-"))
      yield* Effect.addFinalizer(() => Effect.sync(() => rmSync(dir, { recursive: true, force: true })))
      const tokenFile = join(dir, "token")
      writeFileSync(tokenFile, `${TOKEN}\n`, { mode: 0o600 })
      const fdSocket = join(dir, "fd.sock")
      const { server, httpPort } = yield* startServer(
        ipcEndpoint(),
        ["--http-token-file", tokenFile, "--fd-socket", fdSocket, "--l1-size-gb", "0.0625", "--no-l1-prefault"],
        60_000
      )
      const base = `http://127.0.0.1:${httpPort}`

      const live = yield* livez(httpPort)
      assert.strictEqual(live.status, 200)
      assert.strictEqual(live.body.status, "live")
      assert.deepStrictEqual(live.body.checks.map((c) => [c.name, c.ok]), [["process", true], ["event_loop", true]])
      // A machine busy enough can make the loop a second late on its own: a stall told before the stop is allowed.
      assert.match(live.body.checks[1]!.detail, /^last tick \d+\.\d{3} s ago \(bound 5 s\); (no stall seen|last stall: a tick \d+\.\d{3} s late, ended \d+\.\d{3} s ago)$/)

      const ready = yield* readyz(httpPort)
      assert.strictEqual(ready.status, 200, JSON.stringify(ready.body))
      assert.strictEqual(ready.body.status, "ready")
      assert.deepStrictEqual(ready.body.checks.map((c) => [c.name, c.ok]), READY_NAMES.map((n) => [n, true]))
      const byName = Object.fromEntries(ready.body.checks.map((c) => [c.name, c.detail]))
      assert.strictEqual(byName["mq_bound"], "the ROUTER is bound and receiving")
      assert.strictEqual(byName["l1_pool"], `shared pool of ${0.0625 * 2 ** 30} bytes allocated (0 prefaulted), 0 bytes used`)
      // Default windows: timeout 120 s, disconnect grace 10 s → a scan every 5 s.
      assert.match(byName["reaper"]!, /^(last scan ended|no scan has ended in the) \d+\.\d{3} s.* \(period 5 s, bound 2 × 5 s = 10 s\)$/)
      assert.strictEqual(byName["fd_socket"], "configured (--fd-socket) and listening")
      assert.strictEqual(byName["l2"], "not configured (--l2-url)")
      // Nothing in the probes names the paths the server was given.
      assert.notInclude(JSON.stringify(ready.body), dir)

      // Every other route still needs the token.
      assert.strictEqual((yield* get(`${base}/api/status`)).status, 401)
      const status = yield* get(`${base}/api/status`, `Bearer ${TOKEN}`)
      const doc = yield* decodeStatusDocument(status.body).pipe(Effect.orDie)
      assert.deepStrictEqual(doc.readiness.checks.map((c) => c.name), READY_NAMES)
      assert.strictEqual(doc.readiness.status, "ready")

      const summary = yield* runCli(["status", "--http-port", String(httpPort), "--http-token-file", tokenFile], 30_000)
      assert.strictEqual(summary.code, 0, summary.stderr)
      assert.strictEqual(summary.stdout.split("\n")[1], "readiness ready · mq_bound, l1_pool, reaper, fd_socket, l2 ok")

      // SIGSTOP past the stall bound (1 s) and the liveness bound (5 s), then SIGCONT: the stall WARNING is the event.
      const stoppedMs = yield* server.pauseFor(6_000)
      // At least the stop less one tick period (250 ms): the tick was due at most one period after the stop.
      const atLeast = (stoppedMs - 250 - 1) / 1000
      const lateOf = (detail: string) => Number(/; last stall: a tick (\d+\.\d{3}) s late, ended \d+\.\d{3} s ago$/.exec(detail)?.[1] ?? "0")
      yield* server.waitForStderr(/server stalled for \d+\.\d{3} s/, 60_000)
      // Whichever detector told it, the ticker's late tick is what /livez tells: waited for, never raced (an earlier,
      // shorter stall of a busy machine is not the stop's).
      const after = yield* eventually(livez(httpPort), (r) => lateOf(r.body.checks[1]!.detail) >= atLeast, 30_000)
      assert.strictEqual(after.status, 200, JSON.stringify(after.body))
      assert.isAtLeast(lateOf(after.body.checks[1]!.detail), atLeast, after.body.checks[1]!.detail)

      // The descriptor socket's file removed (a hostPath cleaned under a running server): not ready, said by fd_socket.
      rmSync(fdSocket)
      const gone = yield* readyz(httpPort)
      assert.strictEqual(gone.status, 503)
      assert.strictEqual(gone.body.status, "not_ready")
      assert.deepStrictEqual(gone.body.checks.filter((c) => !c.ok), [{
        name: "fd_socket",
        ok: false,
        detail: "configured (--fd-socket) but the socket file is gone or is no socket: clients cannot connect"
      }])
      const failing = yield* runCli(["status", "--http-port", String(httpPort), "--http-token-file", tokenFile], 30_000)
      assert.strictEqual(failing.code, 0, failing.stderr)
      assert.deepStrictEqual(failing.stdout.split("\n").slice(1, 3), [
        "readiness not ready · 1 of 5 checks failing",
        "  fd_socket: configured (--fd-socket) but the socket file is gone or is no socket: clients cannot connect"
      ])
    })), 120_000)

  it.live("an L2 on a closed port: /readyz 200, the l2 check reports the breaker open, not fatal; reaping off: said, /livez still fed", () =>
    Effect.scoped(Effect.gen(function*() {
      const port = yield* closedPort
      const { httpPort } = yield* startServer(
        ipcEndpoint(),
        [
          "--l2-url", `redis://127.0.0.1:${port}`, "--l1-size-gb", "0.0625", "--no-l1-prefault",
          "--worker-reap-timeout-seconds", "0", "--worker-disconnect-grace-seconds", "0"
        ],
        60_000
      )
      // The breaker probes at once; its failed first PING opens it.
      const open = yield* eventually(readyz(httpPort), (r) => r.body.checks.some((c) => c.name === "l2" && c.detail.startsWith("breaker open")), 30_000)
      assert.strictEqual(open.status, 200, JSON.stringify(open.body))
      assert.strictEqual(open.body.status, "ready")
      assert.deepStrictEqual(open.body.checks.find((c) => c.name === "l2"), {
        name: "l2",
        ok: true,
        detail: "breaker open, not connected (not fatal: L2 is skipped, every L2 read a miss, until it recovers)"
      })
      assert.deepStrictEqual(open.body.checks.map((c) => [c.name, c.ok]), READY_NAMES.map((n) => [n, true]))
      assert.deepStrictEqual(open.body.checks.find((c) => c.name === "reaper"), {
        name: "reaper",
        ok: true,
        detail: "reaping is off (--worker-reap-timeout-seconds and --worker-disconnect-grace-seconds are 0)"
      })
      // Without the reaper, Readiness's own (quiet) ticker feeds event_loop.
      const live = yield* eventually(livez(httpPort), (r) => r.status === 200, 30_000)
      assert.strictEqual(live.body.status, "live", JSON.stringify(live.body))
    })), 90_000)
})
