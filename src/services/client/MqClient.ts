/**
 * The MQ client (DESIGN §3, §6): a DEALER connected to the server, a uid
 * counter, replies matched to requests by uid, a per-request timeout, and
 * one send at a time (zeromq.js forbids two in flight on one socket).
 *
 * Differences from upstream, on purpose (reference §1.6, §9):
 * - the payload-count check happens before sending, and a mismatch fails at
 *   once with a message that says the client and server versions differ;
 * - error replies become tagged errors instead of a hang until the timeout
 *   (upstream #5270 leaked those futures);
 * - connect timeout and reconnect interval are set, so a restarted server is
 *   reachable again within seconds, not the OS SYN timeout (#4670);
 * - close uses a bounded linger, so a process whose server is unreachable
 *   still exits;
 * - every request ends within its timeout, HELLO and send included: a
 *   DEALER whose handshake was refused has no connection to queue on and
 *   libzmq never retries it, so each send is bounded by what is left of the
 *   request's time (issue 14), and the timeout says why the handshake failed.
 */
import { Clock, Context, Deferred, Effect, Exit, Fiber, Layer, Schema, Scope, Semaphore } from "effect"
import type * as zmq from "zeromq"
import {
  decodeReplyHeader,
  decodeResponse,
  encodeRequest,
  type ReplyHeader
} from "../../schema/Frame.ts"
import { Hello, HelloChallenge, type Op, type PayloadOf, type ResponseOf } from "../../schema/Op.ts"
import { BadRequest, Forbidden, type WireError } from "../../schema/WireError.ts"
import { helloProof } from "../auth/Curve.ts"
import { type DealerCurve, type HandshakeFailure, ZmqError, ZmqSockets } from "../zmq/Sockets.ts"
import { handshakeRefusal } from "./HandshakeRefusal.ts"

/**
 * No reply arrived within the request's timeout: the server did not answer.
 * `handshake`, when the socket's monitor saw the last handshake fail, says
 * why in words (`handshakeRefusal`): a refused CURVE key, a CURVE/NULL
 * mismatch, a wrong server key.
 */
export class RequestTimeout extends Schema.TaggedError<RequestTimeout>()("RequestTimeout", {
  op: Schema.String,
  endpoint: Schema.String,
  timeoutMs: Schema.Number,
  handshake: Schema.optional(Schema.String)
}) {
  override get message(): string {
    return `${this.op} to ${this.endpoint}: no reply within ${this.timeoutMs} ms: the server did not answer` +
      (this.handshake === undefined ? " (is it running?)" : `; ${this.handshake}`)
  }
}

/** The client was closed while the request was waiting for its reply. */
export class ClientClosed extends Schema.TaggedError<ClientClosed>()("ClientClosed", {
  op: Schema.String,
  endpoint: Schema.String
}) {
  override get message(): string {
    return `${this.op} to ${this.endpoint}: the client was closed before the reply arrived`
  }
}

/** Everything a request can fail with. */
export type RequestError = WireError | RequestTimeout | ClientClosed | ZmqError

/** Client settings. Times in milliseconds. */
export interface MqClientOptions {
  /** Server endpoint, e.g. `tcp://127.0.0.1:5555`. */
  readonly endpoint: string
  /** Default per-request timeout (upstream `lmcache.mp.mq_timeout`). Default 5,000 ms. */
  readonly requestTimeoutMs?: number
  /** TCP connect timeout. Default 1,000 ms. */
  readonly connectTimeoutMs?: number
  /** First reconnect delay. Default 100 ms. */
  readonly reconnectIntervalMs?: number
  /** Reconnect delay cap. Default 1,000 ms. */
  readonly reconnectMaxIntervalMs?: number
  /** How long close() may wait to flush unsent requests. Default 1,000 ms. */
  readonly lingerMs?: number
  /**
   * CURVE (docs/security.md): the server's public key and this client's key
   * pair, Z85 (`readClientKeys` in src/services/auth/Curve.ts reads them from
   * the files of `--curve-server-public-key-file` and
   * `--curve-secret-key-file`). The client then says HELLO before its first
   * request, and again whenever the server answers `forbidden` for a
   * connection without one (a reconnect gets a new routing id), retrying
   * that request once.
   */
  readonly curve?: DealerCurve
}

/** Per-request overrides. */
export interface RequestOptions {
  readonly timeoutMs?: number
}

/** The client's interface; `MqClient` is the service, `makeMqClient` builds more than one. */
export interface MqClientShape {
  readonly endpoint: string
  /**
   * Sends `op` with `payload` and waits for its reply.
   *
   * Ends within the request's timeout (`options.timeoutMs`, else the
   * client's `requestTimeoutMs`), the CURVE HELLO and the send included.
   *
   * Fails with: `BadRequest` before sending when the payload does not fit the
   * op table (a version mismatch), or when the server rejects it; the other
   * wire errors as the server sends them; `RequestTimeout` naming the op,
   * endpoint and timeout, and why the handshake failed when the socket saw
   * it fail; `ClientClosed` when the client closes first; `ZmqError` when
   * the socket refuses the send.
   */
  readonly request: <O extends Op>(
    op: O,
    payload: PayloadOf<O>,
    options?: RequestOptions
  ) => Effect.Effect<ResponseOf<O>, RequestError>
  /** Requests waiting for their replies. */
  readonly pendingCount: () => number
}

/** The MQ client service (one DEALER). */
export class MqClient extends Context.Service<MqClient, MqClientShape>()("mpcache/services/MqClient") {
  /** Connects for the life of the layer. Fails with `ZmqError` on a malformed endpoint. */
  static readonly layer = (options: MqClientOptions) => Layer.effect(this, makeMqClient(options))
}

const MAX_UID = Number.MAX_SAFE_INTEGER

/**
 * Builds a client in the current Scope: connects the DEALER, starts the
 * reply reader; closing the Scope fails waiting requests with
 * `ClientClosed`, stops the reader and closes the socket with the linger.
 */
export const makeMqClient = (options: MqClientOptions): Effect.Effect<MqClientShape, ZmqError, Scope.Scope | ZmqSockets> =>
  Effect.gen(function*() {
    const endpoint = options.endpoint
    const defaultTimeoutMs = options.requestTimeoutMs ?? 5_000
    const curve = options.curve
    const sockets = yield* ZmqSockets
    /** The last handshake's failure as the socket's monitor saw it; undefined once one succeeds. */
    let handshakeFailure: HandshakeFailure | undefined
    const dealer: zmq.Dealer = yield* sockets.connectDealer(endpoint, {
      connectTimeoutMs: options.connectTimeoutMs ?? 1_000,
      reconnectIntervalMs: options.reconnectIntervalMs ?? 100,
      reconnectMaxIntervalMs: options.reconnectMaxIntervalMs ?? 1_000,
      lingerMs: options.lingerMs ?? 1_000,
      onHandshake: (failure) =>
        Effect.sync(() => {
          handshakeFailure = failure
        }),
      ...(curve === undefined ? {} : { curve })
    })
    const pending = new Map<number, Deferred.Deferred<ReplyHeader, ClientClosed>>()
    let nextUid = 0
    const sendLock = yield* Semaphore.make(1)

    const reader = yield* Effect.tryPromise({
      try: () => dealer.receive(),
      catch: (cause) => new ZmqError({ op: "receive", endpoint, cause })
    }).pipe(
      Effect.flatMap((frames) => {
        // A lone empty frame is the server's probe (a connection check, or proof that this client reads its
        // replies: issue 24 item 10), not a reply.
        if (frames.length === 1 && frames[0]!.length === 0) return Effect.void
        const header = decodeReplyHeader(frames)
        if (header === undefined) {
          return Effect.logWarning(`dropped a reply from ${endpoint} that does not decode (${frames.length} frames)`)
        }
        const waiter = pending.get(header.uid)
        if (waiter === undefined) return Effect.logDebug(`reply for uid ${header.uid} arrived after its request ended`)
        pending.delete(header.uid)
        return Deferred.succeed(waiter, header)
      }),
      Effect.forever,
      Effect.catch((e) => Effect.logDebug("reply reader stopped", e.message)),
      Effect.forkScoped
    )
    /** Set when the Scope closes: a send the closing socket refused is then `ClientClosed`, not a socket error. */
    let closing = false
    yield* Effect.addFinalizer(() =>
      Effect.gen(function*() {
        closing = true
        yield* Fiber.interrupt(reader)
        const waiting = [...pending.entries()]
        pending.clear()
        for (const [, d] of waiting) yield* Deferred.fail(d, new ClientClosed({ op: "request", endpoint }))
      })
    )

    /** One request's time: when it ends (Clock ms) and the error it then fails with. */
    interface Budget {
      readonly deadline: number
      readonly expired: () => RequestTimeout
    }
    const budgetOf = (op: Op, timeoutMs: number): Effect.Effect<Budget> =>
      Effect.map(Clock.currentTimeMillis, (now) => ({
        deadline: now + timeoutMs,
        expired: () =>
          new RequestTimeout({
            op: op.name,
            endpoint,
            timeoutMs,
            ...(handshakeFailure === undefined ? {} : { handshake: handshakeRefusal(handshakeFailure, curve !== undefined) })
          })
      }))

    /** Sends within what is left of `budget`; fails with its RequestTimeout when no connection took the frames in time. */
    const send = (frames: ReadonlyArray<Buffer>, budget: Budget): Effect.Effect<void, RequestTimeout | ZmqError> =>
      sendLock.withPermits(1)(
        Effect.flatMap(Clock.currentTimeMillis, (now) => {
          const left = budget.deadline - now
          return left <= 0 ? Effect.succeed(false) : sockets.sendWithin(dealer, frames, left)
        })
      ).pipe(Effect.flatMap((sent) => sent ? Effect.void : Effect.fail(budget.expired())))

    /** One round trip; the caller bounds the wait for the reply by `budget` (see `request`). */
    const rawRequest = <O extends Op>(
      op: O,
      payload: PayloadOf<O>,
      budget: Budget
    ): Effect.Effect<ResponseOf<O>, RequestError> =>
      Effect.suspend((): Effect.Effect<ResponseOf<O>, RequestError> => {
        const uid = nextUid
        nextUid = nextUid >= MAX_UID ? 0 : nextUid + 1
        const frames = encodeRequest(op, uid, payload)
        if (Exit.isFailure(frames)) return Effect.failCause(frames.cause)
        return Effect.gen(function*() {
          const waiter = yield* Deferred.make<ReplyHeader, ClientClosed>()
          pending.set(uid, waiter)
          yield* send(frames.value, budget).pipe(
            Effect.mapError((e): RequestError => closing && e._tag === "ZmqError" ? new ClientClosed({ op: op.name, endpoint }) : e)
          )
          const header = yield* Deferred.await(waiter).pipe(Effect.mapError(() => new ClientClosed({ op: op.name, endpoint })))
          if (header.opId !== op.id) {
            return yield* new BadRequest({
              message: `${op.name}: the reply names op ${header.opId}, expected ${op.id}; the client and server versions differ`
            })
          }
          if (header._tag === "Error") return yield* Effect.fail(header.error)
          const response = decodeResponse(op, header.body)
          if (Exit.isFailure(response)) return yield* response
          return response.value
        }).pipe(Effect.ensuring(Effect.sync(() => pending.delete(uid))))
      })

    let bound = false
    const helloLock = yield* Semaphore.make(1)
    /** HELLO_CHALLENGE, then HELLO with the proof over its nonce (Tenancy.ts); once per connection. */
    const ensureHello = (budget: Budget): Effect.Effect<void, RequestError> =>
      Effect.suspend(() => curve === undefined || bound ? Effect.void : helloLock.withPermits(1)(
        Effect.suspend(() =>
          bound ? Effect.void : Effect.gen(function*() {
            const nonce = yield* rawRequest(HelloChallenge, [], budget)
            yield* rawRequest(Hello, [curve.publicKey, new Uint8Array(helloProof(curve.secretKey, curve.serverPublicKey, nonce))], budget)
            bound = true
          })
        )
      ))
    const isUnbound = (e: RequestError) => e instanceof Forbidden && e.field === "hello"
    const request = <O extends Op>(
      op: O,
      payload: PayloadOf<O>,
      requestOptions?: RequestOptions
    ): Effect.Effect<ResponseOf<O>, RequestError> => {
      const timeoutMs = requestOptions?.timeoutMs ?? defaultTimeoutMs
      return Effect.flatMap(budgetOf(op, timeoutMs), (budget) => {
        const exchange: Effect.Effect<ResponseOf<O>, RequestError> = curve === undefined
          ? rawRequest(op, payload, budget)
          : ensureHello(budget).pipe(
            Effect.andThen(rawRequest(op, payload, budget)),
            Effect.catchIf(isUnbound, () =>
              Effect.sync(() => {
                bound = false
              }).pipe(Effect.andThen(ensureHello(budget)), Effect.andThen(rawRequest(op, payload, budget))))
          )
        // One bound for the locks, HELLO, send and reply together; a send in flight ends by itself at the same deadline.
        // A close during the HELLO names the request's own op, as its timeout does.
        return exchange.pipe(
          Effect.timeoutOrElse({ duration: timeoutMs, orElse: () => Effect.fail(budget.expired()) }),
          Effect.mapError((e): RequestError => e._tag === "ClientClosed" && e.op !== op.name ? new ClientClosed({ op: op.name, endpoint }) : e)
        )
      })
    }

    return { endpoint, request, pendingCount: () => pending.size }
  })
