/**
 * Issue 27 item 1, the attack itself with real processes and sockets: one peer cannot starve the others. Eight
 * DEALERs (bench/ping/flooder.ts: receive high-water mark 1, a 4 KiB receive buffer) send nil PINGs as fast as
 * they can and read none, for as long as the test runs. Before the fix the receive loop answered the flood ahead
 * of everyone: a fresh client's PINGs waited behind an inbox that grew without bound, and timed out.
 *
 * What must hold, told by events and counters, not by wall time (the machine may be busy): while the flood is
 * still going on and the server is shedding the flooders' requests, a fresh client's 30 PINGs and a registered
 * worker's heartbeats (PING_REGISTERED) are all answered, each with its own answer, none `overloaded`; what waits
 * for the server stays within its per-peer bound; the flooders' shed requests get no answer built (their replies
 * back up), as the server's WARNING says; once the flooders stop, the server is idle again.
 * The latencies are bench:ping --flood's (docs/benchmarks.md).
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { ZmqSocketsLive } from "../../src/layers/Zmq.ts"
import { makeInstanceId } from "../../src/schema/InstanceId.ts"
import { Ping, PingRegistered } from "../../src/schema/Op.ts"
import { makeMqClient } from "../../src/services/client/MqClient.ts"
import { MAX_INBOUND_MESSAGES_PER_PEER } from "../../src/services/server/internal/PeerQueues.ts"
import { startScript } from "../support/Cli.ts"
import { eventually, getText, ipcEndpoint, startServer, startWorker, statusOf } from "../support/LiveFleet.ts"
import { samplesOf } from "../support/PromQl.ts"

const FLOODERS = 8
/** A bound on a hang, not a timing: each well-behaved request must be answered at all while the flood goes on. */
const HANG_BOUND_MS = 30_000

describe("one peer cannot starve the others (issue 27 item 1)", () => {
  it.live("8 DEALERs flooding PINGs and reading none: a fresh client's 30 PINGs and a worker's heartbeats are all answered while the flooders are shed", () =>
    Effect.scoped(Effect.gen(function*() {
      const endpoint = ipcEndpoint()
      const { httpPort, server } = yield* startServer(endpoint, ["--l1-size-gb", "0.0625", "--no-l1-prefault"])
      const worker = yield* startWorker(endpoint, 1_000, 60_000)
      const flooder = yield* startScript("bench/ping/flooder.ts", [endpoint, String(FLOODERS), "0"])
      yield* flooder.waitForStdout(/"flooding":8/)
      // The flood is past what the server serves for those peers: their requests are being shed.
      const shedding = yield* eventually(statusOf(httpPort), (s) => s.inbound.shed_requests > 0, 60_000)
      assert.isAbove(shedding.inbound.shed_requests, 0, "the flood never reached the per-peer bound")

      const fresh = yield* makeMqClient({ endpoint, requestTimeoutMs: HANG_BOUND_MS, lingerMs: 0 })
      const heartbeat = yield* makeMqClient({ endpoint, requestTimeoutMs: HANG_BOUND_MS, lingerMs: 0 })
      const id = makeInstanceId(BigInt(worker.instanceId))
      const answers: Array<boolean> = []
      const held: Array<ReadonlyArray<string>> = []
      for (let i = 0; i < 30; i++) {
        answers.push(yield* fresh.request(Ping, [null]))
        if (i % 10 === 0) held.push(yield* heartbeat.request(PingRegistered, [id, ["kv_cache"]]))
        yield* Effect.sleep("50 millis")
      }
      assert.deepStrictEqual(answers, Array(30).fill(true))
      // The server still holds the worker (its own heartbeat got through the flood too).
      assert.deepStrictEqual(held, [[], [], []])

      // All of that happened during the flood: the flooders are still sending and being shed.
      const during = yield* eventually(statusOf(httpPort), (s) => s.inbound.shed_requests > shedding.inbound.shed_requests, 60_000)
      assert.isAbove(during.inbound.shed_requests, shedding.inbound.shed_requests)
      // What waits for the receive fiber stays within the per-peer bound (the fresh client's and heartbeat's own
      // requests are answered, so at most theirs besides).
      assert.isAtMost(during.inbound.queued, FLOODERS * MAX_INBOUND_MESSAGES_PER_PEER + 2)
      assert.strictEqual(during.inbound.max_messages_per_peer, MAX_INBOUND_MESSAGES_PER_PEER)
      // The flooders are the ones slowed: their replies cannot be delivered (their pipes stay full), and what they
      // send past their bound is shed with no answer built (the server's WARNING names why).
      assert.isAbove(during.undeliverable_replies, 0)
      // Fails the test when no such WARNING comes within the hang bound.
      yield* server.waitForStderr(/requests? from peer [0-9a-f]+ shed without being handled \([^)]*not answered: its replies back up/, HANG_BOUND_MS)
      assert.isTrue(flooder.child.exitCode === null, "the flooder stopped before the test was done")

      yield* flooder.stop("SIGTERM")
      // Their connections gone and what they had sent handled, nothing waits any more.
      const idle = yield* eventually(statusOf(httpPort), (s) => s.inbound.queued === 0 && s.inbound.peers === 0, 60_000)
      assert.deepStrictEqual([idle.inbound.queued, idle.inbound.peers], [0, 0])
      assert.strictEqual(yield* fresh.request(Ping, [null]), true)
      // Every shed request counted alike in status and in /metrics, once the flood is over.
      const scrape = samplesOf(yield* getText(`http://127.0.0.1:${httpPort}/metrics`)).filter((x) => x.name === "mpcache_shed_requests_total")
      const settled = yield* statusOf(httpPort)
      assert.deepStrictEqual(scrape.map((x) => x.value), [settled.inbound.shed_requests])
    }).pipe(Effect.provide(ZmqSocketsLive))), 180_000)
})
