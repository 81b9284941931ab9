/**
 * ZeroMQ sockets as scoped resources (DESIGN §2: sockets are acquired with
 * acquireRelease inside Layers). Raw socket options live here and nowhere
 * else; see shared/zeromq-notes.md for the measured behaviour behind each.
 */
import { randomBytes } from "node:crypto"
import { chmodSync, chownSync, rmSync } from "node:fs"
import { Effect, Layer, Scope } from "effect"
import * as zmq from "zeromq"
import { seedLibzmqRandom } from "../native/ProcessLimits.ts"
import { generatedCounterOf } from "../services/zmq/RoutingIds.ts"
import {
  type BoundRouter,
  DEFAULT_RECEIVE_HIGH_WATER_MARK,
  type DealerOptions,
  type HandshakeFailure,
  type PublisherOptions,
  type RouterOptions,
  type ZapReply,
  type ZapRequest,
  unsafeIpcDirectory,
  ZmqError,
  ZmqSockets
} from "../services/zmq/Sockets.ts"

/** libzmq's ZMQ_ROUTER_NOTIFY (draft option 97): 1 = connect, 2 = disconnect. */
const ZMQ_ROUTER_NOTIFY = 97

/** Turns on connect/disconnect notifications; zeromq.js keeps the setter protected, so one narrow cast here. */
const setRouterNotify = (router: zmq.Router): void => {
  ;(router as unknown as { setInt32Option(option: number, value: number): void }).setInt32Option(ZMQ_ROUTER_NOTIFY, 3)
}

/** libzmq's ZMQ_ZAP_ENFORCE_DOMAIN (draft option 93): without a ZAP handler, no handshake succeeds (fail closed). */
const ZMQ_ZAP_ENFORCE_DOMAIN = 93

/** Binds of the ZAP address tried 20 ms apart while a closed handler still holds it (one second in all). */
const ZAP_BIND_ATTEMPTS = 50

/** Where libzmq sends ZAP requests (RFC 27). */
export const ZAP_ENDPOINT = "inproc://zeromq.zap.01"

const setInt32 = (socket: zmq.Socket, option: number, value: number): void => {
  ;(socket as unknown as { setInt32Option(option: number, value: number): void }).setInt32Option(option, value)
}

/** ZMQ_HANDSHAKE_IVL of the server's ROUTER, ms (issue 24 item 11): a CURVE handshake on loopback takes milliseconds. */
export const HANDSHAKE_INTERVAL_MS = 10_000

/** libzmq's ZMQ_ROUTING_ID (5) and ZMQ_EVENTS (15). */
const ZMQ_ROUTING_ID = 5
const ZMQ_EVENTS = 15

/**
 * Sets a socket's own routing id to any bytes (zeromq.js types `routingId` as a string and keeps the Buffer setter
 * protected: one narrow cast here). Used by the kick, and by tests that play a peer choosing its id.
 */
export const setRoutingId = (socket: zmq.Socket, routingId: Uint8Array): void => {
  ;(socket as unknown as { setStringOption(option: number, value: Buffer): void }).setStringOption(ZMQ_ROUTING_ID, Buffer.from(routingId))
}

/**
 * Makes the ROUTER process its pending commands now (attach a new pipe, identify its peer): libzmq does it in
 * getsockopt(ZMQ_EVENTS), among others. zeromq.js keeps the getter protected: one narrow cast here.
 */
const processCommands = (socket: zmq.Socket): void => {
  ;(socket as unknown as { getInt32Option(option: number): number }).getInt32Option(ZMQ_EVENTS)
}

let seeded = false
/**
 * Seeds libc's rand() once per process before the first ROUTER exists: libzmq takes each ROUTER's first generated
 * routing id from it and never seeds it itself (src/native/addon/limits.cc; issue 24 item 1).
 */
const seedRoutingIdsOnce = (): void => {
  if (seeded) return
  seedLibzmqRandom()
  seeded = true
}

/** The in-process probe and kick of a bound ROUTER (see BoundRouter). */
const routerControls = (router: zmq.Router, inproc: string): Pick<BoundRouter, "openProbe" | "kick"> => ({
  openProbe: (marker) => {
    const dealer = new zmq.Dealer({ linger: 0 })
    dealer.connect(inproc)
    // An inproc DEALER connected to a bound ROUTER has its pipe at once: the send never waits.
    void dealer.send(marker).catch(() => undefined)
    return { close: () => dealer.close() }
  },
  kick: (routingId) => {
    const dealer = new zmq.Dealer({ linger: 0 })
    setRoutingId(dealer, routingId)
    router.handover = true
    try {
      // The connect queues the pipe (with the id) to the ROUTER; processCommands identifies it while handover is
      // on, terminating the holder's pipe. Nothing else runs between the two on this thread.
      dealer.connect(inproc)
      processCommands(router)
    } finally {
      router.handover = false
      dealer.close()
    }
  }
})

/** The monitor event types of a failed handshake, by reason. */
const HANDSHAKE_FAILURES: ReadonlyMap<string, HandshakeFailure["reason"]> = new Map([
  ["handshake:error:auth", "auth"],
  ["handshake:error:protocol", "protocol"],
  ["handshake:error:other", "protocol"]
])

/** The HandshakeFailure of a monitor event, or undefined when it is no failed handshake. */
const handshakeFailureOf = (event: zmq.Event): HandshakeFailure | undefined => {
  const reason = HANDSHAKE_FAILURES.get(event.type)
  if (reason === undefined) return undefined
  const error = "error" in event ? event.error as unknown as { readonly code?: unknown; readonly status?: unknown } | undefined : undefined
  const code = error?.code === undefined ? "" : String(error.code)
  const address = "address" in event ? event.address : ""
  return {
    reason: code === "ERR_ZMTP_MECHANISM_MISMATCH" ? "mechanism" : reason,
    address,
    code,
    ...(typeof error?.status === "number" ? { status: error.status } : {})
  }
}

/** Reads a socket's monitor events until the socket closes, telling `onEvent` of each. */
const watchEvents = (events: zmq.Observer, onEvent: (event: zmq.Event) => Effect.Effect<void>) =>
  Effect.tryPromise(() => events.receive()).pipe(Effect.flatMap(onEvent), Effect.forever, Effect.ignore)

/**
 * Reads a socket's monitor events until the socket closes, telling
 * `onEvent` of each handshake: its failure, or undefined when it succeeded.
 */
const watchHandshakes = (
  events: zmq.Observer,
  onEvent: (failure: HandshakeFailure | undefined) => Effect.Effect<void>
) =>
  watchEvents(events, (event) => {
    if (event.type === "handshake") return onEvent(undefined)
    const failure = handshakeFailureOf(event)
    return failure === undefined ? Effect.void : onEvent(failure)
  })

/**
 * Binds a ROUTER to `endpoint` for the life of the current Scope. Replies are
 * `mandatory` with a zero send timeout, so a reply to a vanished peer or one
 * over its high-water mark fails at once (counted, logged at DEBUG) instead
 * of blocking the one send path. ZMTP heartbeats stay off (DESIGN §5).
 *
 * With `curve`, the ROUTER is a CURVE server whose handshakes go to the ZAP
 * handler (bind it first, `serveZap`), enforced: no handler, no handshake.
 * An `ipc://` socket file gets `ipcMode` (0600) and `ipcGroupId` right after
 * bind; its directory must be safe ({@link unsafeIpcDirectory}).
 *
 * Fails with `ZmqError` (op "bind") when the endpoint is taken or invalid,
 * or its ipc directory is unsafe.
 */
export const bindRouter = (
  endpoint: string,
  options: RouterOptions
): Effect.Effect<BoundRouter, ZmqError, Scope.Scope> =>
  Effect.acquireRelease(
    Effect.tryPromise({
      try: async () => {
        const unsafe = unsafeIpcDirectory(endpoint)
        if (unsafe !== undefined) throw new Error(unsafe)
        seedRoutingIdsOnce()
        const router = new zmq.Router({
          linger: options.lingerMs,
          // A connection that has not finished its ZMTP handshake within this long is closed (libzmq's default is
          // 30 s): idle connections that never speak hold a descriptor and a slot of the cap for at most this long.
          handshakeInterval: HANDSHAKE_INTERVAL_MS,
          mandatory: true,
          sendTimeout: 0,
          sendHighWaterMark: options.sendHighWaterMark,
          receiveHighWaterMark: Math.max(1, options.receiveHighWaterMark ?? DEFAULT_RECEIVE_HIGH_WATER_MARK),
          ...(options.curve === undefined
            ? {}
            : { curveServer: true, curveSecretKey: options.curve.secretKey, zapDomain: options.curve.zapDomain })
        })
        setRouterNotify(router)
        if (options.curve !== undefined) setInt32(router, ZMQ_ZAP_ENFORCE_DOMAIN, 1)
        const ipcPath = endpoint.startsWith("ipc://") ? endpoint.slice("ipc://".length) : undefined
        // The socket file is created by libzmq under the process umask: make it 0600 from the start.
        const umask = ipcPath === undefined ? undefined : process.umask(0o177)
        let firstGeneratedId: number | undefined
        const inproc = `inproc://mpcache-router-${randomBytes(16).toString("hex")}`
        let controls: Pick<BoundRouter, "openProbe" | "kick"> | undefined
        try {
          // The probe endpoint first, and the first probe before the real endpoint is bound: no peer can connect
          // before the ROUTER's counter is known.
          await router.bind(inproc)
          controls = routerControls(router, inproc)
          const marker = randomBytes(16)
          const probe = controls.openProbe(marker)
          try {
            const [id, frame] = await router.receive()
            firstGeneratedId = id === undefined || frame === undefined || !frame.equals(marker) ? undefined : generatedCounterOf(id)
          } finally {
            probe.close()
          }
          if (firstGeneratedId === undefined) throw new Error("the ROUTER did not generate a zero-prefixed 5-byte routing id for its probe (libzmq changed how it assigns routing ids: the routing-id guard needs review)")
          await router.bind(endpoint)
          if (ipcPath !== undefined) {
            if (options.ipcGroupId !== undefined) chownSync(ipcPath, -1, options.ipcGroupId)
            chmodSync(ipcPath, options.ipcMode ?? 0o600)
          }
        } catch (e) {
          router.close()
          throw e
        } finally {
          if (umask !== undefined) process.umask(umask)
        }
        return { socket: router, firstGeneratedId, ...controls } satisfies BoundRouter
      },
      catch: (cause) => new ZmqError({ op: "bind", endpoint, cause })
    }),
    ({ socket: router }) =>
      Effect.sync(() => {
        router.close()
        // libzmq may leave the socket file of an ipc endpoint behind when the process exits right after close.
        if (endpoint.startsWith("ipc://")) rmSync(endpoint.slice("ipc://".length), { force: true })
      })
  ).pipe(
    Effect.tap(({ socket: router }) =>
      options.onHandshakeFailure === undefined && options.onConnectionEvent === undefined ? Effect.void : Effect.forkScoped(
        watchEvents(router.events, (event) => {
          if (options.onConnectionEvent !== undefined && (event.type === "accept" || event.type === "disconnect")) {
            return options.onConnectionEvent(event.type === "accept" ? "accepted" : "ended")
          }
          const failure = options.onHandshakeFailure === undefined ? undefined : handshakeFailureOf(event)
          return failure === undefined ? Effect.void : options.onHandshakeFailure!(failure)
        })
      )
    )
  )

/**
 * Binds a PUB to `endpoint` for the life of the current Scope (`ZmqSockets.bindPublisher`): linger 0 (what no
 * subscriber took at shutdown is not worth waiting for: the replay buffer goes with it), an ipc socket file 0600
 * from the start, CURVE with ZAP enforced when asked. Fails with `ZmqError` (op "bind").
 */
export const bindPublisher = (endpoint: string, options: PublisherOptions): Effect.Effect<zmq.Publisher, ZmqError, Scope.Scope> =>
  Effect.acquireRelease(
    Effect.tryPromise({
      try: async () => {
        const unsafe = unsafeIpcDirectory(endpoint)
        if (unsafe !== undefined) throw new Error(unsafe)
        const pub = new zmq.Publisher({
          linger: 0,
          sendHighWaterMark: options.sendHighWaterMark,
          ...(options.curve === undefined
            ? {}
            : { curveServer: true, curveSecretKey: options.curve.secretKey, zapDomain: options.curve.zapDomain })
        })
        if (options.curve !== undefined) setInt32(pub, ZMQ_ZAP_ENFORCE_DOMAIN, 1)
        const ipcPath = endpoint.startsWith("ipc://") ? endpoint.slice("ipc://".length) : undefined
        const umask = ipcPath === undefined ? undefined : process.umask(0o177)
        try {
          await pub.bind(endpoint)
          if (ipcPath !== undefined) chmodSync(ipcPath, 0o600)
        } catch (e) {
          pub.close()
          throw e
        } finally {
          if (umask !== undefined) process.umask(umask)
        }
        return pub
      },
      catch: (cause) => new ZmqError({ op: "bind", endpoint, cause })
    }),
    (pub) =>
      Effect.sync(() => {
        pub.close()
        if (endpoint.startsWith("ipc://")) rmSync(endpoint.slice("ipc://".length), { force: true })
      })
  ).pipe(
    Effect.tap((pub) =>
      options.onConnectionEvent === undefined ? Effect.void : Effect.forkScoped(
        watchEvents(pub.events, (event) =>
          event.type === "accept" || event.type === "disconnect"
            ? options.onConnectionEvent!(event.type === "accept" ? "accepted" : "ended")
            : Effect.void)
      )
    )
  )

/**
 * Connects a DEALER to `endpoint` for the life of the current Scope. The
 * ROUTER assigns the routing id (zeromq-notes: never set it ourselves).
 * With `onHandshake`, the socket's monitor is opened before the connect (so
 * the first handshake is seen) and read by a fiber of the Scope.
 * Fails with `ZmqError` (op "connect") on a malformed endpoint; an
 * unreachable server is not an error here (ZeroMQ reconnects by itself).
 */
export const connectDealer = (
  endpoint: string,
  options: DealerOptions
): Effect.Effect<zmq.Dealer, ZmqError, Scope.Scope> =>
  Effect.acquireRelease(
    Effect.try({
      try: () => {
        const dealer = new zmq.Dealer({
          linger: options.lingerMs,
          connectTimeout: options.connectTimeoutMs,
          reconnectInterval: options.reconnectIntervalMs,
          reconnectMaxInterval: options.reconnectMaxIntervalMs,
          sendHighWaterMark: 0,
          receiveHighWaterMark: 0,
          ...(options.curve === undefined ? {} : {
            curveServerKey: options.curve.serverPublicKey,
            curveSecretKey: options.curve.secretKey,
            curvePublicKey: options.curve.publicKey
          })
        })
        // The observer is created on first access; libzmq reports no event from before it exists.
        const events = options.onHandshake === undefined ? undefined : dealer.events
        try {
          dealer.connect(endpoint)
        } catch (e) {
          dealer.close()
          throw e
        }
        return { dealer, events }
      },
      catch: (cause) => new ZmqError({ op: "connect", endpoint, cause })
    }),
    ({ dealer }) => Effect.sync(() => dealer.close())
  ).pipe(
    Effect.tap(({ events }) =>
      events === undefined || options.onHandshake === undefined
        ? Effect.void
        : Effect.forkScoped(watchHandshakes(events, options.onHandshake))
    ),
    Effect.map(({ dealer }) => dealer)
  )

/** `ZmqSockets.sendWithin`: ZMQ_SNDTIMEO set to the caller's bound right before the send (sends are serialized by the caller). */
export const sendWithin = (
  dealer: zmq.Dealer,
  frames: ReadonlyArray<Buffer>,
  timeoutMs: number
): Effect.Effect<boolean, ZmqError> =>
  Effect.uninterruptible(Effect.tryPromise({
    try: async () => {
      dealer.sendTimeout = Math.max(1, Math.ceil(timeoutMs))
      try {
        await dealer.send([...frames])
        return true
      } catch (e) {
        if (typeof e === "object" && e !== null && "code" in e && e.code === "EAGAIN" && !dealer.closed) return false
        throw e
      }
    },
    catch: (cause) => new ZmqError({ op: "send", endpoint: endpointOf(dealer), cause })
  }))

/** The endpoint a DEALER connected to, for errors; a closed socket no longer says (reading it throws ENOTSOCK). */
const endpointOf = (dealer: zmq.Dealer): string => {
  if (dealer.closed) return "(a closed socket)"
  return dealer.lastEndpoint ?? ""
}

/** A ZAP/1.0 request's frames after the routing id and delimiter; undefined when malformed. */
const parseZapRequest = (frames: ReadonlyArray<Buffer>): ZapRequest | undefined => {
  const [version, requestId, domain, address, identity, mechanism, ...credentials] = frames
  if (mechanism === undefined) return undefined
  return {
    version: version!.toString(),
    requestId: requestId!,
    domain: domain!.toString(),
    address: address!.toString(),
    identity: identity!,
    mechanism: mechanism.toString(),
    credentials
  }
}

/**
 * The ZAP handler socket (RFC 27): a ROUTER at `inproc://zeromq.zap.01` in
 * the default context, for the life of the Scope, answering every request
 * with `authenticate`'s reply; a malformed request or another version is
 * answered "400". Bind it before the ROUTER it serves; its Scope must
 * outlive that ROUTER's. Fails with `ZmqError` (op "bind") when another
 * handler holds the address for more than a second (one per process).
 */
export const serveZap = (
  authenticate: (request: ZapRequest) => Effect.Effect<ZapReply>
): Effect.Effect<void, ZmqError, Scope.Scope> =>
  Effect.gen(function*() {
    const socket = yield* Effect.acquireRelease(
      Effect.tryPromise({
        try: async () => {
          // libzmq frees an inproc address only when its closed socket is reaped, a moment after close: a
          // handler started right after another in the same process (a server restarted in-process) retries.
          // Unbinding before close instead trips a libzmq assertion while a CURVE session's ZAP pipe is open.
          seedRoutingIdsOnce()
          for (let attempt = 1; ; attempt++) {
            const zap = new zmq.Router({ linger: 0 })
            try {
              await zap.bind(ZAP_ENDPOINT)
              return zap
            } catch (e) {
              zap.close()
              const inUse = typeof e === "object" && e !== null && "code" in e && e.code === "EADDRINUSE"
              if (!inUse || attempt >= ZAP_BIND_ATTEMPTS) throw e
              await new Promise((resolve) => setTimeout(resolve, 20))
            }
          }
        },
        catch: (cause) => new ZmqError({ op: "bind", endpoint: ZAP_ENDPOINT, cause })
      }),
      (zap) => Effect.sync(() => zap.close())
    )
    const answer = (frames: Array<Buffer>) => {
      const [routingId, delimiter, ...rest] = frames
      if (routingId === undefined || delimiter === undefined) return Effect.void
      const request = parseZapRequest(rest)
      const decided: Effect.Effect<ZapReply> = request === undefined || request.version !== "1.0"
        ? Effect.succeed({ statusCode: "400", statusText: "malformed ZAP request", userId: "" })
        : authenticate(request)
      return decided.pipe(
        Effect.flatMap((reply) =>
          Effect.tryPromise(() =>
            socket.send([routingId, delimiter, "1.0", rest[1] ?? "", reply.statusCode, reply.statusText, reply.userId, ""])
          )
        ),
        Effect.ignore
      )
    }
    yield* Effect.tryPromise(() => socket.receive()).pipe(
      Effect.flatMap(answer),
      Effect.forever,
      Effect.ignore,
      Effect.forkScoped
    )
  })

/** The `ZmqSockets` service over the acquirers above. */
export const ZmqSocketsLive: Layer.Layer<ZmqSockets> = Layer.succeed(ZmqSockets, ZmqSockets.of({ bindRouter, connectDealer, sendWithin, bindPublisher, serveZap }))
