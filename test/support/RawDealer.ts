/**
 * A bare DEALER for sending frames the real client would never send
 * (malformed messages, wrong payload counts), and reading raw replies.
 * With `curve` it speaks CURVE and binds its connection with HELLO first
 * (docs/security.md), so the server judges its frames as a tenant's;
 * `{ hello: false }` skips HELLO: an authorized key whose connection never
 *  bound itself (issue 24 item 3).
 * `receiveHighWaterMark` (default 0, unbounded) makes a peer whose own
 * queue fills at once when it stops reading (issue 24 item 10).
 */
import { Effect, Scope } from "effect"
import * as zmq from "zeromq"
import { setRoutingId } from "../../src/layers/Zmq.ts"
import { decodeReplyHeader, decodeResponse, encodeRequest, pack, type ReplyHeader } from "../../src/schema/Frame.ts"
import { Hello, HelloChallenge, type Op, type PayloadOf } from "../../src/schema/Op.ts"
import { helloProof } from "../../src/services/auth/Curve.ts"
import type { DealerCurve } from "../../src/services/zmq/Sockets.ts"

export interface RawDealer {
  readonly send: (frames: ReadonlyArray<Uint8Array | string>) => Effect.Effect<void>
  /** The next message, or undefined if none arrives within `timeoutMs`. */
  readonly receive: (timeoutMs: number) => Effect.Effect<Array<Buffer> | undefined>
}

/** The uid of the HELLO exchange: far from the small uids the tests send. */
const HELLO_UID = 1_000_000

/** What a raw DEALER does beyond the defaults. */
export interface RawDealerOptions {
  /** The id it claims for itself (ZMQ_ROUTING_ID), as an attacker would (issue 24 item 1); absent: the ROUTER assigns one, as every real client lets it. */
  readonly routingId?: Uint8Array
  /** With `curve`: bind the connection with HELLO before returning (default true). */
  readonly hello?: boolean
  /** ZMQ_RCVHWM of the DEALER (default 0, unbounded): small, its queue fills at once when it stops reading (issue 24 item 10). */
  readonly receiveHighWaterMark?: number
}

/** A raw DEALER connected to `endpoint`; with `curve` it speaks CURVE (and says HELLO unless `options.hello` is false). */
export const rawDealer = (endpoint: string, curve?: DealerCurve, options: RawDealerOptions = {}): Effect.Effect<RawDealer, never, Scope.Scope> =>
  Effect.gen(function*() {
    const dealer = yield* Effect.acquireRelease(
      Effect.sync(() => {
        const d = new zmq.Dealer({
          linger: 0,
          receiveTimeout: -1,
          ...(options.receiveHighWaterMark === undefined ? {} : { receiveHighWaterMark: options.receiveHighWaterMark }),
          ...(curve === undefined
            ? {}
            : { curveServerKey: curve.serverPublicKey, curveSecretKey: curve.secretKey, curvePublicKey: curve.publicKey })
        })
        if (options.routingId !== undefined) {
          setRoutingId(d, options.routingId)
        }
        d.connect(endpoint)
        return d
      }),
      (d) => Effect.sync(() => d.close())
    )
    let pending: Promise<Array<Buffer>> | undefined
    const raw: RawDealer = {
      send: (frames) => Effect.promise(() => dealer.send(frames as Array<Uint8Array | string>)),
      receive: (timeoutMs) =>
        Effect.promise(() => {
          // Keep one receive in flight across timeouts (zeromq.js allows only one).
          pending ??= dealer.receive()
          const current = pending
          return Promise.race([
            current.then((m) => {
              pending = undefined
              return m
            }),
            new Promise<undefined>((resolve) => setTimeout(() => resolve(undefined), timeoutMs))
          ])
        })
    }
    if (curve !== undefined && options.hello !== false) {
      const exchange = <O extends Op>(op: O, payload: PayloadOf<O>) =>
        Effect.gen(function*() {
          yield* raw.send(yield* Effect.orDie(encodeRequest(op, HELLO_UID, payload)))
          const reply = yield* raw.receive(10_000)
          const header = reply === undefined ? undefined : decodeReplyHeader(reply)
          if (header === undefined || header._tag === "Error") return yield* Effect.die(new Error(`rawDealer: ${op.name} failed: ${String(header?._tag)}`))
          return yield* Effect.orDie(decodeResponse(op, header.body))
        })
      const nonce = yield* exchange(HelloChallenge, [])
      yield* exchange(Hello, [curve.publicKey, new Uint8Array(helloProof(curve.secretKey, curve.serverPublicKey, nonce))])
    }
    return raw
  })

/**
 * Sends `[uid, op, ...values]` with every value packed as given — not checked against the op's Schemas, so
 * an attacker's payload goes out as written — and returns the next reply's header. Dies when none arrives
 * within `timeoutMs` (a bound on a hang, not a speed test) or it is not a reply.
 */
export const rawCall = (raw: RawDealer, uid: number, op: Op, values: ReadonlyArray<unknown>, timeoutMs = 30_000): Effect.Effect<ReplyHeader> =>
  Effect.gen(function*() {
    yield* raw.send([pack(uid), pack(op.id), ...values.map((v) => pack(v))])
    const reply = yield* raw.receive(timeoutMs)
    const header = reply === undefined ? undefined : decodeReplyHeader(reply)
    if (header === undefined) return yield* Effect.die(new Error(`rawCall: ${op.name} (uid ${uid}): ${reply === undefined ? `no reply within ${timeoutMs} ms` : "not a reply"}`))
    if (header.uid !== uid || header.opId !== op.id) return yield* Effect.die(new Error(`rawCall: ${op.name} (uid ${uid}): the reply is for uid ${header.uid}, op ${header.opId}`))
    return header
  })
