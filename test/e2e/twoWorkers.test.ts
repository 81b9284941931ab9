/**
 * Two separate OS processes through a server process: worker A registers
 * its own segment and stores chunks; worker B (another process, another
 * segment) looks them up and retrieves them into different block ids; every
 * byte equals what A wrote. Then: 10 register → store → unregister cycles
 * leave no mapping of those segments in the server's /proc/<pid>/maps and
 * the open-mappings counter at 0. With CURVE off and on
 * (test/support/CurveMode.ts, issue 14).
 */
import { decodeStatusDocument } from "../../src/schema/Status.ts"
import { randomUUID } from "node:crypto"
import { readFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { startCli, runJsonScript } from "../support/Cli.ts"
import { CURVE_MODES, type CurveFixture, curveFixture } from "../support/CurveMode.ts"
import { childScript } from "../support/ChildScripts.ts"

const WORKER = childScript("worker-main")

/** A worker process with `fx`'s client keys. */
const runWorker = (fx: CurveFixture, args: Record<string, unknown>) => runJsonScript(WORKER, { ...args, ...fx.client() })

const startServer = (fx: CurveFixture) => Effect.gen(function*() {
  const endpoint = `ipc://${join(tmpdir(), `mpcache-e2e-${randomUUID()}.sock`)}`
  const server = yield* startCli(["serve", "--endpoint", endpoint, "--http-port", "0", "--chunk-size", "64", ...fx.serverArgs])
  const [, port] = yield* server.waitForStderr(/HTTP frontend listening on http:\/\/127\.0\.0\.1:(\d+)/)
  yield* server.waitForStderr(/MQ server listening on/)
  return { endpoint, server, httpPort: Number(port) }
})

const status = (port: number) =>
  Effect.promise(() => fetch(`http://127.0.0.1:${port}/api/status`).then((r) => r.json())).pipe(Effect.flatMap(decodeStatusDocument), Effect.orDie)

describe.each(CURVE_MODES)("two worker processes (CURVE $curve)", ({ curve }) => {
  const fx = curveFixture(curve)

    it.live("A stores, B (another process and segment) looks up and retrieves into other blocks: every byte equal", () =>
      Effect.scoped(Effect.gen(function*() {
        const { endpoint } = yield* startServer(fx)
        const a = yield* runWorker(fx, {
          endpoint,
          mode: "store",
          namePrefix: `mpcache-e2e-a-${randomUUID()}`,
          seed: 42,
          blockIds: Array.from({ length: 20 }, (_, i) => i + 1),
          tokenCount: 330,
          requestId: "req-a"
        })
        assert.strictEqual(a.code, 0, a.stderr)
        assert.strictEqual(a.result["ok"], true)
        const b = yield* runWorker(fx, {
          endpoint,
          mode: "retrieve",
          namePrefix: `mpcache-e2e-b-${randomUUID()}`,
          seed: 42,
          blockIds: Array.from({ length: 20 }, (_, i) => 63 - i),
          tokenCount: 330,
          requestId: "req-b"
        })
        assert.strictEqual(b.code, 0, b.stderr)
        assert.deepStrictEqual(
          { ok: b.result["ok"], hitTokens: b.result["hitTokens"], mismatches: b.result["mismatches"] },
          { ok: true, hitTokens: 320, mismatches: [] }
        )
        assert.notStrictEqual(a.result["pid"], b.result["pid"])
        assert.notStrictEqual(a.result["instanceId"], b.result["instanceId"])
      })), 60_000)

    it.live("10 register → store → unregister cycles: no mapping left in the server's maps, open mappings 0", () =>
      Effect.scoped(Effect.gen(function*() {
        const { endpoint, server, httpPort } = yield* startServer(fx)
        const prefixes: Array<string> = []
        for (let i = 0; i < 10; i++) {
          const namePrefix = `mpcache-e2e-cycle-${randomUUID()}`
          prefixes.push(namePrefix)
          const r = yield* runWorker(fx, {
            endpoint,
            mode: "store",
            namePrefix,
            seed: i,
            blockIds: Array.from({ length: 8 }, (_, j) => j + 1),
            tokenCount: 128,
            requestId: `cycle-${i}`
          })
          assert.strictEqual(r.code, 0, r.stderr)
          assert.strictEqual(r.result["ok"], true)
        }
        const maps = readFileSync(`/proc/${server.child.pid}/maps`, "utf8")
        assert.deepStrictEqual(prefixes.filter((p) => maps.includes(p)), [])
        const doc = yield* status(httpPort)
        assert.deepStrictEqual(doc["native"], { open_mappings: 0, mapped_bytes: 0 })
        assert.deepStrictEqual(doc["instances"], [])
      })), 120_000)
})
