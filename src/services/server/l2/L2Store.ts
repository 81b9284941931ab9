/**
 * The L2 store (issue 15 item 2, DESIGN §9): the few Redis commands the L2
 * tier needs, as Effects that always end — each has a timeout, and nothing
 * queues while the store is down (node-redis `disableOfflineQueue`). The
 * Redis-backed layer lives in src/layers/L2Redis.ts; `layerTest` here is
 * an in-memory store for unit tests, with knobs to make it slow or down.
 */
import { Context, Duration, Effect, Layer, Schema } from "effect"

/** Why an L2 command did not answer: its timeout passed, or the store failed or is unreachable. */
export class L2Error extends Schema.TaggedError<L2Error>()("L2Error", {
  /** The command (`EXISTS`, `GET`, `SET`, `DEL`, `PING`). */
  op: Schema.String,
  reason: Schema.Literals(["timeout", "failed"]),
  message: Schema.String
}) {}

/** The L2 store's commands. Every one fails with L2Error past `timeoutMs` or on any failure. */
export class L2Store extends Context.Service<L2Store, {
  /** Per key, whether it exists (one EXISTS per key, pipelined across slots; no hash tags). */
  readonly exists: (keys: ReadonlyArray<string>, timeoutMs: number) => Effect.Effect<ReadonlyArray<boolean>, L2Error>
  /** The value of `key`, undefined when absent. */
  readonly get: (key: string, timeoutMs: number) => Effect.Effect<Uint8Array | undefined, L2Error>
  /**
   * `SET key value NX [EX ttlSeconds]` (ttl 0: none); true when written, false when the key existed.
   * `value` may be a view of L1 (the tier sends objects without copying them): it is read while the
   * effect runs, and a store that keeps it must copy it. Should the bytes change after a timeout while
   * the socket still sends them, the value's checksum (or MAC) no longer matches and a read treats it as a miss.
   */
  readonly setNx: (key: string, value: Uint8Array, ttlSeconds: number, timeoutMs: number) => Effect.Effect<boolean, L2Error>
  /** Deletes `key` (a corrupt value). */
  readonly del: (key: string, timeoutMs: number) => Effect.Effect<void, L2Error>
  /** PING: the breaker's probe. */
  readonly ping: (timeoutMs: number) => Effect.Effect<void, L2Error>
  /** Why the store is not connected now (null when it is): for status, without sending anything. */
  readonly connectionError: () => string | null
}>()("mpcache/services/server/l2/L2Store") {
  /**
   * An in-memory store and its controls (unit tests): `memory` holds the
   * values and the knobs (down, delay) a test turns; a fresh one by default.
   */
  static readonly layerTest = (memory: MemoryL2 = makeMemoryL2()) => Layer.succeed(this, memoryStore(memory))
}

/** State and knobs of the in-memory store: its values, and whether it answers (down) or how late (delayMs, Clock time). */
export interface MemoryL2 {
  readonly values: Map<string, Uint8Array>
  down: boolean
  delayMs: number
  /** A GET of a key listed here answers this late instead (ms, Clock time): replies that arrive out of order. */
  readonly getDelayMs: Map<string, number>
  /** Every command run, in order (`GET key`, …), so tests can see what was asked. */
  readonly log: Array<string>
}

/** A fresh in-memory store state: empty, up, no delay. */
export const makeMemoryL2 = (): MemoryL2 => ({ values: new Map(), down: false, delayMs: 0, getDelayMs: new Map(), log: [] })

/** Fails with L2Error(timeout) when `effect` does not end within `timeoutMs`; shared by every layer. */
export const withTimeout = <A>(op: string, timeoutMs: number, effect: Effect.Effect<A, L2Error>): Effect.Effect<A, L2Error> =>
  effect.pipe(
    Effect.timeoutOrElse({
      duration: Duration.millis(timeoutMs),
      orElse: () => Effect.fail(new L2Error({ op, reason: "timeout", message: `${op} did not answer within ${timeoutMs} ms` }))
    })
  )

const DOWN = "connection refused (in-memory store is down)"

const memoryStore = (m: MemoryL2): L2Store["Service"] => {
  const run = <A>(op: string, what: string, timeoutMs: number, f: () => A, delayMs = m.delayMs) =>
    withTimeout(
      op,
      timeoutMs,
      Effect.gen(function*() {
        m.log.push(what)
        if (delayMs > 0) yield* Effect.sleep(Duration.millis(delayMs))
        if (m.down) return yield* new L2Error({ op, reason: "failed", message: DOWN })
        return f()
      })
    )
  return {
    exists: (keys, t) => run("EXISTS", `EXISTS ${keys.length}`, t, () => keys.map((k) => m.values.has(k))),
    get: (key, t) => run("GET", `GET ${key}`, t, () => m.values.get(key), m.getDelayMs.get(key) ?? m.delayMs),
    setNx: (key, value, _ttl, t) =>
      run("SET", `SET ${key}`, t, () => {
        if (m.values.has(key)) return false
        m.values.set(key, Uint8Array.from(value))
        return true
      }),
    del: (key, t) => run("DEL", `DEL ${key}`, t, () => void m.values.delete(key)),
    ping: (t) => run("PING", "PING", t, () => undefined),
    connectionError: () => (m.down ? DOWN : null)
  }
}
