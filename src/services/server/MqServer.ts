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
 * otherwise (internal/FastPath.ts); every other message goes to the receive
 * fiber, which runs `onMessage`: through one bounded FIFO per peer, peers in
 * turn (internal/PeerQueues.ts, issue 27 item 1), so one peer's burst
 * delays another's request by one message at most, a peer that sends faster
 * than it is served gets `overloaded` past its bound, and a peer whose
 * replies back up loses the fast path first and is braked: the loop takes
 * at most 5,000 messages a second from such peers together and waits past
 * that (internal/ReceiveBrake.ts), while the ROUTER holds at most
 * {@link RECEIVE_HIGH_WATER_MARK} messages of any peer, so a flooder waits
 * in its own send instead of in the server's memory and CPU. The loop yields
 * to the event loop every {@link RECEIVE_BATCH} messages, so a flood cannot
 * starve the fibers and timers either.
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
 *
 * What it holds is the receive loop and the wiring; its machinery is in
 * internal/: the send path (SendPath.ts over ReplyOutbox.ts), the connected
 * peers and their probes (ConnectedPeers.ts), the pooled job of a request
 * (PooledJob.ts), the fast path (FastPath.ts), the door (PeerAdmission.ts).
 */
import { Context, Duration, Effect, Layer, Metric, Queue } from "effect"
import { decodeHeaderInt, payloadCountMismatch } from "../../schema/Frame.ts"
import { opById } from "../../schema/Op.ts"
import { notServed, Overloaded, UnknownOp } from "../../schema/WireError.ts"
import { type HandshakeFailure, type RouterCurve, ZmqError, ZmqSockets } from "../zmq/Sockets.ts"
import { makeDispatcher, type DispatchStats, poolSharePerPeer } from "./Dispatch.ts"
import { type HandlerTable, makeTable, type ServerModule, type TableRow } from "./Handler.ts"
import { PeerEvents } from "../liveness/PeerEvents.ts"
import { RequestBarrier } from "../liveness/RequestBarrier.ts"
import * as M from "./ServerMetrics.ts"
import { makeMetricBatch } from "./internal/MetricBatch.ts"
import { listenAddressOf, type ListenAddress, scanAcceptedSockets, shutdownSocket } from "../../native/OwnSockets.ts"
import { makeConnectedPeers } from "./internal/ConnectedPeers.ts"
import { makeConnectionCap } from "./internal/ConnectionCap.ts"
import { type FastPathStats, makeFastPath } from "./internal/FastPath.ts"
import { chosenRoutingIdError, makePeerAdmission, type RoutingIdRefusal } from "./internal/PeerAdmission.ts"
import { makePooledJobs } from "./internal/PooledJob.ts"
import { type ReplyOutboxStats, yieldToEventLoop } from "./internal/ReplyOutbox.ts"
import { makeSendPath } from "./internal/SendPath.ts"
import {
  type PeerQueuesStats,
  makePeerQueues,
  MAX_INBOUND_BYTES_PER_PEER,
  MAX_INBOUND_MESSAGES_PER_PEER
} from "./internal/PeerQueues.ts"
import { bytesOf, keyOf } from "./internal/OutboxPeer.ts"
import { makeBrakedRequests, makeShedRequests } from "./internal/UndeliveredReplies.ts"
import {
  BACKED_UP_BURST,
  BACKED_UP_MESSAGES_PER_SECOND,
  makeReceiveBrake,
  type ReceiveBrakeStats
} from "./internal/ReceiveBrake.ts"

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
  /**
   * Messages waiting for the receive fiber, by peer in turn (internal/PeerQueues.ts), requests shed since start, and
   * what the receive loop's brake did to peers whose replies back up (internal/ReceiveBrake.ts).
   */
  readonly inbound: PeerQueuesStats & { readonly shed: number; readonly brake: ReceiveBrakeStats }
}

/** The running MQ server. */
export class MqServer extends Context.Service<MqServer, {
  /** The endpoint actually bound (a `*` port resolved). */
  readonly endpoint: string
  /** Whether the ROUTER is bound and receiving: false once shutdown began or the socket closed (`/readyz` mq_bound). */
  readonly listening: () => boolean
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

  /**
   * The MQ server on an ephemeral loopback port (`tcp://127.0.0.1:*`, 2 NORMAL workers, 2 AFFINITY lanes unless
   * `options` say otherwise) serving the handler table of `modules` alone, with a request barrier of its own; its
   * connection events are recorded in `events` when given (`PeerEvents.layerTest`), else nobody listens
   * (`PeerEvents.layerNoop`). It still needs `ZmqSockets`:
   * real sockets, provided by `ZmqSocketsLive` in src/layers, which no service imports (test/Layout.test.ts).
   * Fails with `ZmqError` when the endpoint cannot be bound.
   */
  static readonly layerTest = (
    modules: ReadonlyArray<ServerModule>,
    options: Partial<MqServerOptions> = {},
    events?: Array<string>
  ) =>
    this.layer({ endpoint: "tcp://127.0.0.1:*", normalWorkers: 2, affinityLanes: 2, ...options }).pipe(
      Layer.provide(Layer.mergeAll(
        Layer.effect(Handlers, makeTable(modules)),
        events === undefined ? PeerEvents.layerNoop : PeerEvents.layerTest(events),
        RequestBarrier.layer
      ))
    )
}

const DEFAULT_QUEUE_CAPACITY = 65_536
/**
 * SNDHWM: messages the ROUTER's pipe to one peer holds at most. The send path's byte bound is proven over the last
 * SNDHWM + 1 messages (internal/ReplyOutbox.ts), so a smaller mark lets a peer that reads prove drain sooner (fewer
 * probes); 1,000 is libzmq's default and leaves a pipelining client (MqClient reads into an unbounded queue, pyzmq
 * into its own 1,000) room. A peer past it waits its turn (EAGAIN, backoff) for up to a second (internal/SendPath.ts).
 */
export const SEND_HIGH_WATER_MARK = 1_000
/**
 * RCVHWM: messages the ROUTER's pipe from one peer holds before libzmq stops reading that peer's connection, so a peer
 * that sends faster than it is served waits in its own send (and its own buffers), not in the server's memory; with
 * the receive loop's brake (internal/ReceiveBrake.ts) a flooder is held there, asleep (issue 27 item 1).
 */
export const RECEIVE_HIGH_WATER_MARK = 1_000
const CLOSE_LINGER_MS = 1_000
/** Messages the receive loop takes before it lets the event loop run (timers, fibers, HTTP): see `receiveLoop`. */
const RECEIVE_BATCH = 64
/** Why a shed request got no answer: its peer's replies back up (see `shed`). */
const SHED_UNANSWERED = "not answered: its replies back up"
/** The undeliverable-reply code of such a request's answer, never built. */
const BACKED_UP_CODE = "BACKED_UP"
/** The inbound queue of receive errors (no peer's key: a routing id is never empty). */
const ERROR_KEY = ""

const make = (options: MqServerOptions) =>
  Effect.gen(function*() {
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
      receiveHighWaterMark: RECEIVE_HIGH_WATER_MARK,
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

    // One send path (internal/SendPath.ts); it is made before the pools, so it closes after they drained.
    const send = yield* makeSendPath({
      socket: router,
      highWaterMark: SEND_HIGH_WATER_MARK,
      maxQueuedReplyBytesPerPeer: options.maxQueuedReplyBytesPerPeer
    })
    const { outbox, replyError } = send

    const dispatcher = yield* makeDispatcher({
      normalWorkers: options.normalWorkers,
      affinityLanes: options.affinityLanes,
      queueCapacity: options.queueCapacity ?? DEFAULT_QUEUE_CAPACITY
    })
    yield* Effect.addFinalizer(() => dispatcher.drain(options.drainTimeout ?? "10 seconds"))

    // The pooled path (internal/PooledJob.ts): decode, run, reply, measure, on the request's pool.
    const job = yield* makePooledJobs({ table, send, events, barrier })

    // ------------------------------------------------------------------ the fast path (internal/FastPath.ts)
    // The receive loop is a plain promise loop, as the send path is: a request whose row has a `fast` answer
    // (PING, NOOP, GET_CHUNK_SIZE) is answered right there when its pool would start it at once, or queued on
    // its busy pool straight from there (DESIGN §3.1: a PING still waits behind a saturated NORMAL pool), as
    // long as nothing received before it is still on its way to `onMessage` (so it never overtakes a connect
    // notification, or a SYNC op on the SYNC lane). Everything else goes, in arrival order, through `inbox` to
    // the receive fiber below, which runs `onMessage` (and serves a fast row the same way after its checks).
    const batch = makeMetricBatch(yield* Effect.context<never>())
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

    const drop = (peer: string, why: string): Effect.Effect<void> => {
      droppedMessages++
      return Metric.update(M.droppedMessagesTotal, 1).pipe(
        Effect.andThen(Effect.logWarning(`dropped a message that cannot be attributed: ${why}`).pipe(
          Effect.annotateLogs({ peer })
        ))
      )
    }

    // The connected peers, told by ROUTER_NOTIFY and confirmed by probes (internal/ConnectedPeers.ts).
    const connected = yield* makeConnectedPeers({
      probe: (routingId) => outbox.probe(routingId),
      events,
      forget: (peer) => {
        admission.forget(Buffer.from(peer, "hex"), peer)
        dispatcher.releasePeer(peer)
        outbox.forget(peer)
      },
      drop
    })

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
      // A lone empty frame: ROUTER_NOTIFY's connect or disconnect, or the peer's own (internal/ConnectedPeers.ts).
      if (frames.length === 1 && frames[0]!.length === 0) return connected.emptyFrame(routingId, peer)
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
      const share = poolSharePerPeer(capacity)
      const error = dispatcher.refusal(row.pool, peer) === "peer_full"
        ? new Overloaded({
          op: row.op.name,
          field: `${row.pool} pool (per connection)`,
          expected: `at most ${share} waiting from one connection`,
          message: `${row.op.name}: this connection already has ${share} requests waiting in the ${row.pool} pool (its share; others get their turns); read the replies and retry later`
        })
        : new Overloaded({
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
    // Received messages on their way to `onMessage`: one bounded FIFO per peer, handed on in turn
    // (internal/PeerQueues.ts, issue 27 item 1); `tickets` holds one entry per message queued there.
    const inbound = makePeerQueues<Inbound>()
    const tickets = yield* Queue.unbounded<void>()
    const shedTally = makeShedRequests()
    yield* Effect.forkScoped(shedTally.reportForever)
    let shedRequests = 0
    const services = yield* Effect.context<never>()
    let receiving = true
    const hand = (key: string, item: Inbound, bytes: number, always: boolean): boolean => {
      if (!inbound.push(key, item, bytes, always)) return false
      Queue.offerUnsafe(tickets, undefined)
      return true
    }
    // One error per op, made once: a flood is answered at the cost of its reply, not of building an error each time.
    const shedErrors = new Map<number, Overloaded>()
    const shedError = (opId: number, name: string): Overloaded => {
      let e = shedErrors.get(opId)
      if (e === undefined) {
        e = new Overloaded({
          op: name,
          field: "requests waiting from this peer",
          expected: `at most ${MAX_INBOUND_MESSAGES_PER_PEER} messages and ${MAX_INBOUND_BYTES_PER_PEER} bytes`,
          message: `${name}: this connection already has ${MAX_INBOUND_MESSAGES_PER_PEER} requests (or ${MAX_INBOUND_BYTES_PER_PEER} bytes) waiting to be handled; read the replies and retry later`
        })
        shedErrors.set(opId, e)
      }
      return e
    }
    /**
     * A request of a peer at its bound: answered `overloaded` unhandled (when attributable), counted, told once per
     * window. A peer whose replies already back up (it is not reading them) gets no answer built: it would wait
     * behind up to the outbox's 10,000 replies that peer does not read, and under a flood those unread errors were
     * most of what the server's garbage collector copied (issue 27 item 1; bench:ping --flood). It is counted as
     * an undeliverable reply (`BACKED_UP`) instead.
     */
    const shed = (received: Array<Buffer>): void => {
      const [routingId, uidFrame, opFrame] = received
      const opId = opFrame === undefined ? undefined : decodeHeaderInt(opFrame)
      const name = opId === undefined ? undefined : opById.get(opId)?.name
      if (routingId === undefined || uidFrame === undefined || name === undefined || decodeHeaderInt(uidFrame) === undefined) return
      shedRequests++
      M.shedRequestsTotal.updateUnsafe(1, services)
      const peer = routingId.toString("hex")
      if (outbox.isBackedUp(routingId)) {
        shedTally.record(peer, SHED_UNANSWERED)
        return send.dropUnbuilt(peer, BACKED_UP_CODE)
      }
      shedTally.record(peer, "waiting")
      send.replyErrorNow(routingId, uidFrame, opFrame!, shedError(opId!, name))
    }
    const brakedTally = makeBrakedRequests()
    yield* Effect.forkScoped(brakedTally.reportForever)
    const brake = makeReceiveBrake({ perSecond: BACKED_UP_MESSAGES_PER_SECOND, burst: BACKED_UP_BURST, nowMs: () => performance.now() })
    const receiveLoop = async (): Promise<void> => {
      let sinceYield = 0
      while (receiving) {
        let received: Array<Buffer>
        try {
          received = await router.receive()
        } catch (cause) {
          if (!receiving || router.closed) return
          hand(ERROR_KEY, { _tag: "error", cause }, 0, true)
          await new Promise((resolve) => setTimeout(resolve, 10))
          continue
        }
        if (!receiving) return
        let wait = 0
        try {
          const routingId = received[0]!
          const key = keyOf(routingId)
          const backedUp = outbox.isBackedUp(routingId)
          // A peer whose replies back up is the one slowed down: the loop waits before its next receive once such
          // peers have had their share (internal/ReceiveBrake.ts).
          if (backedUp) {
            wait = brake.charge()
            brakedTally.record(routingId.toString("hex"), "its replies back up")
            M.brakedMessagesTotal.updateUnsafe(1, services)
            if (wait > 0) M.receiveBrakeSecondsTotal.updateUnsafe(wait / 1000, services)
          }
          // The fast path only when nothing of this peer's is still on its way to `onMessage` (its order), and only
          // for a peer whose replies are not backing up: that one waits its turn with everyone else.
          const fast = inbound.pending(key) === 0 && !backedUp ? fastPath.rowOf(received) : undefined
          if (fast === undefined || !fastPath.serve(fast, received)) {
            // A lone empty frame (connect or disconnect notification) always gets in: a peer's end is never lost.
            const notification = received.length === 2 && received[1]!.length === 0
            // Counted as the outbox counts a reply: the frames after the routing id.
            if (!hand(key, { _tag: "message", received }, bytesOf(received), notification)) shed(received)
          }
        } catch {
          // Not reached (nothing above throws); kept so that a bug there cannot end the receive loop.
        }
        // libzmq hands over a backlog without waiting, so this loop would run on in microtasks and starve the
        // timers, the fibers (the receive fiber, the pools) and the HTTP server: it yields now and then.
        if (wait > 0) {
          sinceYield = 0
          await new Promise((resolve) => setTimeout(resolve, wait))
        } else if (++sinceYield >= RECEIVE_BATCH) {
          sinceYield = 0
          await yieldToEventLoop()
        }
      }
    }
    const receiveFiber = Queue.take(tickets).pipe(
      Effect.flatMap(() => {
        const next = inbound.next()
        if (next === undefined) return Effect.void
        const item = next.item
        return (item._tag === "message"
          ? onMessage(item.received)
          : Effect.logError("receive loop: recovering from an error", new ZmqError({ op: "receive", endpoint, cause: item.cause }))).pipe(
            Effect.catchCause((cause) => Effect.logError("receive loop: recovering from an error", cause)),
            Effect.ensuring(Effect.sync(() => inbound.done(next.key)))
          )
      }),
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
      listening: () => receiving && !router.closed,
      table: table.rows,
      isConnected: (peer: string) => connected.has(peer),
      stats: () => ({
        connectedPeers: connected.size(),
        routingIds: admission.stats(),
        connections: cap?.stats(),
        droppedMessages,
        undeliverableReplies: send.undeliverable(),
        refusedReplies: send.refused(),
        outbox: outbox.stats(),
        pools: dispatcher.stats(),
        fastPath: fastPath.stats(),
        inbound: { ...inbound.stats(), shed: shedRequests, brake: brake.stats() }
      })
    }
  })
