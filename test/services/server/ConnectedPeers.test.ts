/**
 * The connected peers of the MQ server (src/services/server/internal/ConnectedPeers.ts, DESIGN §5, issue 14): the
 * first lone empty frame of a routing id is ROUTER_NOTIFY's connect; a later one is probed over PROBE_DELAYS_MS
 * (on the TestClock) and is the disconnect only when a probe answers EHOSTUNREACH, else dropped as the peer's own.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { TestClock } from "effect/testing"
import { makeConnectedPeers, PROBE_DELAYS_MS } from "../../../src/services/server/internal/ConnectedPeers.ts"

const until = (holds: () => boolean) =>
  Effect.gen(function*() {
    for (let i = 0; i < 10_000 && !holds(); i++) yield* Effect.yieldNow
    assert.isTrue(holds(), "never reached the expected state")
  })

/** A set over scripted probe answers (true: the peer answered), recording what it told. */
const harness = (answers: ReadonlyArray<boolean>) =>
  Effect.gen(function*() {
    const told: Array<string> = []
    let probes = 0
    const peers = yield* makeConnectedPeers({
      probe: () => Promise.resolve(answers[probes++] ?? true),
      events: {
        connected: (peer) => Effect.sync(() => told.push(`connected ${peer}`)),
        disconnected: (peer) => Effect.sync(() => told.push(`disconnected ${peer}`)),
        instanceMessage: () => Effect.void,
        isBound: () => true
      },
      forget: (peer) => told.push(`forget ${peer}`),
      drop: (peer, why) => Effect.sync(() => told.push(`drop ${peer}: ${why}`))
    })
    return { peers, told, probes: () => probes }
  })

const routingId = Buffer.from("0a0b", "hex")

describe("ConnectedPeers", () => {
  it("probes over about a second", () => {
    assert.deepStrictEqual(PROBE_DELAYS_MS, [0, 10, 50, 200, 800])
  })

  it.effect("the first empty frame is the connect; a later one from a live peer is dropped after every probe answered", () =>
    Effect.gen(function*() {
      const h = yield* harness([])
      yield* h.peers.emptyFrame(routingId, "0a0b")
      assert.deepStrictEqual(h.told, ["connected 0a0b"])
      assert.deepStrictEqual([h.peers.has("0a0b"), h.peers.size()], [true, 1])
      yield* h.peers.emptyFrame(routingId, "0a0b")
      yield* until(() => h.probes() === 1)
      // A second ambiguous frame while probing is dropped at once.
      yield* h.peers.emptyFrame(routingId, "0a0b")
      assert.deepStrictEqual(h.told[1], "drop 0a0b: a lone empty frame from a connected peer while its connection is being probed")
      for (const [i, delay] of PROBE_DELAYS_MS.slice(1).entries()) {
        yield* TestClock.adjust(delay - 1)
        yield* Effect.yieldNow
        assert.strictEqual(h.probes(), i + 1, `probe ${i + 2} not before ${delay} ms`)
        yield* TestClock.adjust(1)
        yield* until(() => h.probes() === i + 2)
      }
      yield* until(() => h.told.length === 3)
      assert.strictEqual(
        h.told[2],
        "drop 0a0b: a lone empty frame from a connected peer is not a ROUTER notification (its connection answered every probe)"
      )
      assert.deepStrictEqual([h.peers.has("0a0b"), h.probes()], [true, 5])
    }))

  it.effect("one EHOSTUNREACH among the probes is the disconnect: the server forgets the peer, then tells its listener", () =>
    Effect.gen(function*() {
      const h = yield* harness([true, true, false])
      yield* h.peers.emptyFrame(routingId, "0a0b")
      yield* h.peers.emptyFrame(routingId, "0a0b")
      yield* TestClock.adjust(60)
      yield* until(() => h.told.length === 3)
      assert.deepStrictEqual(h.told, ["connected 0a0b", "forget 0a0b", "disconnected 0a0b"])
      assert.deepStrictEqual([h.peers.has("0a0b"), h.peers.size(), h.probes()], [false, 0, 3])
      // The next empty frame of that routing id is a new connect.
      yield* h.peers.emptyFrame(routingId, "0a0b")
      assert.deepStrictEqual(h.told.slice(3), ["connected 0a0b"])
    }))
})
