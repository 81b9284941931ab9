/**
 * A live worker cannot be reaped by what it sends (issue 14, DESIGN §8): its
 * own lone empty frames look exactly like ROUTER_NOTIFY's connect/disconnect
 * notifications, and the server tells them apart with a ROUTER_MANDATORY
 * probe. Real processes, real libzmq, real SIGKILL.
 */
import { randomUUID } from "node:crypto"
import { readdirSync, rmSync } from "node:fs"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { startScript } from "../support/Cli.ts"
import { getText, ipcEndpoint, startServer, statusOf } from "../support/LiveFleet.ts"
import { childScript } from "../support/ChildScripts.ts"

const WORKER = childScript("empty-frame-worker")

const metricsOf = (port: number) => getText(`http://127.0.0.1:${port}/metrics`)

/** A server with a 1 s disconnect grace, and a name prefix for its workers' segments (unlinked with the scope). */
const serverWithGraceOf1s = Effect.gen(function*() {
  const endpoint = ipcEndpoint()
  const { server, httpPort } = yield* startServer(endpoint, ["--no-l1-prefault", "--l1-size-gb", "0.0625", "--worker-disconnect-grace-seconds", "1"])
  const namePrefix = `mpcache-empty-${randomUUID()}`
  // SIGKILLed workers cannot unlink their own segments.
  yield* Effect.addFinalizer(() =>
    Effect.sync(() => {
      for (const n of readdirSync("/dev/shm")) if (n.startsWith(namePrefix)) rmSync(`/dev/shm/${n}`, { force: true })
    })
  )
  return { endpoint, server, httpPort, namePrefix }
})

describe("lone empty frames from a live peer", () => {
  it.live("a worker sending them every 100 ms for 3 × the disconnect grace is never suspect nor reaped; SIGKILLed, it is reaped on the grace", () =>
    Effect.scoped(Effect.gen(function*() {
      const { endpoint, server, httpPort, namePrefix } = yield* serverWithGraceOf1s
      const worker = yield* startScript(WORKER, [JSON.stringify({ endpoint, namePrefix, everyMs: 100 })])
      const [line] = yield* worker.waitForStdout(/\{"event":"registered".*\}/, 20_000)
      const instanceId = (JSON.parse(line) as { instanceId: string }).instanceId
      // 3 s: three disconnect graces of empty frames, sampled every 100 ms.
      const states: Array<string> = []
      for (let i = 0; i < 30; i++) {
        const s = yield* statusOf(httpPort)
        states.push(s.instances.find((x) => x.instance_id === instanceId)?.state ?? "gone")
        yield* Effect.sleep("100 millis")
      }
      assert.deepStrictEqual([...new Set(states)], ["startup"])
      const metrics = yield* metricsOf(httpPort)
      const dropped = Number(metrics.match(/^mpcache_dropped_messages_total (\d+)/m)?.[1] ?? "0")
      assert.isAtLeast(dropped, 20)
      assert.notMatch(metrics, /mpcache_reaps_total\{reason="disconnect"\} [1-9]/)
      assert.match(server.stderr(), /a lone empty frame from a connected peer is not a ROUTER notification/)
      // Its real death is still noticed as a disconnect.
      const killedAt = Date.now()
      worker.child.kill("SIGKILL")
      const [, silent] = yield* server.waitForStderr(
        new RegExp(`reaped instance ${instanceId}: silent for (\\d+\\.\\d) s, longer than its disconnect grace of 1 s \\(reason disconnect\\)`)
      )
      // Reaped on the 1 s grace (not on the 30 s reap timeout), counted from the disconnect itself: the silence the
      // server measured is at least the grace and at most the time since the kill (a bound the machine's load cannot
      // break, where a wall-clock deadline would race the reaper).
      assert.isAtLeast(Number(silent), 1.0)
      assert.isAtMost(Number(silent), Math.ceil((Date.now() - killedAt) / 100) / 10)
      assert.deepStrictEqual((yield* statusOf(httpPort)).instances, [])
    })), 60_000)

  it.live("8 workers SIGKILLed at once: every one is reaped on the disconnect grace (a disconnect is never taken for a peer's own frame)", () =>
    Effect.scoped(Effect.gen(function*() {
      const { endpoint, server, httpPort, namePrefix } = yield* serverWithGraceOf1s
      // Workers that register and then stay silent (no empty frames of their own).
      const workers = yield* Effect.forEach(
        Array.from({ length: 8 }, (_, i) => i),
        (i) => startScript(WORKER, [JSON.stringify({ endpoint, namePrefix: `${namePrefix}-${i}`, everyMs: 3_600_000 })]),
        { concurrency: "unbounded" }
      )
      yield* Effect.forEach(workers, (w) => w.waitForStdout(/\{"event":"registered".*\}/, 60_000), { concurrency: "unbounded" })
      assert.strictEqual((yield* statusOf(httpPort)).instances.length, 8)
      for (const w of workers) w.child.kill("SIGKILL")
      for (let i = 0; i < 100 && (yield* statusOf(httpPort)).instances.length > 0; i++) yield* Effect.sleep("100 millis")
      assert.deepStrictEqual((yield* statusOf(httpPort)).instances, [])
      const metrics = yield* metricsOf(httpPort)
      assert.match(metrics, /mpcache_reaps_total\{reason="disconnect"\} 8/)
      assert.notMatch(server.stderr(), /is not a ROUTER notification/)
    })), 120_000)
})
