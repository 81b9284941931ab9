/**
 * Issue 24 item 3 performed against a real `mpcache serve`: an attacker's
 * raw DEALER sends msgpackr's reference bomb (a ~335-byte frame describing
 * 2^depth leaves, built byte by byte in test/support/MsgpackBomb.ts) as a
 * STORE's key at depths 20–26, with and without the trailing byte that made
 * msgpackr stringify the whole value, while a worker process heartbeats and
 * stores and a plain client PINGs with a 1 s timeout.
 *
 * Each bomb must be answered `bad_request` naming the ext, in under 50 ms;
 * every PING answered; the worker never degraded and its stores keep
 * succeeding. With CURVE, an authorized key whose connection never said
 * HELLO is answered `forbidden` before anything is decoded.
 *
 * Latency: a monotonic clock (`performance.now()`) around send and reply on
 * the attacker's side, so it includes both processes' scheduling. Each
 * (depth, variant) is sent 3 times and the fastest must be under 50 ms
 * (scheduling noise only adds, the server's work is the same each time),
 * and every one under the PING timeout. Before the fix one depth-26 frame
 * held the server's event loop for 8–28 s.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect, Fiber } from "effect"
import { decodeReplyHeader, pack } from "../../src/schema/Frame.ts"
import { Ping, Store } from "../../src/schema/Op.ts"
import { errorBodyOf, type ErrorBody } from "../../src/schema/WireError.ts"
import { ZmqSocketsLive } from "../../src/layers/Zmq.ts"
import { makeMqClient } from "../../src/services/client/MqClient.ts"
import { CURVE_MODES, curveFixture } from "../support/CurveMode.ts"
import { ipcEndpoint, startServer, startWorker, statusOf } from "../support/LiveFleet.ts"
import { referenceBomb } from "../support/MsgpackBomb.ts"
import { type RawDealer, rawDealer } from "../support/RawDealer.ts"

/** The requirement (issue 24 item 3): each bomb answered within this. */
const ANSWER_WITHIN_MS = 50
/** The plain client's PING timeout, and the worker's heartbeat interval (its ping timeout). */
const PING_TIMEOUT_MS = 1_000
const TRIES = 3

const BOMB_REFUSED = (uid: number): ErrorBody & { readonly uid: number } => ({
  uid,
  code: "bad_request",
  message: "store: payload 0 (key) is not a single plain MessagePack value: an ext value of type 0x69 (msgpackr's structured-clone id) at byte 0; " +
    "expected plain MessagePack (the protocol defines no extension types)",
  op: "store",
  field: "payload 0 (key)",
  expected: "plain MessagePack (the protocol defines no extension types)",
  actual: "an ext value of type 0x69 (msgpackr's structured-clone id) at byte 0"
})

const NOT_BOUND = (uid: number): ErrorBody & { readonly uid: number } => ({
  uid,
  code: "forbidden",
  message: "store: this connection has not said HELLO with an authorized key (hello_challenge, then hello)",
  op: "store",
  field: "hello"
})

/** Sends the bomb as a STORE's key and returns the reply's uid and error body, and the round trip in ms. */
const sendBomb = (dealer: RawDealer, uid: number, bomb: Buffer) =>
  Effect.gen(function*() {
    const started = performance.now()
    yield* dealer.send([pack(uid), pack(Store.id), bomb, pack(1), pack([[1]]), Buffer.from([0xc4, 0x00])])
    const reply = yield* dealer.receive(30_000)
    const ms = performance.now() - started
    const header = reply === undefined ? undefined : decodeReplyHeader(reply)
    if (header === undefined || header._tag !== "Error") return assert.fail(`no error reply to uid ${uid}: ${header?._tag ?? "nothing within 30 s"}`)
    return { body: { uid: header.uid, ...errorBodyOf(header.error) }, ms }
  })

/** Every bomb of depths 20–26, both variants, TRIES times each: the bodies must be `expected(uid)`; returns each case's fastest and slowest. */
const attack = (dealer: RawDealer, expected: (uid: number) => ErrorBody & { readonly uid: number }) =>
  Effect.gen(function*() {
    let uid = 0
    const cases: Array<{ readonly depth: number; readonly trailing: boolean; readonly fastestMs: number; readonly slowestMs: number }> = []
    for (let depth = 20; depth <= 26; depth++) {
      for (const trailing of [true, false]) {
        const times: Array<number> = []
        for (let i = 0; i < TRIES; i++) {
          const { body, ms } = yield* sendBomb(dealer, ++uid, referenceBomb(depth, trailing))
          assert.deepStrictEqual(body, expected(uid))
          times.push(ms)
        }
        cases.push({ depth, trailing, fastestMs: Math.min(...times), slowestMs: Math.max(...times) })
      }
    }
    return cases
  })

const assertAnsweredInTime = (cases: ReadonlyArray<{ readonly depth: number; readonly trailing: boolean; readonly fastestMs: number; readonly slowestMs: number }>) => {
  assert.strictEqual(cases.length, 14)
  for (const c of cases) {
    const what = `depth ${c.depth}${c.trailing ? " + trailing byte" : ""}: fastest ${c.fastestMs.toFixed(1)} ms, slowest ${c.slowestMs.toFixed(1)} ms`
    assert.isBelow(c.fastestMs, ANSWER_WITHIN_MS, what)
    assert.isBelow(c.slowestMs, PING_TIMEOUT_MS, what)
  }
}

describe.each(CURVE_MODES)("the msgpackr reference bomb against a real server (CURVE $curve)", ({ curve }) => {
  const fx = curveFixture(curve, { worker: "workers", pinger: "ops", attacker: "mallory" })

  it.live("bombs at depths 20-26 are each answered bad_request in under 50 ms; every PING within its timeout; the worker stays healthy and keeps storing", () =>
    Effect.scoped(Effect.gen(function*() {
      const endpoint = ipcEndpoint()
      const { httpPort } = yield* startServer(endpoint, ["--no-l1-prefault", "--l1-size-gb", "0.0625", ...fx.serverArgs])
      const { worker, instanceId } = yield* startWorker(endpoint, PING_TIMEOUT_MS, 100, fx.client("worker").curve)

      // The plain client: PINGs back to back, each with its timeout; a failure is recorded, not retried.
      const pinger = yield* makeMqClient({ endpoint, requestTimeoutMs: PING_TIMEOUT_MS, lingerMs: 0, ...fx.client("pinger") })
      let answered = 0
      const failures: Array<string> = []
      const pinging = yield* pinger.request(Ping, [null]).pipe(
        Effect.match({ onSuccess: () => void answered++, onFailure: (e) => void failures.push(e.message) }),
        Effect.andThen(Effect.sleep("5 millis")),
        Effect.forever,
        Effect.forkScoped
      )
      while (answered === 0 && failures.length === 0) yield* Effect.sleep("10 millis")

      const storesBefore = worker.stdout().match(/"event":"store"/g)?.length ?? 0
      const answeredBefore = answered
      const dealer = yield* rawDealer(endpoint, fx.client("attacker").curve)
      const cases = yield* attack(dealer, BOMB_REFUSED)
      const answeredDuring = answered - answeredBefore
      // Two more of the worker's stores after the attack: its data path is served as before.
      const stores = () => worker.stdout().match(/\{"event":"store"[^\n]*\}/g) ?? []
      for (let i = 0; i < 600 && stores().length < Math.max(storesBefore, 1) + 2; i++) yield* Effect.sleep("50 millis")
      yield* Fiber.interrupt(pinging)

      assertAnsweredInTime(cases)
      assert.deepStrictEqual(failures, [])
      assert.isAtLeast(answeredDuring, 1, "PINGs interleaved with the attack")
      assert.isAtLeast(stores().length, storesBefore + 2)
      for (const line of stores()) {
        const s = JSON.parse(line) as { ok: boolean; healthy: boolean }
        assert.deepStrictEqual({ ok: s.ok, healthy: s.healthy }, { ok: true, healthy: true }, line)
      }
      assert.notMatch(`${worker.stdout()}${worker.stderr()}`, /degraded mode/)
      const status = yield* statusOf(httpPort)
      assert.deepStrictEqual(status.instances.map((i) => i.instance_id), [instanceId])
    })).pipe(Effect.provide(ZmqSocketsLive)), 180_000)

  if (curve) {
    it.live("an authorized key whose connection never said HELLO is answered forbidden before anything is decoded, in under 50 ms", () =>
      Effect.scoped(Effect.gen(function*() {
        const endpoint = ipcEndpoint()
        yield* startServer(endpoint, ["--no-l1-prefault", "--l1-size-gb", "0.0625", ...fx.serverArgs])
        const unbound = yield* rawDealer(endpoint, fx.client("attacker").curve, { hello: false })
        assertAnsweredInTime(yield* attack(unbound, NOT_BOUND))
        // The same key, bound by HELLO, is judged by its frames: bad_request.
        const bound = yield* rawDealer(endpoint, fx.client("attacker").curve)
        const { body } = yield* sendBomb(bound, 7, referenceBomb(26, true))
        assert.deepStrictEqual(body, BOMB_REFUSED(7))
      })), 180_000)
  }
})
