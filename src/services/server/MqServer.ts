/**
 * The MQ server (DESIGN §3): a ROUTER bound to the configured endpoint, one
 * receive loop, dispatch by the handler table to the SYNC / NORMAL /
 * AFFINITY pools, and one send path (zeromq.js allows one send in flight per
 * socket).
 *
 * The receive loop and the send path are plain promise loops (the PING hot
 * path, issue 16): PING (nil, or named once its peer is bound: issue 25
 * item 4), NOOP and GET_CHUNK_SIZE are answered on the loop itself when
 * their pool would start them at once, and queued on their pool from there
 * otherwise (internal/FastPath.ts); every other message goes, in arrival
 * order, to the receive fiber, which runs `onMessage`.
 *
 * The receive loop never waits on a handler: it reads the uid and op frames,
 * answers what it can answer at once (unknown op, wrong payload count) and
 * queues everything else. Payload decoding runs in the pool. No input of
 * any shape stops the loop: a message that cannot be attributed (fewer than
 * 2 frames, a uid or op frame that is not a non-negative MessagePack int) is
 * dropped with one WARNING and counted; everything attributable gets a reply
 * (upstream answers errors with silence, reference §1.6).
 *
 * Shutdown (closing the layer's scope): stop receiving, let queued and
 * running requests finish (bounded), flush the replies, close the socket.
 */
import { Cause, Context, Duration, Effect, Exit, Layer, Metric, Queue } from "effect"
import { decodeHeaderInt, decodePayload, encodeErrorReply, encodeReply, payloadCountMismatch } from "../../schema/Frame.ts"
import { formatInstanceId } from "../../schema/InstanceId.ts"
import { opById } from "../../schema/Op.ts"
import { instanceIdOf } from "../../schema/OpMeta.ts"
import { type BadRequest, Internal, isWireError, notServed, Overloaded, UnknownOp, type WireError } from "../../schema/WireError.ts"
import { type HandshakeFailure, type RouterCurve, ZmqError, ZmqSockets } from "../zmq/Sockets.ts"
import { makeDispatcher, type DispatchStats } from "./Dispatch.ts"
import type { HandlerRow, HandlerTable, RequestContext, TableRow } from "./Handler.ts"
import { PeerEvents } from "../liveness/PeerEvents.ts"
import { RequestBarrier } from "../liveness/RequestBarrier.ts"
import * as M from "./ServerMetrics.ts"
import { makeMetricBatch } from "./internal/MetricBatch.ts"
import { listenAddressOf, type ListenAddress, scanAcceptedSockets, shutdownSocket } from "../../native/OwnSockets.ts"
import { makeConnectionCap } from "./internal/ConnectionCap.ts"
import { type FastPathStats, makeFastPath } from "./internal/FastPath.ts"
import { chosenRoutingIdError, makePeerAdmission, type RoutingIdRefusal } from "./internal/PeerAdmission.ts"
import { makeReplyOutbox, type ReplyOutboxStats } from "./internal/ReplyOutbox.ts"
import { makeRefusedReplies, makeUndeliveredReplies } from "./internal/UndeliveredReplies.ts"

/** The merged handler table of every server module. */
export class Handlers extends Context.Service<Handlers, HandlerTable>()("mpcache/services/Handlers") {}

/** Options of the MQ server. */
export interface MqServerOptions {
  /** ZeroMQ endpoint to bind, e.g. `tcp://127.0.0.1:5555` or `ipc:///run/mpcache.sock` (`tcp://127.0.0.1:*` picks a port). */
  readonly endpoint: string
  /** NORMAL pool size (`--max-cpu-workers`). */
  readonly normalWorkers: number
  /** AFFINITY lanes (`--max-gpu-workers`). */
  readonly affinityLanes: number
  /** Waiting jobs per pool/lane before `overloaded` replies. Default 65,536. */
  readonly queueCapacity?: number
  /** How long shutdown waits for in-flight requests. Default 10 s. */
  readonly drainTimeout?: Duration.Input
  /** CURVE on the ROUTER (the ZAP handler must already be bound); absent: the NULL mechanism. */
  readonly curve?: RouterCurve
  /** Group an `ipc://` socket file is chowned to (mode 0660); absent: mode 0600. */
  readonly ipcGroupId?: number
  /** Told of each failed client handshake. */
  readonly onHandshakeFailure?: (failure: HandshakeFailure) => Effect.Effect<void>
  /**
   * Concurrent connections past which new ones are shut down at once (`--max-zmq-connections`, issue 24 item 11;
   * ConnectionCap.ts); absent: no cap (tcp and ipc endpoints only).
   */
  readonly maxConnections?: number
  /** Bytes of replies queued to one peer, in its pipe and in its outbox each (`--max-queued-reply-bytes-per-peer`). Default 256 MiB. */
  readonly maxQueuedReplyBytesPerPeer?: number
}

/** Counters and queue depths, for `/api/status`. */
export interface MqServerStats {
  readonly connectedPeers: number
  /** Peers refused for their routing id since start, by reason, and peers whose id is being verified (issue 24 item 1). */
  readonly routingIds: { readonly refused: Readonly<Record<RoutingIdRefusal, number>>; readonly verifying: number }
  /** Connections open now by the ROUTER's monitor, the cap, and connections shut down for it since start; undefined without a cap. */
  readonly connections: { readonly connections: number; readonly max: number; readonly refused: number } | undefined
  readonly droppedMessages: number
  readonly undeliverableReplies: number
  /** Replies refused for the bytes queued to their peer (issue 24 item 10), and the outbox's depths. */
  readonly refusedReplies: number
  readonly outbox: ReplyOutboxStats
  readonly pools: DispatchStats
  /** Requests the fast path answered where they were received, and queued on their busy pool (internal/FastPath.ts). */
  readonly fastPath: FastPathStats
}

/** The running MQ server. */
export class MqServer extends Context.Service<MqServer, {
  /** The endpoint actually bound (a `*` port resolved). */
  readonly endpoint: string
  /** The merged handler table (id, name, pool, module). */
  readonly table: ReadonlyArray<TableRow>
  /** Whether the peer (routing id, hex) is still connected. */
  readonly isConnected: (peer: string) => boolean
  readonly stats: () => MqServerStats
}>()("mpcache/services/MqServer") {
  /**
   * Binds and serves for the life of the layer. Fails with `ZmqError` when
   * the endpoint cannot be bound. Requires the merged `Handlers` and a
   * `PeerEvents` listener.
   */
  static readonly layer = (options: MqServerOptions) => Layer.effect(this, make(options))
}

const DEFAULT_QUEUE_CAPACITY = 65_536
/**
 * SNDHWM: messages the ROUTER's pipe to one peer holds at most. The send path's byte bound is proven over the last
 * SNDHWM + 1 messages (internal/ReplyOutbox.ts), so a smaller mark lets a peer that reads prove drain sooner (fewer
 * probes); 1,000 is libzmq's default and leaves a pipelining client (MqClient reads into an unbounded queue, pyzmq
 * into its own 1,000) room. A peer past it waits its turn (EAGAIN, backoff) for up to REPLY_WAIT_MS.
 */
export const SEND_HIGH_WATER_MARK = 1_000
/** How long a reply waits for its peer's pipe (drain proof, EAGAIN) before it is refused (large) or dropped (small). */
const REPLY_WAIT_MS = 1_000
/** `--max-queued-reply-bytes-per-peer` where MqServerOptions leaves it out (tests): 256 MiB. */
const DEFAULT_MAX_QUEUED_REPLY_BYTES_PER_PEER = 256 * 1024 * 1024
const CLOSE_LINGER_MS = 1_000
/** How often the outbox drops the records of peers that hold nothing. */
const OUTBOX_SWEEP_INTERVAL = Duration.seconds(10)

const describeCause = (cause: Cause.Cause<unknown>): string => {
  const squashed = Cause.squash(cause)
  return squashed instanceof Error ? squashed.message : String(squashed)
}

/** zeromq.js errors carry libzmq's errno name in `code`. */
const errorCode = (e: unknown): string =>
  typeof e === "object" && e !== null && "code" in e && typeof e.code === "string" ? e.code : String(e)

/** When the probes of one ambiguous empty frame are sent, ms after it (see `stillConnected`). */
const PROBE_DELAYS_MS: ReadonlyArray<number> = [0, 10, 50, 200, 800]

const make = (options: MqServerOptions) =>
  Effect.gen(function*() {
    const serverScope = yield* Effect.scope
    const table = yield* Handlers
    const events = yield* PeerEvents
    const barrier = yield* RequestBarrier
    // The cap exists before the bind, so it sees every accept; its address is known once the endpoint is bound.
    let listenAddress: ListenAddress | undefined
    const cap = options.maxConnections === undefined ? undefined : yield* makeConnectionCap("zmq", options.maxConnections, {
      scan: Effect.suspend(() => listenAddress === undefined ? Effect.succeed([]) : scanAcceptedSockets(listenAddress)),
      shutdown: shutdownSocket
    })
    const bound = yield* (yield* ZmqSockets).bindRouter(options.endpoint, {
      sendHighWaterMark: SEND_HIGH_WATER_MARK,
      lingerMs: CLOSE_LINGER_MS,
      ...(cap === undefined ? {} : { onConnectionEvent: (event: "accepted" | "ended") => event === "accepted" ? cap.accepted : cap.ended }),
      ...(options.curve === undefined ? {} : { curve: options.curve }),
      ...(options.ipcGroupId === undefined ? {} : { ipcGroupId: options.ipcGroupId, ipcMode: 0o660 }),
      ...(options.onHandshakeFailure === undefined ? {} : { onHandshakeFailure: options.onHandshakeFailure })
    })
    const router = bound.socket
    const endpoint = router.lastEndpoint ?? options.endpoint
    listenAddress = listenAddressOf(endpoint)
    let droppedMessages = 0
    let undeliverableReplies = 0

    // One send path (zeromq.js allows one send in flight per socket): one outbox per peer, drained round-robin by
    // one promise loop, with the bytes queued to each peer bounded (issue 24 item 10; internal/ReplyOutbox.ts).
    // No fiber, Queue or Effect per reply: this is the PING hot path.
    const services = yield* Effect.context<never>()
    const undelivered = makeUndeliveredReplies()
    yield* Effect.forkScoped(undelivered.reportForever)
    const refusals = makeRefusedReplies()
    yield* Effect.forkScoped(refusals.reportForever)
    let refusedReplies = 0
    const outbox = makeReplyOutbox({
      highWaterMark: SEND_HIGH_WATER_MARK,
      maxQueuedBytesPerPeer: options.maxQueuedReplyBytesPerPeer ?? DEFAULT_MAX_QUEUED_REPLY_BYTES_PER_PEER,
      replyWaitMs: REPLY_WAIT_MS,
      send: (message) => {
        try {
          return router.send(message).then(() => undefined, errorCode)
        } catch (e) {
          return Promise.resolve(errorCode(e))
        }
      },
      onUndeliverable: (peer, code) => {
        // The peer is gone (ROUTER_MANDATORY: EHOSTUNREACH), its pipe stayed full (EAGAIN), its outbox is full or
        // the socket is closing: the reply cannot be delivered. Counted here; told in one WARNING per peer and window.
        undeliverableReplies++
        M.undeliverableRepliesTotal.updateUnsafe(1, services)
        undelivered.record(peer, code)
      },
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
    const reply = (routingId: Uint8Array, frames: Array<Uint8Array>): void => outbox.reply([routingId, ...frames])
    /**
     * One probe of `routingId`'s connection: an empty frame sent with ROUTER_MANDATORY fails at once
     * (EHOSTUNREACH) once the ROUTER has dropped the peer's pipe (libzmq 4.3 through zeromq.js 6.8).
     * False only for EHOSTUNREACH.
     */
    const probe = (routingId: Uint8Array): Promise<boolean> => outbox.probe(routingId)
    yield* Effect.addFinalizer(() => Effect.promise(() => outbox.flushed()).pipe(Effect.timeout("5 seconds"), Effect.ignore))

    const dispatcher = yield* makeDispatcher({
      normalWorkers: options.normalWorkers,
      affinityLanes: options.affinityLanes,
      queueCapacity: options.queueCapacity ?? DEFAULT_QUEUE_CAPACITY
    })
    yield* Effect.addFinalizer(() => dispatcher.drain(options.drainTimeout ?? "10 seconds"))

    const opMetrics = new Map(
      [...table.byId.values()].map((r) => [r.op.id, M.opMetrics(r.op.name)] as const)
    )

    const replyError = (
      routingId: Uint8Array,
      uidFrame: Uint8Array,
      opFrame: Uint8Array,
      error: WireError
    ): Effect.Effect<void> =>
      Effect.sync(() => reply(routingId, encodeErrorReply(uidFrame, opFrame, error))).pipe(
        Effect.andThen(Metric.update(M.errorMetric[error.code], 1))
      )

    /**
     * The job for one attributable request: decode, run, reply, measure. Never fails. Built lazily, so the
     * payload is decoded on the pool, not on the receive loop.
     */
    const job = (
      row: HandlerRow,
      routingId: Uint8Array,
      peer: string,
      frames: Array<Uint8Array>,
      receivedAtMs: number,
      seq: number
    ): Effect.Effect<void> =>
      Effect.suspend(() => {
        // A transfer (the ops whose replies may be large) waits while its peer has a large reply waiting for its
        // pipe, and is not served at all once that peer is stalled (issue 24 item 10: a reply built only to be
        // refused is garbage that grows the server's memory as fast as the peer can ask).
        const gate = row.pool === "AFFINITY" ? outbox.whenClear(routingId) : undefined
        if (gate === undefined) return jobNow(row, routingId, peer, frames, receivedAtMs, seq, false)
        return Effect.promise(() => gate).pipe(
          Effect.flatMap((verdict) => jobNow(row, routingId, peer, frames, receivedAtMs, seq, verdict === "stalled"))
        )
      })

    const jobNow = (
      row: HandlerRow,
      routingId: Uint8Array,
      peer: string,
      frames: Array<Uint8Array>,
      receivedAtMs: number,
      seq: number,
      stalled: boolean
    ): Effect.Effect<void> => {
      const uidFrame = frames[0]!
      const opFrame = frames[1]!
      const ctx: RequestContext = { routingId, peer, skipBinding: false }
      // The peer is judged before its payload is decoded (issue 24 item 3: an unbound peer costs no decoding).
      const refused = stalled ? undefined : row.admit?.(ctx)
      const decoded = stalled || refused !== undefined ? Exit.fail(refused) : decodePayload(row.op, frames.slice(2))
      const instanceId = Exit.isSuccess(decoded) ? instanceIdOf(row.op, decoded.value as ReadonlyArray<unknown>) : undefined
      const run: Effect.Effect<void> = stalled
        ? Effect.sync(() => outbox.reply(outbox.notServed([routingId, uidFrame, opFrame])))
        : Exit.isFailure(decoded)
        ? refused !== undefined
          ? replyError(routingId, uidFrame, opFrame, refused)
          : Effect.logWarning("bad request", describeCause(decoded.cause)).pipe(
            Effect.andThen(replyError(routingId, uidFrame, opFrame, Cause.squash(decoded.cause) as BadRequest))
          )
        : Effect.exit(row.handle(decoded.value as ReadonlyArray<unknown>, ctx)).pipe(
          Effect.flatMap((exit): Effect.Effect<void> => {
            if (Exit.isSuccess(exit)) {
              const encoded = encodeReply(row.op, uidFrame, opFrame, exit.value as never)
              if (Exit.isSuccess(encoded)) {
                return Effect.sync(() => reply(routingId, encoded.value)).pipe(
                  Effect.andThen(instanceId === undefined || ctx.skipBinding ? Effect.void : events.instanceMessage(peer, instanceId))
                )
              }
              return Effect.logError("handler returned a response that does not encode", describeCause(encoded.cause))
                .pipe(
                  Effect.andThen(replyError(
                    routingId,
                    uidFrame,
                    opFrame,
                    new Internal({ op: row.op.name, field: "response", message: `${row.op.name}: the server produced an invalid response` })
                  ))
                )
            }
            const failure = Cause.squash(exit.cause)
            if (isWireError(failure) && !Cause.hasDies(exit.cause)) {
              return replyError(routingId, uidFrame, opFrame, failure)
            }
            if (Cause.hasInterruptsOnly(exit.cause)) return Effect.void
            return Effect.logError("handler failed", exit.cause).pipe(
              Effect.andThen(replyError(
                routingId,
                uidFrame,
                opFrame,
                new Internal({ op: row.op.name, message: `${row.op.name}: internal error: ${describeCause(exit.cause)}` })
              ))
            )
          })
        )
      const m = opMetrics.get(row.op.id)!
      const finish = () => {
        m.requests.updateUnsafe(1, services)
        m.latency.updateUnsafe((Date.now() - receivedAtMs) / 1000, services)
        barrier.exit(seq)
      }
      return run.pipe(
        Effect.annotateLogs(
          instanceId === undefined ? { op: row.op.name, peer } : { op: row.op.name, peer, instance_id: formatInstanceId(instanceId) }
        ),
        Effect.catchCause((cause) => Effect.logError("request job failed", cause)),
        Effect.ensuring(Effect.sync(finish))
      )
    }

    // ------------------------------------------------------------------ the fast path (internal/FastPath.ts)
    // The receive loop is a plain promise loop, as the send path is: a request whose row has a `fast` answer
    // (PING, NOOP, GET_CHUNK_SIZE) is answered right there when its pool would start it at once, or queued on
    // its busy pool straight from there (DESIGN §3.1: a PING still waits behind a saturated NORMAL pool), as
    // long as nothing received before it is still on its way to `onMessage` (so it never overtakes a connect
    // notification, or a SYNC op on the SYNC lane). Everything else goes, in arrival order, through `inbox` to
    // the receive fiber below, which runs `onMessage` (and serves a fast row the same way after its checks).
    const batch = makeMetricBatch(services)
    const fastPath = makeFastPath({
      table,
      dispatcher,
      barrier,
      isServed: (routingId) => admission.isServed(routingId),
      isBound: events.isBound,
      reply: (message) => outbox.reply(message),
      metrics: new Map(
        [...table.byId.values()].filter((r) => r.fast !== undefined).map((r) => [r.op.id, {
          requests: batch.counter(M.requestsTotal, { op: r.op.name }),
          latency: batch.histogram(M.requestDurationSeconds, { op: r.op.name })
        }] as const)
      ),
      pooled: (row, received, receivedAtMs, seq) => {
        const routingId = received[0]!
        return job(row, routingId, routingId.toString("hex"), received.slice(1), receivedAtMs, seq)
      }
    })

    const connected = new Set<string>()
    // Peers whose connection is being probed (at most one probe sequence per peer at a time).
    const probing = new Set<string>()

    /**
     * Whether the connection of `routingId` is still up, after the ambiguous empty frame. The disconnect
     * notification travels through the peer's pipe before libzmq tears the pipe down, so right after it a
     * probe may still be delivered into the dying pipe: the probe is repeated over about a second, and one
     * EHOSTUNREACH means gone. A live peer answers every probe (and receives those empty frames).
     */
    const stillConnected = (routingId: Uint8Array): Effect.Effect<boolean> =>
      Effect.gen(function*() {
        for (const delayMs of PROBE_DELAYS_MS) {
          if (delayMs > 0) yield* Effect.sleep(delayMs)
          if (!(yield* Effect.promise(() => probe(routingId)))) return false
        }
        return true
      })

    /** The peer's connection is gone (a confirmed ROUTER_NOTIFY disconnect): its lane and its bindings go. */
    const disconnected = (peer: string): Effect.Effect<void> => {
      if (!connected.delete(peer)) return Effect.void
      admission.forget(Buffer.from(peer, "hex"), peer)
      dispatcher.releasePeer(peer)
      outbox.forget(peer)
      return Metric.update(M.connectedPeers, connected.size).pipe(
        Effect.andThen(Effect.logDebug("peer disconnected").pipe(Effect.annotateLogs({ peer }))),
        Effect.andThen(events.disconnected(peer))
      )
    }

    const drop = (peer: string, why: string): Effect.Effect<void> => {
      droppedMessages++
      return Metric.update(M.droppedMessagesTotal, 1).pipe(
        Effect.andThen(Effect.logWarning(`dropped a message that cannot be attributed: ${why}`).pipe(
          Effect.annotateLogs({ peer })
        ))
      )
    }

    /**
     * Handles one received multipart message; never fails, never waits on a handler. The door (PeerAdmission.ts)
     * sees it first: only peers whose routing id the ROUTER generated get further.
     */
    const onMessage = (received: Array<Buffer>): Effect.Effect<void> => {
      const routingId = received[0]
      if (routingId === undefined) return Effect.void
      const peer = routingId.toString("hex")
      return admission.admit(received, peer).pipe(
        Effect.flatMap((go) => go ? onAdmitted(received, routingId, peer) : Effect.void)
      )
    }

    /** A request's uid and op frames, when both are headers: a refused peer is answered only then. */
    const answerRefused = (routingId: Buffer, uidFrame: Buffer, opFrame: Buffer): Effect.Effect<void> => {
      if (decodeHeaderInt(uidFrame) === undefined) return Effect.void
      const opId = decodeHeaderInt(opFrame)
      const name = opId === undefined ? undefined : opById.get(opId)?.name
      return name === undefined ? Effect.void : replyError(routingId, uidFrame, opFrame, chosenRoutingIdError(name))
    }
    const admission = yield* makePeerAdmission(bound, onMessage, answerRefused)

    /** One message of an admitted peer. */
    const onAdmitted = (received: Array<Buffer>, routingId: Buffer, peer: string): Effect.Effect<void> => {
      const frames = received.slice(1)
      if (frames.length === 1 && frames[0]!.length === 0) {
        // ZMQ_ROUTER_NOTIFY's connect and disconnect notifications are both a lone empty frame, and a peer can
        // send that frame itself (a buggy client, or one that wants a live worker reaped: issue 14). The connect
        // comes before anything the peer sends, so the first one from a routing id is the connect; a later one
        // is the disconnect only if the peer is really gone, which a probe tells (off the receive loop).
        if (connected.has(peer)) {
          if (probing.has(peer)) return drop(peer, "a lone empty frame from a connected peer while its connection is being probed")
          probing.add(peer)
          return stillConnected(routingId).pipe(
            Effect.flatMap((alive) =>
              alive
                ? drop(peer, "a lone empty frame from a connected peer is not a ROUTER notification (its connection answered every probe)")
                : disconnected(peer)
            ),
            Effect.ensuring(Effect.sync(() => probing.delete(peer))),
            Effect.forkIn(serverScope),
            Effect.asVoid
          )
        }
        connected.add(peer)
        return Metric.update(M.connectedPeers, connected.size).pipe(
          Effect.andThen(Effect.logDebug("peer connected").pipe(Effect.annotateLogs({ peer }))),
          Effect.andThen(events.connected(peer))
        )
      }
      if (frames.length < 2) return drop(peer, `${frames.length} frame(s); a request has at least uid and op`)
      const uidFrame = frames[0]!
      const opFrame = frames[1]!
      const uid = decodeHeaderInt(uidFrame)
      if (uid === undefined) return drop(peer, "the uid frame is not a non-negative MessagePack int")
      const opId = decodeHeaderInt(opFrame)
      if (opId === undefined) return drop(peer, "the op frame is not a non-negative MessagePack int")
      const row = table.byId.get(opId)
      if (row === undefined) {
        const known = opById.get(opId)
        const error = known === undefined
          ? new UnknownOp({
            actual: String(opId),
            expected: `an op of protocol v1 (${[...opById.keys()].join(", ")})`,
            message: `unknown op ${opId}: this server speaks protocol v1 (ops ${[...opById.keys()].join(", ")})`
          })
          : notServed(known.name, opId)
        return Effect.logWarning(error.message).pipe(
          Effect.annotateLogs({ peer }),
          Effect.andThen(replyError(routingId, uidFrame, opFrame, error))
        )
      }
      const payloadCount = frames.length - 2
      if (payloadCount !== row.op.payload.length) {
        const error = payloadCountMismatch(row.op, payloadCount)
        return Effect.logWarning("bad request", error.message).pipe(
          Effect.annotateLogs({ op: row.op.name, peer }),
          Effect.andThen(replyError(routingId, uidFrame, opFrame, error))
        )
      }
      if (row.fast !== undefined && fastPath.serve(row, received)) return Effect.void
      const seq = barrier.enter()
      const accepted = dispatcher.submit(row.pool, peer, job(row, routingId, peer, frames, Date.now(), seq))
      if (accepted) return Effect.void
      barrier.exit(seq)
      const capacity = options.queueCapacity ?? DEFAULT_QUEUE_CAPACITY
      const error = new Overloaded({
        op: row.op.name,
        field: `${row.pool} pool`,
        expected: `at most ${capacity} waiting`,
        message: `${row.op.name}: the ${row.pool} pool is full (${capacity} waiting); retry later`
      })
      return Effect.logWarning(error.message).pipe(
        Effect.annotateLogs({ op: row.op.name, peer }),
        Effect.andThen(replyError(routingId, uidFrame, opFrame, error))
      )
    }

    type Inbound = { readonly _tag: "message"; readonly received: Array<Buffer> } | { readonly _tag: "error"; readonly cause: unknown }
    const inbox = yield* Queue.unbounded<Inbound>()
    // Messages handed to `inbox` whose `onMessage` has not finished yet.
    let inboxed = 0
    let receiving = true
    const hand = (item: Inbound): void => {
      inboxed++
      Queue.offerUnsafe(inbox, item)
    }
    const receiveLoop = async (): Promise<void> => {
      while (receiving) {
        let received: Array<Buffer>
        try {
          received = await router.receive()
        } catch (cause) {
          if (!receiving || router.closed) return
          hand({ _tag: "error", cause })
          await new Promise((resolve) => setTimeout(resolve, 10))
          continue
        }
        if (!receiving) return
        // The fast path only when nothing received before it is still on its way to `onMessage`.
        let served = false
        try {
          const fast = inboxed === 0 ? fastPath.rowOf(received) : undefined
          served = fast !== undefined && fastPath.serve(fast, received)
        } catch {
          // Not reached (the fast path never throws); kept so that a bug there cannot end the receive loop.
        }
        if (!served) hand({ _tag: "message", received })
      }
    }
    const receiveFiber = Queue.take(inbox).pipe(
      Effect.flatMap((item) =>
        item._tag === "message"
          ? onMessage(item.received)
          : Effect.logError("receive loop: recovering from an error", new ZmqError({ op: "receive", endpoint, cause: item.cause }))
      ),
      Effect.catchCause((cause) => Effect.logError("receive loop: recovering from an error", cause)),
      Effect.ensuring(Effect.sync(() => {
        inboxed--
      })),
      Effect.forever
    )
    yield* Effect.forkScoped(receiveFiber)
    // It never rejects: every await in it is caught or cannot fail.
    void receiveLoop()
    // Stop receiving first (this finalizer runs before the pools drain and the socket closes); a receive still
    // pending ends when the socket closes.
    yield* Effect.addFinalizer(() =>
      Effect.sync(() => {
        receiving = false
      })
    )
    yield* Effect.logInfo(`MQ server listening on ${endpoint}`)

    return {
      endpoint,
      table: table.rows,
      isConnected: (peer: string) => connected.has(peer),
      stats: () => ({
        connectedPeers: connected.size,
        routingIds: admission.stats(),
        connections: cap?.stats(),
        droppedMessages,
        undeliverableReplies,
        refusedReplies,
        outbox: outbox.stats(),
        pools: dispatcher.stats(),
        fastPath: fastPath.stats()
      })
    }
  })
