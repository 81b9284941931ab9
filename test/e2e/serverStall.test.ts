/**
 * The server's own stall end to end (issue 18 "operators must see what the
 * server decided"): a real server process stopped with SIGSTOP and resumed
 * with SIGCONT logs one WARNING with how long it was stopped, and /metrics
 * counts it once.
 */
import { randomUUID } from "node:crypto"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Schedule } from "effect"
import { startCli } from "../support/Cli.ts"

describe("server stall end to end", () => {
  it.live("SIGSTOP the server for 2.5 s, then SIGCONT: one WARNING with the figures, counted in mpcache_server_stalls_total", () =>
    Effect.scoped(Effect.gen(function*() {
      // A 1 s disconnect grace: the reaper scans every 0.5 s, so both detectors see the pause.
      const server = yield* startCli([
        "serve", "--endpoint", `ipc://${join(tmpdir(), `mpcache-stall-${randomUUID()}.sock`)}`, "--http-port", "0", "--chunk-size", "64",
        "--worker-disconnect-grace-seconds", "1"
      ])
      const [, port] = yield* server.waitForStderr(/HTTP frontend listening on http:\/\/127\.0\.0\.1:(\d+)/)
      yield* server.waitForStderr(/reaper: scanning every 0\.5 s/)
      // A busy machine can make the server's event loop late by more than a second on its own, which is a stall the
      // server rightly tells: the stop's own WARNING is the one after the stop that covers it, and the other lines
      // (if any) must be shorter and counted too.
      const STALL = /server stalled for (\d+\.\d{3}) s \([^)]*\); liveness deadlines were extended by (\d+\.\d{3}) s/
      // The server's event loop answers right before the stop: no detector's tick was due much before `aliveAt`.
      const aliveAt = Date.now()
      yield* Effect.promise(() => fetch(`http://127.0.0.1:${port}/metrics`).then((r) => r.text()))
      const before = server.countStderr(STALL)
      const stoppedMs = yield* server.pauseFor(2_500)
      // At least the stop (as this process measured it: a busy machine makes it longer than 2.5 s) less one
      // detector period (0.5 s); at most the time from the server's last answer before the stop until the report
      // was read, plus the 1 s of lateness a ticker may carry unreported (Stalls.ts). Bounds the machine's load
      // cannot break, where fixed ones race it: a detector's tick can be due well before the stop on a busy machine.
      const atLeast = (stoppedMs - 500 - 1) / 1000
      let told: RegExpMatchArray | undefined
      for (let n = before + 1; told === undefined; n++) {
        const line = yield* server.waitForStderr(STALL, 60_000, n)
        if (Number(line[1]) >= atLeast) told = line
      }
      const reportedMs = Date.now() - aliveAt
      const [, stalled, extended] = told
      assert.strictEqual(extended, stalled)
      assert.isAtLeast(Number(stalled), atLeast)
      assert.isAtMost(Number(stalled), (reportedMs + 1_000 + 1) / 1000)
      // Told once: no other line after the stop is as long as the stop.
      const after = [...server.stderr().matchAll(new RegExp(STALL.source, "g"))].slice(before).map((m) => Number(m[1]))
      assert.deepStrictEqual(after.filter((x) => x >= atLeast), [Number(stalled)])
      // Both detectors' series exist from the start (issue 25 item 6), and together they count every stall told.
      const counted = yield* Effect.promise(() => fetch(`http://127.0.0.1:${port}/metrics`).then((r) => r.text())).pipe(
        Effect.map((metrics) => ({
          series: metrics.split("\n").filter((l) => l.startsWith("mpcache_server_stalls_total{")),
          told: server.countStderr(STALL)
        })),
        Effect.repeat({ until: ({ series, told }) => series.reduce((n, l) => n + Number(l.split(" ")[1]), 0) === told, schedule: Schedule.spaced("100 millis") }),
        Effect.timeout("60 seconds"),
        Effect.orDie
      )
      assert.deepStrictEqual(counted.series.map((l) => /\{source="(reaper|event_loop)"\}/.exec(l)?.[1]).sort(), ["event_loop", "reaper"])
      assert.isAtLeast(counted.told, 1)
    })), 120_000)
})
