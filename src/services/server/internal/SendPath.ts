/**
 * The MQ server's send path (DESIGN §3; issue 24 item 10): the one way replies leave the ROUTER. One outbox per
 * peer, drained round-robin by one promise loop (zeromq.js allows one send in flight per socket), with the bytes
 * queued to each peer bounded (ReplyOutbox.ts); replies that cannot be delivered or are refused are counted in the
 * metrics and told in one WARNING per peer and window (UndeliveredReplies.ts). No fiber, Queue or Effect per
 * reply: this is the PING hot path (issue 16).
 *
 * Lives in the Scope it is made in: its reporters and its idle sweep are fibers there, and closing the Scope waits
 * (at most 5 s) for what is queued to be sent.
 */
import { Duration, Effect, type Scope } from "effect"
import type * as zmq from "zeromq"
import { encodeErrorReply } from "../../../schema/Frame.ts"
import type { WireError } from "../../../schema/WireError.ts"
import * as M from "../ServerMetrics.ts"
import { makeReplyOutbox, type ReplyOutbox } from "./ReplyOutbox.ts"
import { makeRefusedReplies, makeUndeliveredReplies } from "./UndeliveredReplies.ts"

/** How long a reply waits for its peer's pipe (drain proof, EAGAIN) before it is refused (large) or dropped (small). */
const REPLY_WAIT_MS = 1_000
/** `--max-queued-reply-bytes-per-peer` where the MQ server's options leave it out (tests): 256 MiB. */
const DEFAULT_MAX_QUEUED_REPLY_BYTES_PER_PEER = 256 * 1024 * 1024
/** How often the outbox drops the records of peers that hold nothing. */
const OUTBOX_SWEEP_INTERVAL = Duration.seconds(10)
/** How long closing the send path waits for the queued replies to go. */
const FLUSH_TIMEOUT = Duration.seconds(5)

/** What the send path needs of the MQ server. */
export interface SendPathOptions {
  /** The bound ROUTER (only its `send` is used). */
  readonly socket: Pick<zmq.Router, "send">
  /** The ROUTER's SNDHWM (messages): the window over which the byte bound is proven. */
  readonly highWaterMark: number
  /** Bytes of replies queued to one peer, in its pipe and in its outbox each (`--max-queued-reply-bytes-per-peer`). Default 256 MiB. */
  readonly maxQueuedReplyBytesPerPeer?: number | undefined
}

/** The running send path. */
export interface SendPath {
  /** The outbox (for `whenClear`, `notServed`, `probe`, `forget`, `stats`). */
  readonly outbox: ReplyOutbox
  /** Queues a reply `frames` (uid, op, ...) to `routingId`. */
  readonly reply: (routingId: Uint8Array, frames: Array<Uint8Array>) => void
  /** Queues the error reply of `error` to the request (`uidFrame`, `opFrame`) and counts it by its code. */
  readonly replyError: (routingId: Uint8Array, uidFrame: Uint8Array, opFrame: Uint8Array, error: WireError) => Effect.Effect<void>
  /** `replyError` done at once, outside any fiber (the receive loop). */
  readonly replyErrorNow: (routingId: Uint8Array, uidFrame: Uint8Array, opFrame: Uint8Array, error: WireError) => void
  /**
   * A reply to `peer` (routing id, hex) given up before it was built, counted as undeliverable with `code` (issue 27 item 1:
   * a shed request of a peer whose replies back up; its error would wait behind thousands of replies it does not
   * read, and was the server's garbage under a flood).
   */
  readonly dropUnbuilt: (peer: string, code: string) => void
  /** Replies that could not be delivered since start. */
  readonly undeliverable: () => number
  /** Replies refused for the bytes queued to their peer since start. */
  readonly refused: () => number
}

/** zeromq.js errors carry libzmq's errno name in `code`. */
const errorCode = (e: unknown): string =>
  typeof e === "object" && e !== null && "code" in e && typeof e.code === "string" ? e.code : String(e)

/** The send path over `options.socket`, for the life of the current Scope. */
export const makeSendPath = (options: SendPathOptions): Effect.Effect<SendPath, never, Scope.Scope> =>
  Effect.gen(function*() {
    const services = yield* Effect.context<never>()
    const undelivered = makeUndeliveredReplies()
    yield* Effect.forkScoped(undelivered.reportForever)
    const refusals = makeRefusedReplies()
    yield* Effect.forkScoped(refusals.reportForever)
    let undeliverableReplies = 0
    let refusedReplies = 0
    // The peer is gone (ROUTER_MANDATORY: EHOSTUNREACH), its pipe stayed full (EAGAIN), its outbox is full, the
    // socket is closing, or the reply was given up unbuilt: it cannot be delivered. Counted here; told in one
    // WARNING per peer and window.
    const countUndeliverable = (peer: string, code: string): void => {
      undeliverableReplies++
      M.undeliverableRepliesTotal.updateUnsafe(1, services)
      undelivered.record(peer, code)
    }
    const outbox = makeReplyOutbox({
      highWaterMark: options.highWaterMark,
      maxQueuedBytesPerPeer: options.maxQueuedReplyBytesPerPeer ?? DEFAULT_MAX_QUEUED_REPLY_BYTES_PER_PEER,
      replyWaitMs: REPLY_WAIT_MS,
      send: (message) => {
        try {
          return options.socket.send(message).then(() => undefined, errorCode)
        } catch (e) {
          return Promise.resolve(errorCode(e))
        }
      },
      onUndeliverable: countUndeliverable,
      onRefused: (peer, reason) => {
        refusedReplies++
        M.refusedReplyMetric[reason].updateUnsafe(1, services)
        M.errorMetric.overloaded.updateUnsafe(1, services)
        refusals.record(peer, reason)
      }
    })
    // Records of peers that hold nothing are dropped now and then: a refused or kicked peer's disconnect is never
    // confirmed, so `forget` would never come for it.
    yield* Effect.sleep(OUTBOX_SWEEP_INTERVAL).pipe(Effect.andThen(Effect.sync(() => outbox.sweepIdle())), Effect.forever, Effect.forkScoped)
    yield* Effect.addFinalizer(() => Effect.promise(() => outbox.flushed()).pipe(Effect.timeout(FLUSH_TIMEOUT), Effect.ignore))
    const reply = (routingId: Uint8Array, frames: Array<Uint8Array>): void => outbox.reply([routingId, ...frames])
    const replyErrorNow = (routingId: Uint8Array, uidFrame: Uint8Array, opFrame: Uint8Array, error: WireError): void => {
      reply(routingId, encodeErrorReply(uidFrame, opFrame, error))
      M.errorMetric[error.code].updateUnsafe(1, services)
    }
    return {
      outbox,
      reply,
      replyError: (routingId, uidFrame, opFrame, error) => Effect.sync(() => replyErrorNow(routingId, uidFrame, opFrame, error)),
      replyErrorNow,
      dropUnbuilt: countUndeliverable,
      undeliverable: () => undeliverableReplies,
      refused: () => refusedReplies
    }
  })
