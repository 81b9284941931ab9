/**
 * A scripted stand-in for `MqClientShape` (src/services/client/MqClient.ts) for unit
 * tests of the client services: it records every request (op name, payload,
 * Effect Clock time, timeout) and answers per a script that a test may change
 * at any point — a default reply per op plus a queue of one-shot replies.
 * Time is the Effect Clock, so TestClock drives timeouts and delays.
 *
 * Also here: `captureLogs`, a logger layer that records level and text.
 */
import { Cause, Clock, Duration, Effect, Logger } from "effect"
import type { Op, PayloadOf, ResponseOf } from "../../src/schema/Op.ts"
import type { MqClientShape, RequestError, RequestOptions } from "../../src/services/client/MqClient.ts"
import { RequestTimeout } from "../../src/services/client/MqClient.ts"

/** How the fake answers one request. */
export type Reply =
  | { readonly _tag: "Ok"; readonly value: unknown }
  | { readonly _tag: "Fail"; readonly error: RequestError }
  /** No reply: fails with `RequestTimeout` once the request's timeout has passed, as the real client does. */
  | { readonly _tag: "Timeout" }
  /** No reply and no timeout either: the request waits until interrupted. */
  | { readonly _tag: "Hang" }
  /** The client itself dies (a defect). */
  | { readonly _tag: "Die"; readonly defect: unknown }
  /** Waits `ms` of Clock time, then answers `then`. */
  | { readonly _tag: "After"; readonly ms: number; readonly then: Reply }

/** Reply constructors. */
export const reply = {
  ok: (value: unknown): Reply => ({ _tag: "Ok", value }),
  fail: (error: RequestError): Reply => ({ _tag: "Fail", error }),
  timeout: { _tag: "Timeout" } as Reply,
  hang: { _tag: "Hang" } as Reply,
  die: (defect: unknown): Reply => ({ _tag: "Die", defect }),
  after: (ms: number, then: Reply): Reply => ({ _tag: "After", ms, then })
} as const

/** One recorded request. */
export interface SentRequest {
  /** The op's wire name, e.g. `ping_registered`. */
  readonly op: string
  readonly payload: ReadonlyArray<unknown>
  /** Clock time the request was sent, ms. */
  readonly atMs: number
  /** The timeout it was sent with, ms. */
  readonly timeoutMs: number
}

export interface FakeMqClient extends MqClientShape {
  /** Every request so far, in order. */
  readonly sent: Array<SentRequest>
  /** Op names of `sent`, optionally only those in `only`. */
  readonly ops: (...only: ReadonlyArray<string>) => Array<string>
  /** Replaces the default reply for `op`. */
  readonly answer: (op: string, r: Reply) => void
  /** Queues one-shot replies for `op`, used before the default. */
  readonly once: (op: string, ...r: ReadonlyArray<Reply>) => void
}

/** Default replies: what a current, healthy server answers. */
const defaults = (): Map<string, Reply> =>
  new Map<string, Reply>([
    ["get_chunk_size", reply.ok(256)],
    ["register_kv_cache", reply.ok(undefined)],
    ["unregister_kv_cache", reply.ok(undefined)],
    ["ping", reply.ok(true)],
    ["ping_registered", reply.ok([])],
    ["store", reply.ok([new Uint8Array(0), true])],
    ["retrieve", reply.ok([new Uint8Array(0), true])],
    ["lookup", reply.ok(undefined)],
    ["query_prefetch_status", reply.ok(1)],
    ["free_lookup_locks", reply.ok(undefined)],
    ["end_session", reply.ok(undefined)]
  ])

/** A fresh fake client; `defaultTimeoutMs` plays the real client's default request timeout. */
export const makeFakeMqClient = (options: { readonly endpoint?: string; readonly defaultTimeoutMs?: number } = {}): FakeMqClient => {
  const endpoint = options.endpoint ?? "fake://server"
  const defaultTimeoutMs = options.defaultTimeoutMs ?? 30_000
  const sent: Array<SentRequest> = []
  const standing = defaults()
  const queued = new Map<string, Array<Reply>>()
  let inFlight = 0

  const next = (op: string): Reply => queued.get(op)?.shift() ?? standing.get(op) ?? reply.ok(undefined)

  const play = (r: Reply, op: string, timeoutMs: number): Effect.Effect<unknown, RequestError> => {
    switch (r._tag) {
      case "Ok":
        return Effect.succeed(r.value)
      case "Fail":
        return Effect.fail(r.error)
      case "Timeout":
        return Effect.andThen(
          Effect.sleep(Duration.millis(timeoutMs)),
          Effect.fail(new RequestTimeout({ op, endpoint, timeoutMs }))
        )
      case "Hang":
        return Effect.never
      case "Die":
        return Effect.die(r.defect)
      case "After":
        return Effect.andThen(Effect.sleep(Duration.millis(r.ms)), play(r.then, op, timeoutMs))
    }
  }

  const request = <O extends Op>(
    op: O,
    payload: PayloadOf<O>,
    requestOptions?: RequestOptions
  ): Effect.Effect<ResponseOf<O>, RequestError> =>
    Effect.gen(function*() {
      const atMs = yield* Clock.currentTimeMillis
      const timeoutMs = requestOptions?.timeoutMs ?? defaultTimeoutMs
      sent.push({ op: op.name, payload: payload as ReadonlyArray<unknown>, atMs, timeoutMs })
      inFlight++
      const value = yield* play(next(op.name), op.name, timeoutMs).pipe(Effect.ensuring(Effect.sync(() => inFlight--)))
      return value as ResponseOf<O>
    })

  return {
    endpoint,
    request,
    pendingCount: () => inFlight,
    sent,
    ops: (...only) => sent.map((s) => s.op).filter((o) => only.length === 0 || only.includes(o)),
    answer: (op, r) => void standing.set(op, r),
    once: (op, ...r) => {
      const list = queued.get(op) ?? []
      list.push(...r)
      queued.set(op, list)
    }
  }
}

/** One captured log line. */
export interface CapturedLog {
  /** "Info", "Warn", "Error", "Debug" … */
  readonly level: string
  /** The message arguments joined with spaces (strings as is, others via String). */
  readonly text: string
  /** True when the log carried a cause that is not empty. */
  readonly hasCause: boolean
}

/** A logger layer that replaces the default loggers and appends to `into`. */
export const captureLogs = (into: Array<CapturedLog>) =>
  Logger.layer([
    Logger.make((o) => {
      const parts = Array.isArray(o.message) ? (o.message as ReadonlyArray<unknown>) : [o.message]
      into.push({
        level: o.logLevel,
        text: parts.map((p) => (typeof p === "string" ? p : String(p))).join(" "),
        hasCause: Cause.hasFails(o.cause) || Cause.hasDies(o.cause)
      })
    })
  ])
