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
 */
import { Clock, Context, Duration, Effect, Layer, Queue } from "effect"
import type { Scope } from "effect"
import { randomBytes } from "node:crypto"
import { closeFd, F_SEAL, type FdRequest, listenFds, sealNames } from "../../native/FdPassing.ts"
import { pack, unpack } from "../../schema/Frame.ts"
import { describeValue } from "../../schema/ValueDescription.ts"
import { formatInstanceId, type InstanceId } from "../../schema/InstanceId.ts"
import { GetServerInfo } from "../../schema/Op.ts"
import { InvalidArgument } from "../../schema/WireError.ts"
import { PROTOCOL_VERSION } from "../../version.ts"
import { row, type RequestContext, type ServerModule } from "./Handler.ts"
import { makeTokenTable, type PendingToken, TOKEN_BYTES } from "./internal/TokenTable.ts"
import { defaultFdSocket, ServerConfig } from "./ServerConfig.ts"

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

/** Most tokens pending at once (a bound on descriptors held for unregistered requests). */
const MAX_PENDING_TOKENS = 1024

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
}

/** The reply map of a refused request. */
const refusal = (code: "invalid_argument" | "forbidden" | "overloaded" | "internal", message: string) => ({ ok: false, code, message })

const make = Effect.gen(function*() {
  const config = yield* ServerConfig
  const ttlMs = config.fdTokenTtlSeconds * 1000
  const table = makeTokenTable<ReadonlyArray<PassedFd>>({ ttlMs, maxPending: MAX_PENDING_TOKENS, maxRemembered: 4096 })
  /** peer → its nonce (hex), and back. */
  const nonceOf = new Map<string, string>()
  const peerOf = new Map<string, string>()
  const closeAll = (fds: ReadonlyArray<{ readonly fd: number }>) => Effect.forEach(fds, (f) => closeFd(f.fd), { discard: true })
  const closeTokens = (tokens: ReadonlyArray<PendingToken<ReadonlyArray<PassedFd>>>) =>
    Effect.forEach(tokens, (t) => closeAll(t.value), { discard: true })

  // Pending tokens' descriptors are closed at shutdown (after the listener's release, registered after this).
  yield* Effect.addFinalizer(() => Effect.suspend(() => closeTokens(table.drain())))

  const explicit = config.fdSocket
  const path = explicit === "off" ? undefined : explicit ?? defaultFdSocket(config.endpoint)
  // The socket file's mode is the access check of a path (0600, or 0660 for --ipc-group like the ipc endpoint).
  const listening = path === undefined ? undefined : yield* listenFds(path, config.ipcGroupId).pipe(
    Effect.tap(() => Effect.logInfo(`descriptor socket (cpu_memfd) on ${path}`)),
    // The default location may be unusable (no /run access): memfd is then off, the server serves on.
    Effect.catch((e) =>
      explicit === undefined
        ? Effect.as(Effect.logWarning(`cpu_memfd off: cannot listen on the default descriptor socket ${path}: ${e.message}; pass --fd-socket`), undefined)
        : Effect.fail(e)
    )
  )

  const decide = (req: FdRequest, nowMs: number): Record<string, unknown> => {
    if (req.error !== "") return refusal("invalid_argument", `descriptor request: ${req.error}`)
    // An abstract socket has no file mode: anyone in the network namespace can connect, so the uid decides.
    const euid = process.geteuid?.() ?? 0
    if (path?.startsWith("@") === true && req.uid !== euid && req.uid !== 0) {
      return refusal("forbidden", `descriptor request: the sender runs as uid ${req.uid}; this server takes descriptors from uid ${euid} or root only`)
    }
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
      if (!f.regular || f.seals < 0 || f.access !== "rw") {
        return refusal("invalid_argument", `descriptor request: descriptor ${i} is not a read-write memfd (regular ${f.regular}, access ${f.access}, seals ${f.seals < 0 ? "unsupported" : f.seals}); expected memfd_create(…, MFD_ALLOW_SEALING) memory`)
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
    if (issued === undefined) return refusal("overloaded", `descriptor request: ${MAX_PENDING_TOKENS} tokens are pending registration; register or retry later`)
    return { ok: true, token: issued.token, expires_in_ms: ttlMs, fds: req.fds.map((f) => ({ size: f.size, seals: f.seals })) }
  }

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
        yield* Effect.logWarning(`descriptor socket: refused a request of pid ${req.pid} (uid ${req.uid}): ${String(answer["message"])}`)
      }
      listening?.listener.reply(req.conn, pack(answer))
    })

  if (listening !== undefined) {
    yield* Queue.take(listening.requests).pipe(Effect.flatMap(handle), Effect.forever, Effect.forkScoped)
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
    ...(config.curve !== undefined ? ["curve", "tenants"] : [])
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
        Effect.sync(() => ({
          fd_socket: {
            path: socketPath ?? null,
            require_sealed: config.requireSealedMemfd,
            token_ttl_seconds: config.fdTokenTtlSeconds,
            pending_tokens: table.pending().length
          }
        }))
    }
  })
})
