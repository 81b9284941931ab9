/**
 * The MQ server's fast path (issue 16) over real sockets: PING [nil], NOOP
 * and GET_CHUNK_SIZE are answered on the receive loop only where their pool
 * would start them at once, so DESIGN §3.1's back-pressure holds (a PING
 * waits behind a saturated NORMAL pool, a NOOP behind a busy SYNC lane, in
 * arrival order); and what they answer and count is what the pooled path
 * answers and counts. A named PING (issue 25 item 4) takes the fast path
 * once its peer is bound to the instance: answered on the receive loop with
 * last_seen set when its pool is idle, queued on the pool (one hand-off)
 * with last_seen unchanged until its turn when the pool is busy.
 */
import { assert, describe, it } from "@effect/vitest"
import { Clock, Context, Deferred, Effect, Exit, Layer, Metric, Scope } from "effect"
import { decodeReplyHeader, encodeRequest, unpack } from "../../src/schema/Frame.ts"
import { formatInstanceId, makeInstanceId } from "../../src/schema/InstanceId.ts"
import { GetChunkSize, Noop, Ping, QueryPrefetchStatus, UnregisterKvCache, type Op, type PayloadOf } from "../../src/schema/Op.ts"
import { row, type ServerModule } from "../../src/services/server/Handler.ts"
import { makeInstanceRegistry, type InstanceRegistry } from "../../src/services/liveness/InstanceRegistry.ts"
import { registryTarget } from "../../src/services/liveness/LivenessTarget.ts"
import { MqServer } from "../../src/services/server/MqServer.ts"
import { rawDealer, type RawDealer } from "../support/RawDealer.ts"
import { bareServer } from "../support/TestServer.ts"

/** Real time: for waiting on the sockets. */
const until = (what: string, holds: () => boolean) =>
  Effect.gen(function*() {
    for (let i = 0; i < 500 && !holds(); i++) yield* Effect.sleep("10 millis")
    assert.isTrue(holds(), `timed out waiting for ${what}`)
  })

const send = <O extends Op>(raw: RawDealer, op: O, uid: number, payload: PayloadOf<O>) =>
  Effect.gen(function*() {
    const frames = encodeRequest(op, uid, payload)
    assert.isTrue(Exit.isSuccess(frames))
    if (Exit.isSuccess(frames)) yield* raw.send(frames.value)
  })

/** The next reply's uid and decoded response (undefined for none); fails the test when none comes in 5 s. */
const next = (raw: RawDealer) =>
  Effect.gen(function*() {
    const reply = yield* raw.receive(5_000)
    assert.isDefined(reply, "no reply within 5 s")
    const header = decodeReplyHeader(reply!)
    assert.strictEqual(header?._tag, "Ok")
    if (header?._tag !== "Ok") return { uid: -1, response: undefined as unknown }
    return { uid: header.uid, response: header.body.length === 0 ? undefined : unpack(header.body[0]!)?.value }
  })

/** A module whose NORMAL op (QUERY_PREFETCH_STATUS) and SYNC op (UNREGISTER_KV_CACHE) wait on `gate`, saying when they run. */
const heldModule = (gate: Deferred.Deferred<void>, running: Deferred.Deferred<void>): ServerModule => ({
  name: "held",
  rows: [
    row(QueryPrefetchStatus, "NORMAL", () => Deferred.succeed(running, undefined).pipe(Effect.andThen(Deferred.await(gate)), Effect.as(7))),
    row(UnregisterKvCache, "SYNC", () => Deferred.succeed(running, undefined).pipe(Effect.andThen(Deferred.await(gate))))
  ]
})

/** The instance the tracked module holds. */
const TRACKED = makeInstanceId(42n)

/** A clock whose millis the test sets (sleeps are real: the sockets need them). */
interface ManualClock {
  readonly clock: Clock.Clock
  set: (ms: number) => void
}
const manualClock = (live: Clock.Clock, startMs: number): ManualClock => {
  let nowMs = startMs
  return {
    clock: {
      currentTimeMillisUnsafe: () => nowMs,
      currentTimeMillis: Effect.sync(() => nowMs),
      currentTimeNanosUnsafe: () => BigInt(nowMs) * 1_000_000n,
      currentTimeNanos: Effect.sync(() => BigInt(nowMs) * 1_000_000n),
      monotonicTimeNanosUnsafe: () => live.monotonicTimeNanosUnsafe(),
      monotonicTimeNanos: live.monotonicTimeNanos,
      sleep: (duration) => live.sleep(duration)
    },
    set: (ms) => {
      nowMs = ms
    }
  }
}

/** What a test sees of the server: its stats, a raw DEALER, the held op's gate, the tracked registry and the clock. */
interface Env {
  readonly server: MqServer["Service"]
  readonly raw: RawDealer
  readonly gate: Deferred.Deferred<void>
  readonly running: Deferred.Deferred<void>
  readonly registry: InstanceRegistry<void>
  readonly clock: ManualClock
}

const withServer = <A>(
  config: { readonly maxCpuWorkers?: number },
  body: (server: MqServer["Service"], raw: RawDealer, gate: Deferred.Deferred<void>, running: Deferred.Deferred<void>, env: Env) => Effect.Effect<A>
) =>
  Effect.gen(function*() {
    const gate = Deferred.makeUnsafe<void>()
    const running = Deferred.makeUnsafe<void>()
    const clock = manualClock(yield* Clock.Clock, 1_000)
    // A module tracking TRACKED in a real registry: PING touches it as it touches the transfer modules'.
    const registry = yield* makeInstanceRegistry<void>()
    assert.isTrue(yield* registry.insert(TRACKED, undefined, 1_000))
    const tracked: ServerModule = {
      name: "tracked",
      rows: [],
      target: registryTarget({
        name: "tracked",
        kind: "kv_cache",
        registry,
        release: () => Effect.void,
        summary: (t) => ({
          instance_id: formatInstanceId(t.id),
          kind: "kv_cache",
          last_seen_age_seconds: 0,
          has_liveness_signal: t.hasLivenessSignal,
          has_transfer_activity: t.hasTransferActivity,
          details: {}
        })
      })
    }
    const scope = yield* Scope.make()
    const env = yield* Layer.buildWithScope(bareServer({ modules: [heldModule(gate, running), tracked], config }), scope).pipe(
      Effect.provideService(Clock.Clock, clock.clock)
    )
    const server = Context.get(env, MqServer)
    const raw = yield* Scope.provide(scope)(rawDealer(server.endpoint))
    const result = yield* body(server, raw, gate, running, { server, raw, gate, running, registry, clock })
    yield* Deferred.succeed(gate, undefined)
    yield* Scope.close(scope, Exit.void)
    return result
  })

describe("the fast path keeps the pools' semantics (DESIGN §3.1)", () => {
  it.live("PING [nil] waits behind a saturated NORMAL pool and is answered after the job ahead of it", () =>
    withServer({ maxCpuWorkers: 1 }, (server, raw, gate, running) =>
      Effect.gen(function*() {
        yield* send(raw, QueryPrefetchStatus, 1, ["r1"])
        yield* Deferred.await(running)
        yield* send(raw, Ping, 2, [null])
        // The PING is held in the NORMAL queue (a fast answer would never be queued).
        yield* until("the PING to be queued", () => server.stats().pools.normal.queued === 1)
        yield* Deferred.succeed(gate, undefined)
        assert.deepStrictEqual(yield* next(raw), { uid: 1, response: 7 })
        assert.deepStrictEqual(yield* next(raw), { uid: 2, response: true })
        // The pool is free again: the next PING is answered at once, never queued.
        yield* send(raw, Ping, 3, [null])
        assert.deepStrictEqual(yield* next(raw), { uid: 3, response: true })
        assert.strictEqual(server.stats().pools.normal.queued, 0)
      })))

  it.live("NOOP and GET_CHUNK_SIZE wait behind a running SYNC job, in arrival order", () =>
    withServer({}, (server, raw, gate, running) =>
      Effect.gen(function*() {
        yield* send(raw, UnregisterKvCache, 1, [makeInstanceId(5n)])
        yield* Deferred.await(running)
        yield* send(raw, Noop, 2, [])
        yield* send(raw, GetChunkSize, 3, [])
        yield* until("NOOP and GET_CHUNK_SIZE to be queued", () => server.stats().pools.sync.queued === 2)
        yield* Deferred.succeed(gate, undefined)
        assert.deepStrictEqual(yield* next(raw), { uid: 1, response: undefined })
        assert.deepStrictEqual(yield* next(raw), { uid: 2, response: "OK" })
        assert.deepStrictEqual(yield* next(raw), { uid: 3, response: 256 })
      })))

  it.live("a PING behind a NORMAL pool with a free worker is not held back by it", () =>
    withServer({ maxCpuWorkers: 2 }, (server, raw, _gate, running) =>
      Effect.gen(function*() {
        yield* send(raw, QueryPrefetchStatus, 1, ["r1"])
        yield* Deferred.await(running)
        yield* send(raw, Ping, 2, [null])
        assert.deepStrictEqual(yield* next(raw), { uid: 2, response: true })
        assert.strictEqual(server.stats().pools.normal.queued, 0)
      })))
})

/** The value of counter `id` with exactly `attributes`, 0 when it has no series yet. */
const counter = (id: string, attributes: Record<string, string>) =>
  Effect.map(Metric.snapshot, (all) => {
    const s = all.find((m) =>
      m.id === id && m.type === "Counter" && JSON.stringify(m.attributes ?? {}) === JSON.stringify(attributes)
    )
    return s === undefined || s.type !== "Counter" ? 0 : Number(s.state.count)
  })

/** The observation count of histogram `id` with exactly `attributes`. */
const observations = (id: string, attributes: Record<string, string>) =>
  Effect.map(Metric.snapshot, (all) => {
    const s = all.find((m) =>
      m.id === id && m.type === "Histogram" && JSON.stringify(m.attributes ?? {}) === JSON.stringify(attributes)
    )
    return s === undefined || s.type !== "Histogram" ? 0 : s.state.count
  })

describe("fast answers are counted like pooled ones", () => {
  it.live("25 PING [nil], 3 NOOP and 2 GET_CHUNK_SIZE: each op's requests and latencies, and PING's form=nil, by exactly that", () =>
    withServer({}, (_server, raw) =>
      Effect.gen(function*() {
        const read = Effect.all({
          ping: counter("mpcache_requests_total", { op: "ping" }),
          noop: counter("mpcache_requests_total", { op: "noop" }),
          chunk: counter("mpcache_requests_total", { op: "get_chunk_size" }),
          nil: counter("mpcache_pings_total", { form: "nil" }),
          pingLatencies: observations("mpcache_request_duration_seconds", { op: "ping" })
        })
        const before = yield* read
        for (let uid = 0; uid < 25; uid++) {
          yield* send(raw, Ping, uid, [null])
          assert.deepStrictEqual(yield* next(raw), { uid, response: true })
        }
        for (let uid = 100; uid < 103; uid++) {
          yield* send(raw, Noop, uid, [])
          assert.deepStrictEqual(yield* next(raw), { uid, response: "OK" })
        }
        for (let uid = 200; uid < 202; uid++) {
          yield* send(raw, GetChunkSize, uid, [])
          assert.deepStrictEqual(yield* next(raw), { uid, response: 256 })
        }
        const after = yield* read
        assert.deepStrictEqual(
          {
            ping: after.ping - before.ping,
            noop: after.noop - before.noop,
            chunk: after.chunk - before.chunk,
            nil: after.nil - before.nil,
            pingLatencies: after.pingLatencies - before.pingLatencies
          },
          { ping: 25, noop: 3, chunk: 2, nil: 25, pingLatencies: 25 }
        )
      })))

  it.live("a named PING of an id nobody holds takes the pooled path and is counted as form=instance", () =>
    withServer({}, (server, raw) =>
      Effect.gen(function*() {
        const before = yield* counter("mpcache_pings_total", { form: "instance" })
        const nilBefore = yield* counter("mpcache_pings_total", { form: "nil" })
        const fastBefore = server.stats().fastPath
        yield* send(raw, Ping, 1, [makeInstanceId(43n)])
        assert.deepStrictEqual(yield* next(raw), { uid: 1, response: true })
        assert.strictEqual((yield* counter("mpcache_pings_total", { form: "instance" })) - before, 1)
        assert.strictEqual((yield* counter("mpcache_pings_total", { form: "nil" })) - nilBefore, 0)
        // Nothing holds 43, so the peer cannot be bound to it: every such PING is pooled (it binds nothing either).
        assert.deepStrictEqual(server.stats().fastPath, fastBefore)
      })))
})

/** The tracked entry's liveness fields. */
const liveness = (registry: InstanceRegistry<void>) =>
  Effect.map(registry.get(TRACKED), (t) => t === undefined ? undefined : { lastSeenMs: t.lastSeenMs, hasLivenessSignal: t.hasLivenessSignal })

describe("a named PING (issue 25 item 4)", () => {
  it.live("the first binds its peer on the pooled path; the next is answered on the receive loop, last_seen set to the clock's time", () =>
    withServer({}, (server, raw, _gate, _running, { registry, clock }) =>
      Effect.gen(function*() {
        const named = yield* counter("mpcache_pings_total", { form: "instance" })
        const requests = yield* counter("mpcache_requests_total", { op: "ping" })
        assert.deepStrictEqual(yield* liveness(registry), { lastSeenMs: 1_000, hasLivenessSignal: false })
        const before = server.stats().fastPath
        clock.set(2_000)
        yield* send(raw, Ping, 1, [TRACKED])
        assert.deepStrictEqual(yield* next(raw), { uid: 1, response: true })
        // Pooled: the peer was not bound to 42 yet (the pooled path binds it).
        assert.deepStrictEqual(server.stats().fastPath, before)
        assert.deepStrictEqual(yield* liveness(registry), { lastSeenMs: 2_000, hasLivenessSignal: true })
        clock.set(3_000)
        yield* send(raw, Ping, 2, [TRACKED])
        assert.deepStrictEqual(yield* next(raw), { uid: 2, response: true })
        // Answered where it was received: no hand-off, nothing queued.
        assert.deepStrictEqual(server.stats().fastPath, { answered: before.answered + 1, queued: before.queued })
        assert.deepStrictEqual(yield* liveness(registry), { lastSeenMs: 3_000, hasLivenessSignal: true })
        // A heartbeat from the past never moves last_seen back (the same rule as the pooled touch).
        clock.set(2_500)
        yield* send(raw, Ping, 3, [TRACKED])
        assert.deepStrictEqual(yield* next(raw), { uid: 3, response: true })
        assert.deepStrictEqual(server.stats().fastPath, { answered: before.answered + 2, queued: before.queued })
        assert.deepStrictEqual(yield* liveness(registry), { lastSeenMs: 3_000, hasLivenessSignal: true })
        // Counted as the pooled ones are.
        assert.strictEqual((yield* counter("mpcache_pings_total", { form: "instance" })) - named, 3)
        assert.strictEqual((yield* counter("mpcache_requests_total", { op: "ping" })) - requests, 3)
      })))

  it.live("behind a saturated NORMAL pool it waits in the pool (one hand-off), last_seen unchanged until its turn, answered after the job ahead", () =>
    withServer({ maxCpuWorkers: 1 }, (server, raw, gate, running, { registry, clock }) =>
      Effect.gen(function*() {
        clock.set(2_000)
        yield* send(raw, Ping, 1, [TRACKED])
        assert.deepStrictEqual(yield* next(raw), { uid: 1, response: true })
        const before = server.stats().fastPath
        yield* send(raw, QueryPrefetchStatus, 2, ["r1"])
        yield* Deferred.await(running)
        clock.set(5_000)
        yield* send(raw, Ping, 3, [TRACKED])
        yield* until("the PING to be queued", () => server.stats().pools.normal.queued === 1)
        // Queued straight from the receive loop as a fast job; not touched yet.
        assert.deepStrictEqual(server.stats().fastPath, { answered: before.answered, queued: before.queued + 1 })
        assert.deepStrictEqual(yield* liveness(registry), { lastSeenMs: 2_000, hasLivenessSignal: true })
        yield* Deferred.succeed(gate, undefined)
        assert.deepStrictEqual(yield* next(raw), { uid: 2, response: 7 })
        assert.deepStrictEqual(yield* next(raw), { uid: 3, response: true })
        assert.deepStrictEqual(yield* liveness(registry), { lastSeenMs: 5_000, hasLivenessSignal: true })
        assert.strictEqual(server.stats().pools.normal.queued, 0)
      })))
})
