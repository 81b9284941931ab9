/**
 * The HELLO handshake of Tenancy.ts (docs/security.md; issue 14 items 1, 3):
 * who may talk to the server at all, and which tenant a connection speaks for.
 *
 * - **ZAP** (`authenticate`): "200" only for a CURVE client key listed in the
 *   authorized-keys file, in the server's domain; anything else "400". Each
 *   refusal is counted in `mpcache_auth_failures_total{reason}` and logged at
 *   WARNING with the peer address, at most once per 10 s per (reason, address).
 * - **HELLO** (ops 65 and 66): zeromq.js does not tell which key a message's
 *   connection authenticated with, so a connection binds itself to a tenant by
 *   proving, over a nonce the server chose for its routing id
 *   (HELLO_CHALLENGE), that it holds the secret key of a listed public key.
 * - **Reload** (`reload`, and SIGHUP for the life of the scope): rereads the
 *   authorized-keys file; a malformed file keeps the old list (logged at
 *   ERROR); a connection bound with a key no longer listed loses its binding.
 *
 * The tenant checks on every other op live in TenantGuard.ts; this module only
 * answers which grant a peer holds (`grantOf`).
 *
 * @internal
 */
import { randomBytes } from "node:crypto"
import { Clock, Effect, Metric, Queue, type Scope } from "effect"
import { Hello, HelloChallenge } from "../../../schema/Op.ts"
import { Forbidden } from "../../../schema/WireError.ts"
import { type HandlerRow, type RequestContext, row } from "../../server/Handler.ts"
import type { CurveFiles } from "../../server/ServerConfig.ts"
import type { HandshakeFailure, ZapReply, ZapRequest } from "../../zmq/Sockets.ts"
import { type AuthorizedKeys, AuthorizedKeysInvalid, readAuthorizedKeys, type TenantGrant } from "../AuthorizedKeys.ts"
import { helloProof, KeyFileInvalid, NONCE_BYTES, publicKeyOf, readKeyFile, sameBytes, z85Encode } from "../Curve.ts"
import { byLabel } from "../../metrics/Series.ts"

/** Why a client got no service, the `reason` of `mpcache_auth_failures_total`. */
export const AUTH_FAILURE_REASONS = ["unknown_key", "mechanism", "protocol", "hello"] as const
export type AuthFailureReason = typeof AUTH_FAILURE_REASONS[number]

const authFailuresTotal = Metric.counter("mpcache_auth_failures_total", {
  description: "Clients refused: unknown_key (ZAP), mechanism (no CURVE), protocol (other handshake errors), hello (a failed HELLO)",
  incremental: true
})
const failureBy = byLabel(authFailuresTotal, "reason", AUTH_FAILURE_REASONS)
const failureMetric = (reason: AuthFailureReason) => failureBy[reason]

/** One WARNING per (reason, address) and window. */
const WARN_WINDOW_MS = 10_000

/** The ZAP domain the ROUTER asks for; a handshake in any other is refused. */
const ZAP_DOMAIN = "mpcache"

/**
 * The ZAP domain of the KV event sockets (the PUB and its replay ROUTER, issue 28 item 4): admins' keys only. A
 * PUB cannot filter per subscriber (a SUB chooses its own topics), and the stream names every tenant's chunks and
 * tokens, so a tenant that is no admin gets nothing there (docs/security.md, "KV events"); tenants read their own
 * records with POLL_KV_EVENTS.
 */
export const KV_EVENTS_ZAP_DOMAIN = "mpcache-kv-events"

/** The handshake half of Tenancy with CURVE on. */
export interface Handshake {
  /** The server's CURVE secret key (z85) and its public key; the ZAP domain. */
  readonly secretKey: string
  readonly publicKey: string
  readonly zapDomain: string
  /** The ZAP decision for one handshake. */
  readonly authenticate: (request: ZapRequest) => Effect.Effect<ZapReply>
  /** Counts and logs a failed handshake the ROUTER's monitor saw (a ZAP refusal is counted by `authenticate`). */
  readonly handshakeFailed: (failure: HandshakeFailure) => Effect.Effect<void>
  /** Rereads the authorized-keys file; on failure the old list stays. Unbinds connections whose key went. */
  readonly reload: Effect.Effect<number, AuthorizedKeysInvalid>
  /** A connection closed: its binding and nonce go. */
  readonly disconnected: (peer: string) => Effect.Effect<void>
  /** The grant `peer` proved in HELLO (with its key still listed), or undefined. */
  readonly grantOf: (peer: string) => TenantGrant | undefined
  /** The authorized keys held now. */
  readonly keys: () => AuthorizedKeys
  /** The grant of every bound connection, one per connection. */
  readonly boundGrants: () => ReadonlyArray<TenantGrant>
  /** The HELLO_CHALLENGE and HELLO rows. */
  readonly rows: ReadonlyArray<HandlerRow>
}

/**
 * Reads the server's secret key and the authorized keys of `files` (failing
 * with `KeyFileInvalid` or `AuthorizedKeysInvalid` naming the file and line)
 * and rereads the latter on SIGHUP until `Scope` closes.
 */
export const makeHandshake = (files: CurveFiles): Effect.Effect<Handshake, KeyFileInvalid | AuthorizedKeysInvalid, Scope.Scope> =>
  Effect.gen(function*() {
    const secretKey = yield* Effect.try({
      try: () => readKeyFile(files.secretKeyFile),
      catch: (e) => e instanceof KeyFileInvalid ? e : new KeyFileInvalid({ path: files.secretKeyFile, reason: String(e) })
    })
    const serverPublicKey = publicKeyOf(secretKey)
    const first = readAuthorizedKeys(files.authorizedKeysFile)
    if (first instanceof AuthorizedKeysInvalid) return yield* first
    let keys: AuthorizedKeys = first
    yield* Effect.logInfo(`CURVE on: ${keys.keys.size} authorized key(s) from ${keys.path}`)

    /** peer (routing id hex) → the public key it proved in HELLO. */
    const bound = new Map<string, string>()
    /** peer → the nonce its next HELLO proves over. */
    const nonces = new Map<string, Buffer>()
    const lastWarned = new Map<string, { atMs: number; suppressed: number }>()

    const refuse = (reason: AuthFailureReason, address: string, detail: string) =>
      Effect.gen(function*() {
        yield* Metric.update(failureMetric(reason), 1)
        const now = yield* Clock.currentTimeMillis
        const k = `${reason}\u0000${address}`
        const last = lastWarned.get(k)
        if (last !== undefined && now - last.atMs < WARN_WINDOW_MS) {
          last.suppressed++
          return
        }
        lastWarned.set(k, { atMs: now, suppressed: 0 })
        if (lastWarned.size > 10_000) lastWarned.clear()
        yield* Effect.logWarning(
          `refused a client (${reason}): ${detail}` +
            (last !== undefined && last.suppressed > 0 ? `; ${last.suppressed} more like it since the last warning` : "")
        ).pipe(Effect.annotateLogs({ peer_address: address === "" ? "(ipc)" : address, reason }))
      })

    const authenticate = (request: ZapRequest): Effect.Effect<ZapReply> => {
      const credential = request.credentials[0]
      const key = request.mechanism === "CURVE" && credential !== undefined && credential.length === 32 ? z85Encode(credential) : undefined
      const listed = key === undefined ? undefined : keys.keys.get(key)
      const grant = request.domain === ZAP_DOMAIN || (request.domain === KV_EVENTS_ZAP_DOMAIN && listed?.admin === true) ? listed : undefined
      if (grant !== undefined) return Effect.succeed({ statusCode: "200", statusText: "OK", userId: grant.tenant })
      return refuse(
        "unknown_key",
        request.address,
        key === undefined
          ? `mechanism ${request.mechanism} in domain "${request.domain}"`
          : listed !== undefined
          ? `public key ${key} (tenant ${listed.tenant}) is no admin: the KV event stream is for admins only (tenants poll their own records with POLL_KV_EVENTS)`
          : `public key ${key} is not in ${keys.path}`
      ).pipe(Effect.as({ statusCode: "400", statusText: "key not authorized", userId: "" } satisfies ZapReply))
    }

    const handshakeFailed = (failure: HandshakeFailure) =>
      failure.reason === "auth" // already counted and logged by `authenticate`, which has the peer's address
        ? Effect.void
        : refuse(
          failure.reason,
          failure.address,
          failure.reason === "mechanism"
            ? `a client without CURVE connected to ${failure.address}`
            : `handshake failed on ${failure.address} (${failure.code || "protocol error"})`
        )

    const reload = Effect.gen(function*() {
      const next = readAuthorizedKeys(files.authorizedKeysFile)
      if (next instanceof AuthorizedKeysInvalid) {
        yield* Effect.logError(`reload of the authorized keys failed; keeping the ${keys.keys.size} key(s) held: ${next.message}`)
        return yield* next
      }
      keys = next
      let unbound = 0
      for (const [peer, key] of bound) {
        if (!keys.keys.has(key)) {
          bound.delete(peer)
          unbound++
        }
      }
      yield* Effect.logInfo(
        `reloaded the authorized keys: ${keys.keys.size} key(s) from ${keys.path}` +
          (unbound > 0 ? `; ${unbound} connection(s) whose key is no longer listed lost their binding` : "")
      )
      return keys.keys.size
    })

    // SIGHUP → reload, for the life of the scope.
    const hups = yield* Queue.unbounded<void>()
    const onHup = () => void Queue.offerUnsafe(hups, undefined)
    yield* Effect.acquireRelease(Effect.sync(() => process.on("SIGHUP", onHup)), () => Effect.sync(() => process.off("SIGHUP", onHup)))
    yield* Queue.take(hups).pipe(Effect.andThen(Effect.ignore(reload)), Effect.forever, Effect.forkScoped)

    const grantOf = (peer: string): TenantGrant | undefined => {
      const key = bound.get(peer)
      return key === undefined ? undefined : keys.keys.get(key)
    }

    const challenge = (ctx: RequestContext) =>
      Effect.sync(() => {
        const nonce = randomBytes(NONCE_BYTES)
        nonces.set(ctx.peer, nonce)
        return new Uint8Array(nonce)
      })

    const hello = (publicKey: string, proof: Uint8Array, ctx: RequestContext) =>
      Effect.gen(function*() {
        const nonce = nonces.get(ctx.peer)
        nonces.delete(ctx.peer)
        const grant = keys.keys.get(publicKey)
        const fail = (why: string, field: string) =>
          refuse("hello", ctx.peer, `HELLO from peer ${ctx.peer}: ${why}`).pipe(
            Effect.andThen(Effect.fail(new Forbidden({ op: Hello.name, field, message: `hello: ${why}` })))
          )
        if (nonce === undefined) return yield* fail("no challenge outstanding for this connection (send hello_challenge first)", "proof")
        if (grant === undefined) return yield* fail("this public key is not authorized", "public_key")
        let expected: Buffer
        try {
          expected = helloProof(secretKey, publicKey, nonce)
        } catch {
          return yield* fail("the public key is not a Curve25519 key", "public_key")
        }
        if (!sameBytes(expected, proof)) return yield* fail("the proof does not match the public key", "proof")
        bound.set(ctx.peer, publicKey)
        yield* Effect.logInfo(`connection bound to tenant ${grant.tenant}`).pipe(Effect.annotateLogs({ peer: ctx.peer }))
        return { tenant: grant.tenant, salt_group: grant.saltGroup, admin: grant.admin }
      })

    return {
      secretKey,
      publicKey: serverPublicKey,
      zapDomain: ZAP_DOMAIN,
      authenticate,
      handshakeFailed,
      reload,
      disconnected: (peer) =>
        Effect.sync(() => {
          bound.delete(peer)
          nonces.delete(peer)
        }),
      grantOf,
      keys: () => keys,
      boundGrants: () => {
        const grants: Array<TenantGrant> = []
        for (const peer of bound.keys()) {
          const g = grantOf(peer)
          if (g !== undefined) grants.push(g)
        }
        return grants
      },
      rows: [
        row(HelloChallenge, "NORMAL", (_payload, ctx) => challenge(ctx)),
        row(Hello, "NORMAL", ([publicKey, proof], ctx) => hello(publicKey, proof, ctx))
      ]
    }
  })
