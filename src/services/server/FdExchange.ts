/**
 * The descriptor socket (issue 13 item 2, docs/memfd.md): workers hand their
 * KV memory over as memfd descriptors instead of naming it, so the server
 * maps exactly the memory the registering process holds.
 *
 * - **GET_SERVER_INFO** (op 67) answers the socket's path, the protocol
 *   version, the features on, and this connection's `fd_nonce`.
 * - **The socket** (`--fd-socket`; mode 0600, or `@name`): one request per
 *   connection, a framed MessagePack map `{version: 1, nonce, instance_id,
 *   fds}` with the descriptors in SCM_RIGHTS. Each descriptor must be a
 *   read-write memfd (a file that takes seals) not sealed against writes;
 *   with `--require-sealed-memfd` also sealed with F_SEAL_SHRINK and
 *   F_SEAL_SEAL. A path's mode is its access check (0600; 0660 and the
 *   group with --ipc-group); on an abstract socket, which has no mode, the
 *   sender must run as the server's uid or root. The reply names a one-time token
 *   (TokenTable.ts), or the error.
 * - **REGISTER** of `cpu_memfd` descriptors claims the token
 *   ({@link FdExchange.claim}): the mappings are made from the passed
 *   descriptors, which are then closed; a token not claimed within
 *   `--fd-token-ttl-seconds` has its descriptors closed by the sweep, and a
 *   ZeroMQ connection that closes revokes its nonce and tokens.
 *
 * Every received descriptor is closed on every path: refused requests at
 * once, claimed ones after mapping, expired or revoked ones by the sweep or
 * the disconnect, pending ones at shutdown (the listener's scope).
 *
 * Attacks from the same node (issue 24, docs/security.md items 2, 8, 9, 11):
 *
 * - **Another uid** on an abstract socket is refused at accept, before
 *   anything is read (src/native/addon/fdlisten.cc): none of its
 *   descriptors enters the table, it holds no slot.
 * - **A descriptor whose close blocks** (a lingering TCP socket, a socket
 *   queueing others) never reaches JS: only memfds do, and a memfd's close
 *   never waits; the addon lets go of the rest without waiting
 *   (src/native/addon/fdrelease.h).
 * - **More descriptors than promised**: at most 64 per request on what
 *   recvmsg delivers; tokens hold at most `--max-passed-descriptors` in all
 *   and `--max-passed-descriptors-per-peer` per ZeroMQ connection (over
 *   either: `overloaded` naming the flag); the listener reads only while
 *   the server holds fewer than the first + 64; a token's deadline is fixed
 *   at issue (TokenTable.ts).
 * - **Slots**: `--fd-socket-max-connections` in all and
 *   `--fd-socket-max-connections-per-uid` per uid, the 5 s deadline from
 *   accept. Every refusal is counted in
 *   `mpcache_fd_socket_refusals_total{reason}` and `/api/status`
 *   `fd_socket.refusals`, and logged at WARNING once per 10 s per reason.
 */
import { Clock, Context, Duration, Effect, Layer, Metric, Queue } from "effect"
import type { Scope } from "effect"
import { randomBytes } from "node:crypto"
import {
  closePassed,
  F_SEAL,
  type FdListener,
  type FdListenerStats,
  type FdRefusalReason,
  type FdRequest,
  listenFds,
  sealNames
} from "../../native/FdPassing.ts"
import { pack, unpack } from "../../schema/Frame.ts"
import { describeValue } from "../../schema/ValueDescription.ts"
import { formatInstanceId, type InstanceId } from "../../schema/InstanceId.ts"
import { GetServerInfo } from "../../schema/Op.ts"
import { InvalidArgument } from "../../schema/WireError.ts"
import { PROTOCOL_VERSION } from "../../version.ts"
import { row, type RequestContext, type ServerModule } from "./Handler.ts"
import { makeTokenTable, type PendingToken, TOKEN_BYTES } from "./internal/TokenTable.ts"
import { makeWarnWindow } from "./internal/WarnWindow.ts"
import { defaultFdSocket, ServerConfig, type ServerConfigInput } from "./ServerConfig.ts"

/** One passed descriptor as the server checked it: bytes (st_size), F_SEAL_* bits, "<dev>:<ino>". */
export interface PassedFd {
  readonly fd: number
  readonly size: number
  readonly seals: number
  readonly identity: string
}

/** What a claimed token hands REGISTER: the sender's credentials and its descriptors (closed with the claim's scope). */
export interface ClaimedFds {
  readonly hex: string
  readonly pid: number
  readonly uid: number
  readonly gid: number
  readonly fds: ReadonlyArray<PassedFd>
}

/** The version of the descriptor request's map (docs/memfd.md). */
export const FD_REQUEST_VERSION = 1

/**
 * Why the descriptor socket refused: at the connection (the listener's
 * counters, before any request reached JS) or the request (its checks).
 * The `reason` of `mpcache_fd_socket_refusals_total`.
 */
export type FdSocketRefusal =
  | FdRefusalReason
  | "passed_descriptors"
  | "passed_descriptors_per_peer"
  | "invalid"
  | "forbidden"
  | "internal"

const refusalsTotal = Metric.counter("mpcache_fd_socket_refusals_total", {
  description:
    "Descriptor-socket refusals: uid (another uid on an abstract socket), connections / connections_per_uid (slot caps), deadline (not complete 5 s after accept), passed_descriptors / passed_descriptors_per_peer (token caps), invalid, forbidden, internal (a request's checks)",
  incremental: true
})
const refusalMetric = (reason: FdSocketRefusal) => Metric.withAttributes(refusalsTotal, { reason })

/** One WARNING per refusal reason and window (issue 24 item 11). */
const WARN_WINDOW_MS = 10_000

/** The request deadline of the listener (src/native/addon/fdpass.h kRequestDeadlineMs), for messages. */
const REQUEST_DEADLINE_SECONDS = 5

/**
 * The descriptor socket service. Its layer fails with NativeError when an
 * explicit `--fd-socket` cannot be listened on (EADDRINUSE: a live server or
 * a non-socket file holds it; ENOENT: no such folder …); the default place
 * only turns cpu_memfd off.
 */
export class FdExchange extends Context.Service<FdExchange, {
  /** The socket's path ("@name": abstract); undefined when off (`--fd-socket off`, or the default failed). */
  readonly socketPath: string | undefined
  /**
   * Scoped: claims `token` for REGISTER `op` of `id` on connection `peer`
   * (TokenTable.ts's rules); the descriptors are closed when the scope
   * closes. InvalidArgument naming `field` when the token is unknown, used,
   * expired, another connection's or another instance's, or memfd is off.
   */
  readonly claim: (
    op: string,
    id: InstanceId,
    peer: string,
    field: string,
    token: Uint8Array
  ) => Effect.Effect<ClaimedFds, InvalidArgument, Scope.Scope>
  /** A ZeroMQ connection closed: its nonce and pending tokens go (descriptors closed). */
  readonly disconnected: (peer: string) => Effect.Effect<void>
  /** GET_SERVER_INFO, and the `fd_socket` block of /api/status. */
  readonly module: ServerModule
}>()("mpcache/services/server/FdExchange") {
  static readonly layer = Layer.effect(this, Effect.suspend(() => make))
  /**
   * For tests: the real exchange (a real listening socket where `overrides`
   * turn `--fd-socket` on) over `ServerConfig.layerTest(overrides)`, which it
   * also provides.
   */
  static readonly layerTest = (overrides: Partial<ServerConfigInput> = {}) =>
    this.layer.pipe(Layer.provideMerge(ServerConfig.layerTest(overrides)))
}

/** The reply map of a refused request; `field`: the flag an `overloaded` names. */
const refusal = (code: "invalid_argument" | "forbidden" | "overloaded" | "internal", message: string, field?: string) =>
  field === undefined ? { ok: false, code, message } : { ok: false, code, message, field }

/** The refusal metric's reason of a refused request's reply. */
const requestReason = (answer: Record<string, unknown>): FdSocketRefusal =>
  answer["field"] === "max-passed-descriptors"
    ? "passed_descriptors"
    : answer["field"] === "max-passed-descriptors-per-peer"
    ? "passed_descriptors_per_peer"
    : answer["code"] === "forbidden"
    ? "forbidden"
    : answer["code"] === "internal"
    ? "internal"
    : "invalid"

const noRefusals: Readonly<Record<FdRefusalReason, number>> = { uid: 0, connections: 0, connections_per_uid: 0, deadline: 0 }

const make = Effect.gen(function*() {
  const config = yield* ServerConfig
  const caps = config.descriptors
  const ttlMs = config.fdTokenTtlSeconds * 1000
  const table = makeTokenTable<ReadonlyArray<PassedFd>>({
    ttlMs,
    maxHeld: caps.passedDescriptors,
    maxHeldPerPeer: caps.passedDescriptorsPerPeer,
    weight: (fds) => fds.length,
    maxRemembered: 4096
  })
  /** peer → its nonce (hex), and back. */
  const nonceOf = new Map<string, string>()
  const peerOf = new Map<string, string>()
  /** The listener, once listening: passed memfds are closed through it (its count of held descriptors). */
  let listener: FdListener | undefined
  const closeAll = (fds: ReadonlyArray<{ readonly fd: number }>) =>
    Effect.suspend(() => listener === undefined ? Effect.void : Effect.forEach(fds, (f) => closePassed(listener!, f.fd), { discard: true }))
  const closeTokens = (tokens: ReadonlyArray<PendingToken<ReadonlyArray<PassedFd>>>) =>
    Effect.forEach(tokens, (t) => closeAll(t.value), { discard: true })

  // Pending tokens' descriptors are closed at shutdown (after the listener's release, registered after this).
  yield* Effect.addFinalizer(() => Effect.suspend(() => closeTokens(table.drain())))

  const explicit = config.fdSocket
  const path = explicit === "off" ? undefined : explicit ?? defaultFdSocket(config.endpoint)
  const euid = process.geteuid?.() ?? 0
  const abstract = path?.startsWith("@") === true
  // The refusals the listener answers at accept or at the deadline, before any request reaches JS.
  const connectionRefusals: Readonly<Record<FdRefusalReason, Uint8Array>> = {
    uid: pack(refusal(
      "forbidden",
      `descriptor request: the sender runs as another uid; this server (abstract socket ${path ?? ""}, which has no file mode) takes descriptors from uid ${euid} or root only`
    )),
    connections: pack(refusal(
      "overloaded",
      `descriptor socket: ${caps.fdSocketConnections} connections are open, the most it takes (--fd-socket-max-connections ${caps.fdSocketConnections}); retry later`,
      "fd-socket-max-connections"
    )),
    connections_per_uid: pack(refusal(
      "overloaded",
      `descriptor socket: this uid has ${caps.fdSocketConnectionsPerUid} connections open, the most one uid may (--fd-socket-max-connections-per-uid ${caps.fdSocketConnectionsPerUid}); retry later`,
      "fd-socket-max-connections-per-uid"
    )),
    deadline: pack(refusal(
      "invalid_argument",
      `descriptor request: not complete within ${REQUEST_DEADLINE_SECONDS} s of the connect; send the whole framed request, its descriptors on its first bytes, at once`
    ))
  }
  // The socket file's mode is the access check of a path (0600, or 0660 for --ipc-group like the ipc endpoint);
  // an abstract socket has none, so there the listener checks the sender's uid at accept.
  const listening = path === undefined ? undefined : yield* listenFds(path, {
    maxConnections: caps.fdSocketConnections,
    maxConnectionsPerUid: caps.fdSocketConnectionsPerUid,
    maxPassedDescriptors: caps.passedDescriptors,
    allowedUid: abstract ? euid : -1,
    ...(config.ipcGroupId === undefined ? {} : { groupId: config.ipcGroupId }),
    refusals: connectionRefusals
  }).pipe(
    Effect.tap(() => Effect.logInfo(`descriptor socket (cpu_memfd) on ${path}`)),
    // The default location may be unusable (no /run access): memfd is then off, the server serves on.
    Effect.catch((e) =>
      explicit === undefined
        ? Effect.as(Effect.logWarning(`cpu_memfd off: cannot listen on the default descriptor socket ${path}: ${e.message}; pass --fd-socket`), undefined)
        : Effect.fail(e)
    )
  )

  listener = listening?.listener

  const decide = (req: FdRequest, nowMs: number): Record<string, unknown> => {
    if (req.error !== "") return refusal("invalid_argument", `descriptor request: ${req.error}`)
    // The sender's uid was checked at accept (an abstract socket: the server's uid or root); a path's mode did it.
    const decoded = unpack(req.payload)?.value as Record<string, unknown> | undefined
    if (decoded === undefined || typeof decoded !== "object" || decoded === null || Array.isArray(decoded)) {
      return refusal("invalid_argument", "descriptor request: the payload is not one MessagePack map {version, nonce, instance_id, fds}")
    }
    const { version, nonce, instance_id, fds } = decoded
    if (version !== FD_REQUEST_VERSION) {
      return refusal("invalid_argument", `descriptor request: version must be ${FD_REQUEST_VERSION}, got ${describeValue(version)}`)
    }
    if (!(nonce instanceof Uint8Array) || nonce.length !== TOKEN_BYTES) {
      return refusal("invalid_argument", `descriptor request: nonce must be the ${TOKEN_BYTES}-byte fd_nonce of GET_SERVER_INFO (bin)`)
    }
    const peer = peerOf.get(Buffer.from(nonce).toString("hex"))
    if (peer === undefined) {
      return refusal(
        "forbidden",
        "descriptor request: the nonce is not one this server gave a live connection; ask GET_SERVER_INFO on the ZeroMQ connection that will REGISTER and send its fd_nonce"
      )
    }
    const id = typeof instance_id === "bigint" ? instance_id : typeof instance_id === "number" && Number.isSafeInteger(instance_id) ? BigInt(instance_id) : undefined
    if (id === undefined || id < 0n || id >= 1n << 63n) {
      return refusal("invalid_argument", `descriptor request: instance_id must be an int in [0, 2^63-1], got ${describeValue(instance_id)}`)
    }
    if (fds !== req.fds.length || req.fds.length === 0) {
      return refusal(
        "invalid_argument",
        `descriptor request: fds says ${describeValue(fds)} but ${req.fds.length} descriptor(s) came in SCM_RIGHTS; expected at least one, and as many as declared`
      )
    }
    for (const [i, f] of req.fds.entries()) {
      // fd -1: not a memfd, let go of by the addon already (it never reaches JS: issue 24 item 2).
      if (f.fd < 0 || !f.regular || f.seals < 0 || f.access !== "rw") {
        return refusal("invalid_argument", `descriptor request: descriptor ${i} is not a read-write memfd (a ${f.kind}, access ${f.access}, seals ${f.seals < 0 ? "unsupported" : f.seals}); expected memfd_create(…, MFD_ALLOW_SEALING) memory`)
      }
      if ((f.seals & (F_SEAL.write | F_SEAL.futureWrite)) !== 0) {
        return refusal("invalid_argument", `descriptor request: descriptor ${i} is sealed against writes (${sealNames(f.seals).join(", ")}); RETRIEVE writes into it`)
      }
      const needed = F_SEAL.shrink | F_SEAL.seal
      if (config.requireSealedMemfd && (f.seals & needed) !== needed) {
        return refusal(
          "invalid_argument",
          `descriptor request: descriptor ${i} is not sealed (seals: ${sealNames(f.seals).join(", ") || "none"}); this server requires F_SEAL_SHRINK and F_SEAL_SEAL (--require-sealed-memfd)`
        )
      }
    }
    const issued = table.issue({
      peer,
      instanceId: id,
      pid: req.pid,
      uid: req.uid,
      gid: req.gid,
      value: req.fds.map((f) => ({ fd: f.fd, size: f.size, seals: f.seals, identity: f.identity }))
    }, nowMs)
    if (issued._tag === "Refused") {
      return issued.reason === "total"
        ? refusal(
          "overloaded",
          `descriptor request: the server holds ${issued.held} passed descriptors for tokens not yet registered; ${req.fds.length} more would pass --max-passed-descriptors ${issued.cap}; register or retry later`,
          "max-passed-descriptors"
        )
        : refusal(
          "overloaded",
          `descriptor request: this ZeroMQ connection's tokens hold ${issued.held} passed descriptors not yet registered; ${req.fds.length} more would pass --max-passed-descriptors-per-peer ${issued.cap}; register what it passed or retry later`,
          "max-passed-descriptors-per-peer"
        )
    }
    return { ok: true, token: issued.token, expires_in_ms: ttlMs, fds: req.fds.map((f) => ({ size: f.size, seals: f.seals })) }
  }

  const warnings = makeWarnWindow(WARN_WINDOW_MS)
  /** Counts and logs `n` refusals of `reason` (one WARNING line per reason per window). */
  const refused = (reason: FdSocketRefusal, n: number, detail: string) =>
    Metric.update(refusalMetric(reason), n).pipe(
      Effect.andThen(warnings.warn(reason, `descriptor socket: refused ${detail}`, n, { reason }))
    )
  const connectionDetail: Record<FdRefusalReason, string> = {
    uid: `a connection of another uid than ${euid} or root (abstract socket ${path ?? ""})`,
    connections: `a connection: ${caps.fdSocketConnections} open (--fd-socket-max-connections)`,
    connections_per_uid: `a connection: its uid has ${caps.fdSocketConnectionsPerUid} open (--fd-socket-max-connections-per-uid)`,
    deadline: `a connection whose request was not complete ${REQUEST_DEADLINE_SECONDS} s after accept`
  }
  /** The listener's refusals counted so far (its counters only grow). */
  let seen = noRefusals
  const takeConnectionRefusals = (stats: FdListenerStats) =>
    Effect.forEach(Object.keys(noRefusals) as ReadonlyArray<FdRefusalReason>, (reason) => {
      const n = stats.refusals[reason] - seen[reason]
      return n > 0 ? refused(reason, n, n === 1 ? connectionDetail[reason] : `${n}× ${connectionDetail[reason]}`) : Effect.void
    }, { discard: true }).pipe(Effect.andThen(Effect.sync(() => {
      seen = stats.refusals
    })))

  const handle = (req: FdRequest) =>
    Effect.gen(function*() {
      // A defect in the checks must not stop the socket: the request is refused as internal.
      const answer = yield* Effect.map(Clock.currentTimeMillis, (now) => decide(req, now)).pipe(
        Effect.catchDefect((defect) =>
          Effect.as(Effect.logError("descriptor socket: a request's checks failed", defect), refusal("internal", "descriptor request: the server failed to check it (logged)")))
      )
      // A refused request's descriptors are closed now; an accepted one's belong to its token.
      if (answer["ok"] !== true) {
        yield* closeAll(req.fds)
        yield* refused(requestReason(answer), 1, `a request of pid ${req.pid} (uid ${req.uid}): ${String(answer["message"])}`)
      }
      listening?.listener.reply(req.conn, pack(answer))
    })

  if (listening !== undefined) {
    yield* Queue.take(listening.requests).pipe(Effect.flatMap(handle), Effect.forever, Effect.forkScoped)
    // The listener signals refusals at accept and at the deadline (coalesced); its counters say how many.
    yield* Queue.take(listening.refused).pipe(
      Effect.andThen(Effect.sync(() => listening.listener.stats())),
      Effect.flatMap(takeConnectionRefusals),
      Effect.forever,
      Effect.forkScoped
    )
    // Tokens nobody claimed in time: their descriptors closed.
    const sweepMs = Math.max(100, Math.min(1000, ttlMs / 4))
    yield* Effect.sleep(Duration.millis(sweepMs)).pipe(
      Effect.andThen(Clock.currentTimeMillis),
      Effect.flatMap((now) => {
        const expired = table.expire(now)
        return expired.length === 0 ? Effect.void : Effect.andThen(
          closeTokens(expired),
          Effect.logInfo(`descriptor socket: closed the descriptors of ${expired.length} token(s) not registered within ${config.fdTokenTtlSeconds} s`)
        )
      }),
      Effect.forever,
      Effect.forkScoped
    )
  }

  const nonceFor = (peer: string): Buffer => {
    const held = nonceOf.get(peer)
    if (held !== undefined) return Buffer.from(held, "hex")
    const fresh = randomBytes(TOKEN_BYTES)
    nonceOf.set(peer, fresh.toString("hex"))
    peerOf.set(fresh.toString("hex"), peer)
    return fresh
  }

  const features = [
    ...(listening !== undefined ? ["cpu_memfd"] : []),
    ...(listening !== undefined && config.requireSealedMemfd ? ["require_sealed_memfd"] : []),
    ...(config.namedSegments === "allow" ? ["named_segments"] : []),
    ...(config.curve !== undefined ? ["curve", "tenants"] : []),
    // POLL_KV_EVENTS answers records (issue 28 item 3): the KV event log is on.
    ...(config.kvEventLogSize > 0 ? ["kv_events"] : [])
  ]
  const socketPath = listening === undefined ? undefined : path

  const why = {
    unknown: "is not a token this server issued",
    used: "was already used (a token registers once: pass the descriptors again for a new one)",
    expired: `expired (passed descriptors are closed ${config.fdTokenTtlSeconds} s after passing unless registered)`,
    peer: "was issued to another ZeroMQ connection (REGISTER on the connection whose fd_nonce the descriptor request sent)",
    instance: "was issued for another instance_id (the one the descriptor request declared)"
  } as const

  const claim = (op: string, id: InstanceId, peer: string, field: string, token: Uint8Array) =>
    Effect.acquireRelease(
      Effect.gen(function*() {
        const idText = formatInstanceId(id)
        const hex = Buffer.from(token).toString("hex")
        const refuse = (actual: string, message: string) =>
          new InvalidArgument({ op, instance_id: idText, field, expected: "a token the descriptor socket answered this connection for this instance, unused", actual, message: `${op}: instance ${idText}: ${field} ${message}` })
        if (socketPath === undefined) return yield* refuse("cpu_memfd off", "names passed descriptors, but this server has no descriptor socket (--fd-socket)")
        if (token.length !== TOKEN_BYTES) return yield* refuse(`${token.length} bytes`, `must be the ${TOKEN_BYTES}-byte token of the descriptor socket's reply`)
        const result = table.claim(hex, id, peer, yield* Clock.currentTimeMillis)
        if (result._tag === "Refused") {
          if (result.token !== undefined) yield* closeAll(result.token.value)
          return yield* refuse(result.reason, `${hex.slice(0, 8)}… ${why[result.reason]}`)
        }
        const t = result.token
        return { hex, pid: t.pid, uid: t.uid, gid: t.gid, fds: t.value } satisfies ClaimedFds
      }),
      (claimed) => closeAll(claimed.fds)
    )

  const serverInfo = (ctx: RequestContext) =>
    Effect.succeed({ fd_socket: socketPath ?? "", fd_nonce: nonceFor(ctx.peer), protocol_version: PROTOCOL_VERSION, features })

  return FdExchange.of({
    socketPath,
    claim,
    disconnected: (peer) =>
      Effect.suspend(() => {
        const nonce = nonceOf.get(peer)
        if (nonce !== undefined) peerOf.delete(nonce)
        nonceOf.delete(peer)
        return closeTokens(table.dropPeer(peer))
      }),
    module: {
      name: "fd_exchange",
      rows: [row(GetServerInfo, "NORMAL", (_payload, ctx) => serverInfo(ctx))],
      status: () =>
        Effect.sync(() => {
          const stats = listening?.listener.stats()
          return {
            fd_socket: {
              path: socketPath ?? null,
              require_sealed: config.requireSealedMemfd,
              token_ttl_seconds: config.fdTokenTtlSeconds,
              pending_tokens: table.pending().length,
              connections: stats?.connections ?? 0,
              max_connections: caps.fdSocketConnections,
              max_connections_per_uid: caps.fdSocketConnectionsPerUid,
              held_descriptors: stats?.heldDescriptors ?? 0,
              token_descriptors: table.held(),
              closing_descriptors: stats?.closingDescriptors ?? 0,
              max_passed_descriptors: caps.passedDescriptors,
              max_passed_descriptors_per_peer: caps.passedDescriptorsPerPeer,
              refusals: stats?.refusals ?? noRefusals
            }
          }
        })
    }
  })
})
