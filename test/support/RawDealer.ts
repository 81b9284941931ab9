/**
 * A bare DEALER for sending frames the real client would never send
 * (malformed messages, wrong payload counts), and reading raw replies.
 */
import { Effect, Scope } from "effect"
import * as zmq from "zeromq"

export interface RawDealer {
  readonly send: (frames: ReadonlyArray<Uint8Array | string>) => Effect.Effect<void>
  /** The next message, or undefined if none arrives within `timeoutMs`. */
  readonly receive: (timeoutMs: number) => Effect.Effect<Array<Buffer> | undefined>
}

export const rawDealer = (endpoint: string): Effect.Effect<RawDealer, never, Scope.Scope> =>
  Effect.gen(function*() {
    const dealer = yield* Effect.acquireRelease(
      Effect.sync(() => {
        const d = new zmq.Dealer({ linger: 0, receiveTimeout: -1 })
        d.connect(endpoint)
        return d
      }),
      (d) => Effect.sync(() => d.close())
    )
    let pending: Promise<Array<Buffer>> | undefined
    return {
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
  })
