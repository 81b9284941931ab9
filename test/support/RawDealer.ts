/**
 * A bare DEALER for sending frames the real client would never send
 * (malformed messages, wrong payload counts), and reading raw replies.
 * With `curve` it speaks CURVE and binds its connection with HELLO first
 * (docs/security.md), so the server judges its frames as a tenant's.
 * `receiveHighWaterMark` (default 0, unbounded) makes a peer whose own
 * queue fills at once when it stops reading (issue 24 item 10).
 */
import { Effect, Scope } from "effect"
import * as zmq from "zeromq"
import { decodeReplyHeader, decodeResponse, encodeRequest } from "../../src/schema/Frame.ts"
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

export interface RawDealerOptions {
  readonly receiveHighWaterMark?: number
}

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
    if (curve !== undefined) {
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
