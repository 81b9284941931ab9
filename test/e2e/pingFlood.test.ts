/**
 * Issue 27 item 1, the attack itself with real processes and sockets: one peer cannot starve the others. Eight
 * DEALERs (bench/ping/flooder.ts: receive high-water mark 1, a 4 KiB receive buffer) send nil PINGs as fast as
 * they can and read none, for as long as the test runs. Before the fix the receive loop answered the flood ahead
 * of everyone: a fresh client's PINGs waited behind an inbox that grew without bound, and timed out; then, shed,
 * the flood still kept the server busy at the flooders' pace and its memory growing in libzmq's unbounded receive
 * pipes.
 *
 * What must hold, told by events and counters, not by wall time (the machine may be busy): while the flood is
 * still going on and the server's receive loop is braking the flooders (their replies back up: they are held to
 * its share and wait in their own sends), a fresh client's 30 PINGs and a registered worker's heartbeats
 * (PING_REGISTERED) are all answered, each with its own answer, none `overloaded`; what waits for the server stays
 * within its per-peer bound; the server says which peers it slows and why; once the flooders stop, the server is
 * idle again and its counters agree with /metrics. The latencies are bench:ping --flood's (docs/benchmarks.md).
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { ZmqSocketsLive } from "../../src/layers/Zmq.ts"
import { makeInstanceId } from "../../src/schema/InstanceId.ts"
import { Ping, PingRegistered } from "../../src/schema/Op.ts"
import { makeMqClient } from "../../src/services/client/MqClient.ts"
import { MAX_INBOUND_MESSAGES_PER_PEER } from "../../src/services/server/internal/PeerQueues.ts"
import { BACKED_UP_BURST, BACKED_UP_MESSAGES_PER_SECOND } from "../../src/services/server/internal/ReceiveBrake.ts"
import { RECEIVE_HIGH_WATER_MARK } from "../../src/services/server/MqServer.ts"
import { startScript } from "../support/Cli.ts"
import { eventually, getText, ipcEndpoint, startServer, startWorker, statusOf } from "../support/LiveFleet.ts"
import { samplesOf } from "../support/PromQl.ts"

const FLOODERS = 8
/** A bound on a hang, not a timing: each well-behaved request must be answered at all while the flood goes on. */
const HANG_BOUND_MS = 30_000

describe("one peer cannot starve the others (issue 27 item 1)", () => {
  it.live("8 DEALERs flooding PINGs and reading none: a fresh client's 30 PINGs and a worker's heartbeats are all answered while the flooders are braked", () =>
    Effect.scoped(Effect.gen(function*() {
      const endpoint = ipcEndpoint()
      const { httpPort, server } = yield* startServer(endpoint, ["--l1-size-gb", "0.0625", "--no-l1-prefault"])
      const worker = yield* startWorker(endpoint, 1_000, 60_000)
      const flooder = yield* startScript("bench/ping/flooder.ts", [endpoint, String(FLOODERS), "0"])
      yield* flooder.waitForStdout(/"flooding":8/)
      // The flooders' replies back up (they read none): the receive loop holds them to its share and waits.
      const braking = yield* eventually(statusOf(httpPort), (s) => s.inbound.brake.pauses > 0, 60_000)
      assert.isAbove(braking.inbound.brake.pauses, 0, "the receive loop never braked the flooders")

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

      // All of that happened during the flood: the flooders are still sending and being braked.
      const during = yield* eventually(statusOf(httpPort), (s) => s.inbound.brake.pauses > braking.inbound.brake.pauses, 60_000)
      assert.isAbove(during.inbound.brake.braked_messages, braking.inbound.brake.braked_messages)
      assert.deepStrictEqual(
        [during.inbound.brake.messages_per_second, during.inbound.brake.burst, during.inbound.receive_high_water_mark],
        [BACKED_UP_MESSAGES_PER_SECOND, BACKED_UP_BURST, RECEIVE_HIGH_WATER_MARK]
      )
      // What waits for the receive fiber stays within the per-peer bound (the fresh client's and heartbeat's own
      // requests are answered, so at most theirs besides).
      assert.isAtMost(during.inbound.queued, FLOODERS * MAX_INBOUND_MESSAGES_PER_PEER + 2)
      assert.strictEqual(during.inbound.max_messages_per_peer, MAX_INBOUND_MESSAGES_PER_PEER)
      // The flooders are the ones slowed: their replies cannot be delivered (their pipes stay full), and the server
      // says which peer it holds back and why (fails the test when no such WARNING comes within the hang bound).
      assert.isAbove(during.undeliverable_replies, 0)
      yield* server.waitForStderr(/messages? from peer [0-9a-f]+ taken under the receive loop's brake \(its replies back up\)/, HANG_BOUND_MS)
      assert.isTrue(flooder.child.exitCode === null, "the flooder stopped before the test was done")

      yield* flooder.stop("SIGTERM")
      // Their connections gone (each one's disconnect comes after the last message it had sent) and what they had
      // sent handled, nothing waits any more.
      const after = during.connected_peers - FLOODERS
      const idle = yield* eventually(
        statusOf(httpPort),
        (s) => s.connected_peers === after && s.inbound.queued === 0 && s.inbound.peers === 0,
        60_000
      )
      assert.deepStrictEqual([idle.connected_peers, idle.inbound.queued, idle.inbound.peers], [after, 0, 0])
      assert.strictEqual(yield* fresh.request(Ping, [null]), true)
      // Every braked message and shed request counted alike in status and in /metrics, once the flood is over.
      const settled = yield* statusOf(httpPort)
      const scrape = samplesOf(yield* getText(`http://127.0.0.1:${httpPort}/metrics`))
      const sample = (name: string) => scrape.filter((x) => x.name === name).map((x) => x.value)
      assert.deepStrictEqual(
        [sample("mpcache_braked_messages_total"), sample("mpcache_shed_requests_total")],
        [[settled.inbound.brake.braked_messages], [settled.inbound.shed_requests]]
      )
    }).pipe(Effect.provide(ZmqSocketsLive))), 180_000)
})
