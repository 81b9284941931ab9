/**
 * Engine-driven transfers between separate OS processes through a server
 * process (DESIGN §4 "Engine-driven"): worker A stores chunks, worker B
 * (another process) looks them up and retrieves them, byte-exact — through
 * the server's shared L1 pool that each worker maps in its own process, and
 * through inline bytes (`--engine-driven-transport inline`). And a worker
 * SIGKILLed between PREPARE_STORE and COMMIT_STORE is reaped on disconnect
 * with nothing of its pending store published. With CURVE off and on
 * (test/support/CurveMode.ts, issue 14); with CURVE the shared pool is
 * refused (issue 24 item 7: test/e2e/tenantPool.test.ts) and inline is the
 * default.
 */
import { decodeStatusDocument } from "../../src/schema/Status.ts"
import { randomUUID } from "node:crypto"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { type CliProcess, startCli, startScript, runJsonScript } from "../support/Cli.ts"
import { CURVE_MODES, type CurveFixture, curveFixture } from "../support/CurveMode.ts"
import { childScript } from "../support/ChildScripts.ts"

const WORKER = childScript("engine-driven-worker-main")

/** A worker process with `fx`'s client keys. */
const runWorker = (fx: CurveFixture, args: Record<string, unknown>) => runJsonScript(WORKER, { ...args, ...fx.client() })

const startServer = (fx: CurveFixture, extra: ReadonlyArray<string>) =>
  Effect.gen(function*() {
    const endpoint = `ipc://${join(tmpdir(), `mpcache-e2e-ed-${randomUUID()}.sock`)}`
    const server = yield* startCli([
      "serve",
      "--endpoint",
      endpoint,
      "--http-port",
      "0",
      "--chunk-size",
      "64",
      "--l1-size-gb",
      "0.0625",
      "--no-l1-prefault",
      ...fx.serverArgs,
      ...extra
    ])
    const [, port] = yield* server.waitForStderr(/HTTP frontend listening on http:\/\/127\.0\.0\.1:(\d+)/)
    yield* server.waitForStderr(/MQ server listening on/)
    return { endpoint, server, httpPort: Number(port) }
  })

/** SIGTERM: the server unlinks its L1 pool on the way out (a SIGKILL at scope end would leave it in /dev/shm). */
const stopServer = (server: CliProcess) =>
  Effect.gen(function*() {
    const exit = yield* server.stop("SIGTERM")
    assert.strictEqual(exit.code, 0, server.stderr().slice(-2000))
  })

const status = (port: number) =>
  Effect.promise(() => fetch(`http://127.0.0.1:${port}/api/status`).then((r) => r.json())).pipe(Effect.flatMap(decodeStatusDocument), Effect.orDie)

const storeThenRetrieve = (fx: CurveFixture, transport: "shm" | "inline") =>
  Effect.scoped(Effect.gen(function*() {
    const { endpoint, httpPort, server } = yield* startServer(fx, ["--engine-driven-transport", transport])
    const a = yield* runWorker(fx, { endpoint, mode: "store", seed: 42, tokenCount: 330, requestId: "req-a" })
    assert.strictEqual(a.code, 0, a.stderr)
    assert.deepStrictEqual([a.result["ok"], a.result["transport"]], [true, transport])
    const b = yield* runWorker(fx, { endpoint, mode: "retrieve", seed: 42, tokenCount: 330, requestId: "req-b" })
    assert.strictEqual(b.code, 0, b.stderr)
    assert.deepStrictEqual(
      { ok: b.result["ok"], chunks: b.result["chunks"], hitTokens: b.result["hitTokens"], mismatches: b.result["mismatches"], transport: b.result["transport"] },
      { ok: true, chunks: 5, hitTokens: 320, mismatches: [], transport }
    )
    assert.notStrictEqual(a.result["pid"], b.result["pid"])
    assert.notStrictEqual(a.result["instanceId"], b.result["instanceId"])
    // Both unregistered at exit; the server maps no worker memory (the workers mapped its pool, not the reverse).
    const doc = yield* status(httpPort)
    assert.deepStrictEqual(doc["instances"], [])
    assert.deepStrictEqual(doc["native"], { open_mappings: 0, mapped_bytes: 0 })
    const ed = doc.engine_driven
    assert.deepStrictEqual([ed.transport, ed.contexts, ed.pending_stores, ed.pending_retrieves], [transport, 0, 0, 0])
    const l1 = doc.l1
    assert.deepStrictEqual([l1.objects, l1.reserved_objects, l1.locked_objects], [5, 0, 0])
    yield* stopServer(server)
  }))

describe.each(CURVE_MODES)("engine-driven workers in two processes (CURVE $curve)", ({ curve }) => {
  const fx = curveFixture(curve)

    // With CURVE `serve --engine-driven-transport shm` exits 2 (test/e2e/tenantPool.test.ts).
    it.live.skipIf(curve)("through the shared pool: A stores, B retrieves every byte", () => storeThenRetrieve(fx, "shm"), 60_000)

    it.live("through inline bytes: A stores, B retrieves every byte", () => storeThenRetrieve(fx, "inline"), 60_000)

    it.live("a worker SIGKILLed between PREPARE_STORE and COMMIT_STORE is reaped on disconnect; nothing of it is published", () =>
      Effect.scoped(Effect.gen(function*() {
        const { endpoint, httpPort, server } = yield* startServer(fx, ["--worker-disconnect-grace-seconds", "1"])
        const hung = yield* startScript(WORKER, [JSON.stringify({ endpoint, mode: "prepare-and-hang", seed: 5, tokenCount: 256, requestId: "hang", ...fx.client() })])
        const [line] = yield* hung.waitForStdout(/\{.*\}\n/)
        const info = JSON.parse(line) as { readonly instanceId: string; readonly slots: number }
        assert.strictEqual(info.slots, 4)
        const before = yield* status(httpPort)
        assert.strictEqual(before.l1.reserved_objects, 4)
        yield* hung.stop("SIGKILL")
        yield* server.waitForStderr(new RegExp(`reaped instance ${info.instanceId}: .*reason disconnect`), 15_000)
        const after = yield* status(httpPort)
        assert.deepStrictEqual(after["instances"], [])
        const l1 = after.l1
        assert.deepStrictEqual([l1.objects, l1.reserved_objects, l1.used_bytes], [0, 0, 0])
        // A later worker stores the same tokens from scratch: all 4 chunks are wanted again.
        const again = yield* runWorker(fx, { endpoint, mode: "store", seed: 5, tokenCount: 256, requestId: "again" })
        assert.strictEqual(again.code, 0, again.stderr)
        assert.strictEqual(again.result["ok"], true)
        assert.strictEqual((yield* status(httpPort)).l1.objects, 4)
        yield* stopServer(server)
      })), 60_000)
})
