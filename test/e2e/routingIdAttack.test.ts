/**
 * Issue 24 item 1: a chosen routing id must never abort the server nor take another peer's id. The attack, on a
 * real `mpcache serve`, with CURVE off and on (with CURVE the attacker is an authorised tenant): DEALERs that set
 * their own ZMQ_ROUTING_ID to the ids libzmq 4.3 would generate next were its counter left unseeded (006b8b4567…
 * without CURVE, 00e43c9869… with it, where the ZAP handler's ROUTER takes the first value) and to random
 * zero-prefixed ids; one that sets a plain id of its own; then 100 more connections, every one answered.
 */
import { randomBytes } from "node:crypto"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { decodeReplyHeader, encodeRequest } from "../../src/schema/Frame.ts"
import { Ping } from "../../src/schema/Op.ts"
import { CURVE_MODES, curveFixture } from "../support/CurveMode.ts"
import { getText, ipcEndpoint, startServer, statusOf } from "../support/LiveFleet.ts"
import { rawDealer } from "../support/RawDealer.ts"
import { generatedRoutingId } from "../../src/services/zmq/RoutingIds.ts"

/** The first routing ids an unseeded libzmq 4.3.5 MQ ROUTER generates (rand() under glibc's default seed). */
const UNSEEDED_FIRST = { off: 0x6b8b4567, on: 0xe43c9869 } as const

const ping = (uid: number) => Effect.orDie(encodeRequest(Ping, uid, [null]))

/** Polls /api/status until `done` holds of its routing_ids block (bounded: a hang fails the test). */
const waitForRoutingIds = (httpPort: number, done: (r: { refused_chosen: number; refused_ahead: number; verifying: number }) => boolean) =>
  Effect.gen(function*() {
    for (let i = 0; i < 600; i++) {
      const r = (yield* statusOf(httpPort)).routing_ids
      if (done(r)) return r
      yield* Effect.sleep("50 millis")
    }
    return yield* Effect.die(new Error(`routing_ids never reached the expected counts: ${JSON.stringify((yield* statusOf(httpPort)).routing_ids)}`))
  })

describe.each(CURVE_MODES)("chosen routing ids (CURVE $curve)", ({ curve }) => {
  const fx = curveFixture(curve)

  it.live("ids ahead of the ROUTER's counter are kicked, a chosen id is refused, and 100 connections after them are all answered", () =>
    Effect.scoped(Effect.gen(function*() {
      const endpoint = ipcEndpoint()
      const { server, httpPort } = yield* startServer(endpoint, ["--no-l1-prefault", "--l1-size-gb", "0.0625", ...fx.serverArgs])
      const keys = fx.client().curve

      // The ids an unseeded ROUTER would give the next connections, and random zero-prefixed ones: all ahead of
      // the (seeded) counter, but for a chance of 2^-32 per id.
      const first = curve ? UNSEEDED_FIRST.on : UNSEEDED_FIRST.off
      const claims = [
        ...Array.from({ length: 8 }, (_, i) => generatedRoutingId(first + i)),
        ...Array.from({ length: 8 }, () => generatedRoutingId(randomBytes(4).readUInt32BE(0)))
      ]
      for (const id of claims) yield* rawDealer(endpoint, keys, { routingId: id, hello: false })
      assert.deepStrictEqual(yield* waitForRoutingIds(httpPort, (r) => r.refused_ahead === claims.length), {
        refused_chosen: 0,
        refused_ahead: claims.length,
        verifying: 0
      })

      // A kicked id is free again: a new claim of it is judged (and kicked) again, not ignored as a duplicate.
      yield* rawDealer(endpoint, keys, { routingId: claims[0]!, hello: false })
      yield* waitForRoutingIds(httpPort, (r) => r.refused_ahead === claims.length + 1)

      // A plain id of the peer's own choosing: every request answered forbidden, naming the rule.
      const chosen = yield* rawDealer(endpoint, keys, { routingId: Buffer.from("worker-1"), hello: false })
      yield* chosen.send(yield* ping(7))
      const reply = yield* chosen.receive(10_000)
      const header = reply === undefined ? undefined : decodeReplyHeader(reply)
      assert.strictEqual(header?._tag, "Error")
      if (header?._tag === "Error") {
        assert.strictEqual(header.error.code, "forbidden")
        assert.match(header.error.message, /serves only routing ids its ROUTER assigns; do not set ZMQ_ROUTING_ID/)
      }

      // 100 connections of clients that let the ROUTER assign their ids: every PING answered.
      for (let batch = 0; batch < 10; batch++) {
        const answers = yield* Effect.forEach(Array.from({ length: 10 }, (_, i) => batch * 10 + i), (n) =>
          Effect.gen(function*() {
            const c = yield* rawDealer(endpoint, keys)
            yield* c.send(yield* ping(n))
            const r = yield* c.receive(10_000)
            const h = r === undefined ? undefined : decodeReplyHeader(r)
            return h?._tag === "Ok" ? h.uid : -1
          }), { concurrency: "unbounded" })
        assert.deepStrictEqual(answers, Array.from({ length: 10 }, (_, i) => batch * 10 + i))
      }

      assert.strictEqual(server.child.exitCode, null)
      assert.notMatch(server.stderr(), /Assertion failed/)
      assert.deepStrictEqual((yield* statusOf(httpPort)).routing_ids, { refused_chosen: 1, refused_ahead: claims.length + 1, verifying: 0 })
      const metrics = yield* getText(`http://127.0.0.1:${httpPort}/metrics`)
      assert.match(metrics, new RegExp(`mpcache_routing_id_refusals_total\\{reason="ahead"\\} ${claims.length + 1}\\b`))
      assert.match(metrics, /mpcache_routing_id_refusals_total\{reason="chosen"\} 1\b/)
    })), 120_000)
})
