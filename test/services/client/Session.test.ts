/**
 * The worker session core on its own (Session.ts, DESIGN §6): the two
 * construction steps and the hooks an adapter plugs in (`prepare`,
 * `onRegistered`, `qualifier`, `legacyPingNote`, `unregisterOp`), against
 * the scripted fake MQ client and the TestClock. What the LMCache-driven
 * adapter does through it (heartbeat cycles, degraded mode, recovery) is in
 * WorkerAdapter.test.ts; the heartbeat itself in Heartbeat.test.ts.
 */
import { assert, describe, it } from "@effect/vitest"
import { Data, Effect, Exit, Fiber, Scope } from "effect"
import { TestClock } from "effect/testing"
import { makeInstanceId } from "../../../src/schema/InstanceId.ts"
import { type PayloadOf, QueryPrefetchStatus, RegisterKvCache, UnregisterKvCache } from "../../../src/schema/Op.ts"
import { NotRegistered, UnknownOp } from "../../../src/schema/WireError.ts"
import { RequestTimeout } from "../../../src/services/client/MqClient.ts"
import {
  makeSession,
  openSession,
  type SessionSettings,
  type SessionSpec,
  UNREGISTER_TIMEOUT_MS
} from "../../../src/services/client/Session.ts"
import { type CapturedLog, captureLogs, type FakeMqClient, makeFakeMqClient, reply } from "../../support/FakeMqClient.ts"

const ID = makeInstanceId(4242n)

const settings: SessionSettings = { modelName: "m", worldSize: 2, kvRank: 1, instanceId: ID, cacheSalt: "tenant-a" }

/** What the test's adapter registers: only its engine type travels, so a test sees what `prepare` changed. */
interface Reg {
  readonly engine: string
}

class Refused extends Data.TaggedError("Refused")<{ readonly reason: string }> {}

const payloadOf = (reg: Reg): PayloadOf<typeof RegisterKvCache> => [ID, [], "m", 2, reg.engine, {}, []]

/** A session spec for `kv_cache` over REGISTER_KV_CACHE; `extra` sets the hooks under test. */
const spec = (extra: Partial<SessionSpec<Reg, typeof RegisterKvCache, Refused>> = {}): SessionSpec<Reg, typeof RegisterKvCache, Refused> => ({
  kind: "kv_cache",
  registerOp: RegisterKvCache,
  registerPayload: payloadOf,
  unregisterOp: UnregisterKvCache,
  ...extra
})

/** Both steps on `client` in the test's Scope. */
const sessionOn = (client: FakeMqClient, extra: Partial<SessionSpec<Reg, typeof RegisterKvCache, Refused>> = {}) =>
  Effect.flatMap(openSession(client, settings), (opening) => makeSession(opening, spec(extra)))

/** The engine type of every REGISTER sent, in order. */
const registeredEngines = (client: FakeMqClient) => client.sent.filter((s) => s.op === "register_kv_cache").map((s) => s.payload[4])

describe("openSession", () => {
  it.effect("asks the chunk size once with the request timeout (default 30 s) and names server and id in its label", () =>
    Effect.gen(function*() {
      const client = makeFakeMqClient({ endpoint: "tcp://127.0.0.1:5555" })
      client.answer("get_chunk_size", reply.ok(128))
      const opening = yield* openSession(client, settings)
      assert.deepStrictEqual(client.sent, [{ op: "get_chunk_size", payload: [], atMs: 0, timeoutMs: 30_000 }])
      assert.strictEqual(opening.chunkSizeTokens, 128)
      assert.strictEqual(opening.instanceId, ID)
      assert.strictEqual(opening.label, "mpcache server tcp://127.0.0.1:5555 (instance_id=4242)")
      assert.deepStrictEqual([opening.requestTimeoutMs, opening.heartbeatIntervalMs, opening.heartbeatTimeoutMs], [30_000, 10_000, 10_000])
    }))

  it.effect("a server that does not answer the chunk size fails the opening with the client's RequestTimeout", () =>
    Effect.gen(function*() {
      const client = makeFakeMqClient()
      client.answer("get_chunk_size", reply.timeout)
      const fiber = yield* Effect.forkChild(openSession(client, { ...settings, requestTimeoutMs: 2_000 }))
      yield* TestClock.adjust("2 seconds")
      assert.deepStrictEqual(
        yield* Fiber.await(fiber),
        Exit.fail(new RequestTimeout({ op: "get_chunk_size", endpoint: "fake://server", timeoutMs: 2_000 }))
      )
    }))
})

describe("registration hooks", () => {
  it.effect("prepare runs before every REGISTER and its result is what is sent; re-registration starts again from the kept registration", () =>
    Effect.gen(function*() {
      const client = makeFakeMqClient()
      let round = 0
      const session = yield* sessionOn(client, { prepare: (reg) => Effect.succeed({ engine: `${reg.engine}#${++round}` }) })
      yield* session.register({ engine: "vllm" })
      assert.strictEqual(yield* session.transfer(QueryPrefetchStatus, ["r1"]), 1)
      client.once("query_prefetch_status", reply.fail(new NotRegistered({ message: "gone" })))
      yield* Effect.exit(session.transfer(QueryPrefetchStatus, ["r1"]))
      assert.deepStrictEqual(registeredEngines(client), ["vllm#1", "vllm#2"])
      assert.strictEqual(yield* session.view.reregistrations, 1)
    }))

  it.effect("onRegistered sees every acknowledged REGISTER; its failure fails the registration, keeps nothing and starts no heartbeat", () =>
    Effect.gen(function*() {
      const client = makeFakeMqClient()
      const seen: Array<unknown> = []
      let refuse = true
      const session = yield* sessionOn(client, {
        onRegistered: (answer) => {
          seen.push(answer)
          return refuse ? Effect.fail(new Refused({ reason: "pool" })) : Effect.void
        }
      })
      const first = yield* Effect.exit(session.register({ engine: "vllm" }))
      assert.deepStrictEqual(first, Exit.fail(new Refused({ reason: "pool" })))
      assert.isFalse(yield* session.view.heartbeatRunning)
      // Nothing kept: a not_registered transfer has nothing to re-send.
      client.once("query_prefetch_status", reply.fail(new NotRegistered({ message: "gone" })))
      yield* Effect.exit(session.transfer(QueryPrefetchStatus, ["r1"]))
      assert.deepStrictEqual(registeredEngines(client), ["vllm"])
      refuse = false
      yield* session.register({ engine: "vllm" })
      assert.isTrue(yield* session.view.heartbeatRunning)
      assert.deepStrictEqual(seen, [undefined, undefined])
      assert.deepStrictEqual((yield* session.view.events).filter((e) => e._tag === "Registered").map((e) => e.reason), ["initial"])
    }))

  it.effect("a transfer answered not_registered re-registers, then still fails with the server's error; the qualifier names the adapter in the log lines", () => {
    const logs: Array<CapturedLog> = []
    return Effect.gen(function*() {
      const client = makeFakeMqClient()
      const session = yield* sessionOn(client, { qualifier: "engine-driven" })
      yield* session.register({ engine: "vllm" })
      const gone = new NotRegistered({ message: "instance 4242 is not registered" })
      client.once("query_prefetch_status", reply.fail(gone))
      assert.deepStrictEqual(yield* Effect.exit(session.transfer(QueryPrefetchStatus, ["r1"])), Exit.fail(gone))
      assert.deepStrictEqual(logs.filter((l) => l.level !== "Debug").map((l) => `${l.level} ${l.text}`), [
        "Info mpcache engine-driven worker adapter created with instance_id=4242",
        "Warn re-registered engine-driven instance_id=4242 with fake://server (not_registered)"
      ])
    }).pipe(Effect.provide(captureLogs(logs)))
  })

  it.effect("legacyPingNote is appended to the WARNING of a server that predates PING_REGISTERED", () => {
    const logs: Array<CapturedLog> = []
    return Effect.gen(function*() {
      const client = makeFakeMqClient()
      client.answer("ping_registered", reply.fail(new UnknownOp({ message: "unknown op 26" })))
      const session = yield* sessionOn(client, { legacyPingNote: "(note of the test)" })
      yield* session.register({ engine: "vllm" })
      yield* TestClock.adjust("10 seconds")
      assert.deepStrictEqual(client.ops("ping_registered", "ping"), ["ping_registered", "ping", "ping"])
      assert.deepStrictEqual(logs.filter((l) => l.level === "Warn").map((l) => l.text), [
        "mpcache server fake://server (instance_id=4242) answered ping_registered with unknown_op: it predates it; falling back to plain ping (note of the test)"
      ])
    }).pipe(Effect.provide(captureLogs(logs)))
  })
})

describe("keys", () => {
  it.effect("keyOf builds the cache key from the session's model, world size, rank and salt", () =>
    Effect.gen(function*() {
      const session = yield* sessionOn(makeFakeMqClient())
      assert.deepStrictEqual(session.keyOf({ requestId: "r1", tokenIds: [1, 2, 3], start: 0, end: 3 }), {
        model_name: "m",
        world_size: 2,
        worker_id: 1,
        token_ids: [1, 2, 3],
        start: 0,
        end: 3,
        request_id: "r1",
        cache_salt: "tenant-a"
      })
    }))
})

describe("shutdown", () => {
  it.effect("closing the Scope sends the spec's UNREGISTER [id] with the 5 s bound, after the heartbeat stopped, and records it", () =>
    Effect.gen(function*() {
      const client = makeFakeMqClient()
      const scope = yield* Scope.make()
      const session = yield* sessionOn(client).pipe(Scope.provide(scope))
      yield* session.register({ engine: "vllm" })
      yield* TestClock.adjust("3 seconds")
      yield* Scope.close(scope, Exit.void)
      assert.isFalse(yield* session.view.heartbeatRunning)
      assert.deepStrictEqual(client.sent.at(-1), { op: "unregister_kv_cache", payload: [ID], atMs: 3_000, timeoutMs: UNREGISTER_TIMEOUT_MS })
      assert.deepStrictEqual((yield* session.view.events).at(-1), { _tag: "Unregistered", atMs: 3_000, ok: true })
    }))

  it.effect("a session that never registered sends no UNREGISTER", () =>
    Effect.gen(function*() {
      const client = makeFakeMqClient()
      const scope = yield* Scope.make()
      yield* sessionOn(client).pipe(Scope.provide(scope))
      yield* Scope.close(scope, Exit.void)
      assert.deepStrictEqual(client.ops(), ["get_chunk_size"])
    }))
})
