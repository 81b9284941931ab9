/**
 * Who may talk to the server, and about whose instances (docs/security.md;
 * issue 14 items 1, 3, 4). With CURVE on (`--curve-secret-key-file`,
 * `--curve-authorized-keys`):
 *
 * - **ZAP** (`authenticate`): a handshake succeeds only for a client public
 *   key listed in the authorized-keys file; any other, and a client without
 *   CURVE, gets nothing. Each refusal is counted in
 *   `mpcache_auth_failures_total{reason}` and logged at WARNING with the
 *   peer address, at most once per 10 s per (reason, address).
 * - **HELLO** (ops 65 and 66): zeromq.js does not tell which key a message's
 *   connection authenticated with, and the ZAP request names neither the
 *   connection nor the routing id (its address is the peer IP, no port; its
 *   identity is the server's own). So a connection binds itself to a tenant
 *   by proving it holds the secret key of a listed public key over a nonce
 *   the server chose for that routing id. Until then every other op is
 *   answered `forbidden` (`field: "hello"`).
 * - **Tenants** (`guard`): an instance belongs to the tenant that
 *   registered it — its owner lives in each of its registry entries,
 *   inserted with the entry and released with it by the entry's one
 *   finalizer (issue 25 item 1, InstanceOwner.ts), so no reap, fault or
 *   UNREGISTER can leave an entry without its owner or an owner without its
 *   entry; UNREGISTER, transfers, PING_REGISTERED and CB ops naming
 *   another tenant's instance are `forbidden` and change nothing; a PING of
 *   it answers `true` and touches nothing; CLEAR needs `admin`; every
 *   CacheKey's `cache_salt` and every `request_id` is prefixed with the
 *   tenant's salt group, so tenants of different groups never share a chunk
 *   or a lookup session.
 * - **Released ids** (issue 24 item 13, `ReleasedIds.ts`): once nothing
 *   holds an instance any more (its last UNREGISTER, a reap or a fault
 *   release, told by the finalizer of its last entry), its id
 *   stays bound to that tenant for the registration grace: another tenant's
 *   REGISTER of it is `forbidden`, saying when it frees; its own tenant gets
 *   it back.
 * - **Limits** per tenant: registered instances, REGISTERs per second (a
 *   bucket refilled on the Clock), bytes of worker memory mapped (the sum
 *   of its entries' owners: one per registration kind); over one,
 *   `overloaded` naming its flag.
 * - **Reload**: SIGHUP rereads the authorized-keys file (a malformed file
 *   keeps the old list, logged at ERROR); connections bound with a key no
 *   longer listed lose their binding at once.
 *
 * With CURVE off the guard is the identity and HELLO answers `forbidden`.
 */
import { randomBytes } from "node:crypto"
import { Clock, Context, Effect, Layer, Metric, Queue } from "effect"
import { formatInstanceId, type InstanceId } from "../../schema/InstanceId.ts"
import type { Op } from "../../schema/Op.ts"
import { Clear, Hello, HelloChallenge, Ping } from "../../schema/Op.ts"
import { instanceIdOf, opFields } from "../../schema/OpMeta.ts"
import { memfdSegmentKey, type TensorDescriptor } from "../../schema/TensorDescriptor.ts"
import { Forbidden, Overloaded, type WireError } from "../../schema/WireError.ts"
import type { InstanceOwner, ReleaseReason as EntryReleaseReason } from "../liveness/InstanceOwner.ts"
import type { LivenessTarget } from "../liveness/LivenessTarget.ts"
import { type HandlerRow, type HandlerTable, row, type RequestContext, type ServerModule } from "../server/Handler.ts"
import { ServerConfig, type TenantLimits } from "../server/ServerConfig.ts"
import type { HandshakeFailure, ZapReply, ZapRequest } from "../zmq/Sockets.ts"
import { type AuthorizedKeys, AuthorizedKeysInvalid, readAuthorizedKeys, type TenantGrant } from "./AuthorizedKeys.ts"
import { makeReleasedIds, RELEASED_IDS_MAX, type ReleasedBinding } from "./ReleasedIds.ts"
import { helloProof, KeyFileInvalid, NONCE_BYTES, publicKeyOf, readKeyFile, sameBytes, z85Encode } from "./Curve.ts"
import { byLabel } from "../metrics/Series.ts"

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

/** Bytes of worker memory `descriptors` map: each distinct segment (shm name, passed memfd or IPC handle) once. */
export const mappedBytesOf = (descriptors: ReadonlyArray<TensorDescriptor>): number => {
  const segments = new Map<string, number>()
  for (const d of descriptors) {
    const name = d.kind === "cpu_shm"
      ? `shm:${d.shm_name}`
      : d.kind === "cpu_memfd"
      ? memfdSegmentKey(d.fd_token ?? new Uint8Array(), d.fd_index ?? 0)
      : `ipc:${Buffer.from(d.ipc_handle ?? new Uint8Array()).toString("hex")}`
    segments.set(name, Math.max(segments.get(name) ?? 0, d.nbytes))
  }
  let total = 0
  for (const n of segments.values()) total += n
  return total
}

/** What the server's storage keys see of a tenant's `cache_salt` / `request_id`: its salt group first. */
export const namespaced = (saltGroup: string, value: string): string => `${saltGroup}|${value}`

/** The `tenants` block of `/api/status`, one row per tenant holding instances or connections. */
export interface TenantStatus {
  readonly tenant: string
  readonly admin: boolean
  readonly salt_group: string
  readonly instances: number
  readonly mapped_bytes: number
  readonly connections: number
}

/** The tenancy service; `Tenancy.layer` reads the key files named by the config. */
export class Tenancy extends Context.Service<Tenancy, {
  /** Whether CURVE is on. */
  readonly enabled: boolean
  /** The ROUTER's CURVE settings (its secret key, the ZAP domain); undefined when off. */
  readonly curve: { readonly secretKey: string; readonly publicKey: string; readonly zapDomain: string } | undefined
  /** The ZAP decision for one handshake: "200" for a listed CURVE key of this domain, "400" otherwise. */
  readonly authenticate: (request: ZapRequest) => Effect.Effect<ZapReply>
  /** Counts and logs a failed handshake the ROUTER's monitor saw (a ZAP refusal is counted by `authenticate`). */
  readonly handshakeFailed: (failure: HandshakeFailure) => Effect.Effect<void>
  /** Rereads the authorized-keys file; on failure the old list stays. Unbinds connections whose key went. */
  readonly reload: Effect.Effect<number, AuthorizedKeysInvalid>
  /** A connection closed: its binding and nonce go. */
  readonly disconnected: (peer: string) => Effect.Effect<void>
  /** The table with every row behind the tenant checks (the identity with CURVE off). */
  readonly guard: (table: HandlerTable, targets: ReadonlyArray<LivenessTarget>) => HandlerTable
  /** HELLO_CHALLENGE and HELLO rows (no liveness target: the owners live in the other targets' entries). */
  readonly module: ServerModule
  /** The tenant owning `id` (the owner of any of its entries), or undefined (none, or CURVE off). */
  readonly tenantOf: (id: InstanceId) => Effect.Effect<string | undefined>
  /** The `auth` and `tenants` blocks of `/api/status`. */
  readonly status: () => Effect.Effect<Record<string, unknown>>
}>()("mpcache/services/auth/Tenancy") {
  /**
   * From `ServerConfig`: off without `curve`; with it, reads the server's
   * secret key and the authorized-keys file (failing with `KeyFileInvalid`
   * or `AuthorizedKeysInvalid` naming the file and line) and rereads the
   * latter on SIGHUP for the life of the layer.
   */
  static readonly layer = Layer.effect(this, Effect.suspend(() => make))
}

const make = Effect.gen(function*() {
  const config = yield* ServerConfig
  const curveFiles = config.curve
  const limits: TenantLimits = config.tenantLimits
  const offModule: ServerModule = {
    name: "tenancy",
    rows: [
      row(HelloChallenge, "NORMAL", () => Effect.fail(curveOff(HelloChallenge.name))),
      row(Hello, "NORMAL", () => Effect.fail(curveOff(Hello.name)))
    ]
  }
  if (curveFiles === undefined) {
    return Tenancy.of({
      enabled: false,
      curve: undefined,
      authenticate: () => Effect.succeed({ statusCode: "400", statusText: "CURVE is off", userId: "" }),
      handshakeFailed: () => Effect.void,
      reload: Effect.succeed(0),
      disconnected: () => Effect.void,
      guard: (table) => table,
      module: offModule,
      tenantOf: () => Effect.succeed(undefined),
      status: () => Effect.succeed({ auth: { curve: false, authorized_keys: 0 } })
    })
  }

  const secretKey = yield* Effect.try({
    try: () => readKeyFile(curveFiles.secretKeyFile),
    catch: (e) => e instanceof KeyFileInvalid ? e : new KeyFileInvalid({ path: curveFiles.secretKeyFile, reason: String(e) })
  })
  const serverPublicKey = publicKeyOf(secretKey)
  const first = readAuthorizedKeys(curveFiles.authorizedKeysFile)
  if (first instanceof AuthorizedKeysInvalid) return yield* first
  let keys: AuthorizedKeys = first
  const zapDomain = "mpcache"
  yield* Effect.logInfo(`CURVE on: ${keys.keys.size} authorized key(s) from ${keys.path}`)

  /** peer (routing id hex) → the public key it proved in HELLO. */
  const bound = new Map<string, string>()
  /** peer → the nonce its next HELLO proves over. */
  const nonces = new Map<string, Buffer>()
  const graceSeconds = config.workerRegistrationGraceSeconds
  /** Ids nothing holds any more, bound to their last tenant for the registration grace (issue 24 item 13). */
  const released = makeReleasedIds({ graceMs: graceSeconds * 1000, maxRecords: RELEASED_IDS_MAX })
  /** tenant → register bucket: tokens left and when last refilled. */
  const buckets = new Map<string, { tokens: number; atMs: number }>()
  const lastWarned = new Map<string, { atMs: number; suppressed: number }>()
  let targets: ReadonlyArray<LivenessTarget> = []

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
    const grant = key === undefined || request.domain !== zapDomain ? undefined : keys.keys.get(key)
    if (grant !== undefined) return Effect.succeed({ statusCode: "200", statusText: "OK", userId: grant.tenant })
    return refuse(
      "unknown_key",
      request.address,
      key === undefined
        ? `mechanism ${request.mechanism} in domain "${request.domain}"`
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
    const next = readAuthorizedKeys(curveFiles.authorizedKeysFile)
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

  // SIGHUP → reload, for the life of the layer.
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

  const anyHolds = (id: InstanceId) =>
    Effect.map(Effect.forEach(targets, (t) => t.holdsInstance(id)), (held) => held.some(Boolean))

  /** The owner of `id`: its entries' (every entry of an id has the same tenant: the guard lets no other register one). */
  const ownerOf = (id: InstanceId) =>
    Effect.gen(function*() {
      for (const t of targets) {
        const o = yield* t.ownerOf(id)
        if (o !== undefined) return o
      }
      return undefined
    })

  /** The owner of `id`'s entry of `kind`, if it holds one. */
  const ownerOfKind = (id: InstanceId, kind: string) =>
    Effect.gen(function*() {
      for (const t of targets) if (t.kind === kind) return yield* t.ownerOf(id)
      return undefined
    })

  /** Every owned entry of every target. */
  const allOwned = Effect.suspend(() => Effect.map(Effect.forEach(targets, (t) => t.owners()), (all) => all.flat()))

  /** `tenant`'s instances (distinct ids) and mapped bytes (every entry's), as the entries' owners say. */
  const holdingsOf = (tenant: string) =>
    Effect.map(allOwned, (owned) => {
      const ids = new Set<InstanceId>()
      let mappedBytes = 0
      for (const { id, owner } of owned) {
        if (owner.tenant !== tenant) continue
        ids.add(id)
        mappedBytes += owner.mappedBytes
      }
      return { ids, mappedBytes }
    })

  /**
   * The owner a REGISTER's new entry is inserted with. Its `release`, run by
   * the entry's one finalizer: when nothing holds `id` any more, the id
   * stays bound to `tenant` for the registration grace (issue 24 item 13);
   * at shutdown nothing is remembered.
   */
  const ownerFor = (tenant: string, mappedBytes: number): InstanceOwner => ({
    tenant,
    mappedBytes,
    release: (id: InstanceId, reason: EntryReleaseReason) =>
      reason === "shutdown"
        ? Effect.void
        : Effect.gen(function*() {
          if (yield* anyHolds(id)) return
          released.remember(id, tenant, reason, yield* Clock.currentTimeMillis)
        })
  })

  /** Takes one REGISTER token of `tenant`'s bucket; false when empty. */
  const takeRegisterToken = (tenant: string, nowMs: number): boolean => {
    const rate = limits.maxRegistersPerSecond
    const b = buckets.get(tenant) ?? { tokens: rate, atMs: nowMs }
    b.tokens = Math.min(rate, b.tokens + ((nowMs - b.atMs) / 1000) * rate)
    b.atMs = nowMs
    buckets.set(tenant, b)
    if (b.tokens < 1) return false
    b.tokens -= 1
    return true
  }

  const overloaded = (op: string, flag: string, limit: string, actual: string) =>
    new Overloaded({
      op,
      field: flag,
      expected: limit,
      actual,
      message: `${op}: over the tenant limit --${flag} (${limit}; ${actual}); retry later or raise the limit`
    })

  /** Another tenant released `id` within the grace: its REGISTER is refused, saying when the id frees. */
  const boundElsewhere = (op: string, id: InstanceId, b: ReleasedBinding, nowMs: number) => {
    const what = b.reason === "reap" ? "was reaped" : b.reason === "fault" ? "was released after a fault in its memory" : "was unregistered"
    const ago = `${(nowMs - b.releasedAtMs) / 1000} s ago`
    return new Forbidden({
      op,
      instance_id: formatInstanceId(id),
      field: "instance_id",
      expected: `an id no other tenant released within the registration grace (${graceSeconds} s)`,
      actual: `another tenant's instance, ${what} ${ago}`,
      message:
        `${op}: instance ${formatInstanceId(id)} belongs to another tenant: it ${what} ${ago}, and an id stays bound to its last tenant for the registration grace (--worker-registration-grace-seconds ${graceSeconds}) after its UNREGISTER or reap; it frees in ${(b.untilMs - nowMs) / 1000} s. Nothing was changed; register under another id`
    })
  }

  const notYours = (op: string, id: InstanceId) =>
    new Forbidden({
      op,
      instance_id: formatInstanceId(id),
      field: "instance_id",
      message: `${op}: instance ${formatInstanceId(id)} belongs to another tenant; nothing was changed`
    })

  /** `payload` with every CacheKey's cache_salt and every request id in the tenant's salt group. */
  const rewrite = (op: Op, payload: ReadonlyArray<unknown>, group: string): ReadonlyArray<unknown> => {
    const { keys: keyAt, requestIds: ridAt } = opFields(op)
    if (keyAt.length === 0 && ridAt.length === 0) return payload
    const out = [...payload]
    for (const i of keyAt) {
      const k = out[i] as { readonly cache_salt: string; readonly request_id: string }
      out[i] = { ...k, cache_salt: namespaced(group, k.cache_salt), request_id: namespaced(group, k.request_id) }
    }
    for (const i of ridAt) out[i] = namespaced(group, out[i] as string)
    return out
  }

  const guardRow = (r: HandlerRow): HandlerRow => {
    if (r.op.id === HelloChallenge.id || r.op.id === Hello.id) return r
    const op = r.op
    const registers = op.registers
    const mappedAt = opFields(op).mapped
    const unbound = () =>
      new Forbidden({
        op: op.name,
        field: "hello",
        message: `${op.name}: this connection has not said HELLO with an authorized key (hello_challenge, then hello)`
      })
    // Before the payload is decoded (issue 24 item 3): a peer without a tenant gets nothing decoded for it.
    const admit = (ctx: RequestContext): WireError | undefined => grantOf(ctx.peer) === undefined ? unbound() : undefined
    const handle = (payload: ReadonlyArray<unknown>, ctx: RequestContext): Effect.Effect<unknown, WireError> =>
      Effect.gen(function*() {
        const grant = grantOf(ctx.peer)
        if (grant === undefined) return yield* unbound()
        if (op.id === Clear.id && !grant.admin) {
          return yield* new Forbidden({ op: op.name, field: "tenant", expected: "admin", actual: grant.tenant, message: `clear: tenant ${grant.tenant} is not admin` })
        }
        const id = instanceIdOf(op, payload)
        const owner = id === undefined ? undefined : yield* ownerOf(id)
        if (id !== undefined && owner !== undefined && owner.tenant !== grant.tenant) {
          if (op.id === Ping.id) {
            // A stranger's PING answers like any PING but touches nothing and binds nothing (it cannot keep
            // another tenant's dead instance alive).
            ctx.skipBinding = true
            return true
          }
          return yield* notYours(op.name, id)
        }
        const rewritten = rewrite(op, payload, grant.saltGroup)
        // An UNREGISTER needs nothing more: the entry's finalizer tells its owner, which binds the released id.
        if (id === undefined || registers === undefined) return yield* r.handle(rewritten, ctx)
        const now = yield* Clock.currentTimeMillis
        if (owner === undefined) {
          const binding = released.bindingOf(id, now)
          if (binding !== undefined && binding.tenant !== grant.tenant) return yield* boundElsewhere(op.name, id, binding, now)
        }
        if (!takeRegisterToken(grant.tenant, now)) {
          return yield* overloaded(
            op.name,
            "tenant-max-registers-per-second",
            `${limits.maxRegistersPerSecond} per second`,
            `tenant ${grant.tenant} registered faster`
          )
        }
        const holdings = yield* holdingsOf(grant.tenant)
        if (owner === undefined) {
          const held = holdings.ids.size - (holdings.ids.has(id) ? 1 : 0)
          if (held >= limits.maxInstances) {
            return yield* overloaded(op.name, "tenant-max-instances", `${limits.maxInstances} instances`, `tenant ${grant.tenant} holds ${held}`)
          }
        }
        const bytes = mappedAt === undefined ? 0 : mappedBytesOf(payload[mappedAt] as ReadonlyArray<TensorDescriptor>)
        // This kind's entry of the id, if held, is what this REGISTER refreshes or replaces: not counted twice.
        const others = holdings.mappedBytes - ((yield* ownerOfKind(id, registers))?.mappedBytes ?? 0)
        if (others + bytes > limits.maxMappedBytes) {
          return yield* overloaded(
            op.name,
            "tenant-max-mapped-bytes",
            `${limits.maxMappedBytes} bytes`,
            `tenant ${grant.tenant} maps ${others} and asks for ${bytes} more`
          )
        }
        // The owner goes in with the entry the module inserts (one step; InstanceModule.ts): no claim beside it.
        const result = yield* r.handle(rewritten, { ...ctx, owner: ownerFor(grant.tenant, bytes) })
        // Held again by its tenant: the binding's work is done (a failed REGISTER keeps it).
        released.forget(id)
        return result
      })
    // No fast answer under tenancy (issue 16): every request passes the HELLO and owner checks above.
    return { op: r.op, pool: r.pool, handle, admit }
  }

  const guard = (table: HandlerTable, all: ReadonlyArray<LivenessTarget>): HandlerTable => {
    targets = all
    return { rows: table.rows, byId: new Map([...table.byId].map(([id, r]) => [id, guardRow(r)] as const)) }
  }

  const module: ServerModule = {
    name: "tenancy",
    rows: [
      row(HelloChallenge, "NORMAL", (_payload, ctx) => challenge(ctx)),
      row(Hello, "NORMAL", ([publicKey, proof], ctx) => hello(publicKey, proof, ctx))
    ]
  }

  const status = () =>
    Effect.map(allOwned, (owned) => {
      const rows = new Map<string, TenantStatus>()
      const rowOf = (tenant: string): TenantStatus => {
        const grant = [...keys.keys.values()].find((g) => g.tenant === tenant)
        return rows.get(tenant) ??
          { tenant, admin: grant?.admin ?? false, salt_group: grant?.saltGroup ?? tenant, instances: 0, mapped_bytes: 0, connections: 0 }
      }
      const counted = new Set<string>()
      for (const { id, owner } of owned) {
        const r = rowOf(owner.tenant)
        // An instance once, however many kinds it registered; its bytes per kind.
        const first = !counted.has(`${owner.tenant}\u0000${id}`)
        counted.add(`${owner.tenant}\u0000${id}`)
        rows.set(owner.tenant, { ...r, instances: r.instances + (first ? 1 : 0), mapped_bytes: r.mapped_bytes + owner.mappedBytes })
      }
      for (const peer of bound.keys()) {
        const g = grantOf(peer)
        if (g === undefined) continue
        const r = rowOf(g.tenant)
        rows.set(g.tenant, { ...r, connections: r.connections + 1 })
      }
      return {
        auth: {
          curve: true,
          authorized_keys: keys.keys.size,
          server_public_key: serverPublicKey,
          released_ids: { held: released.size(), dropped: released.dropped(), max: RELEASED_IDS_MAX, grace_seconds: graceSeconds }
        },
        tenants: [...rows.values()].sort((a, b) => a.tenant.localeCompare(b.tenant))
      }
    })

  return Tenancy.of({
    enabled: true,
    curve: { secretKey, publicKey: serverPublicKey, zapDomain },
    authenticate,
    handshakeFailed,
    reload,
    disconnected: (peer) =>
      Effect.sync(() => {
        bound.delete(peer)
        nonces.delete(peer)
      }),
    guard,
    module,
    tenantOf: (id) => Effect.map(ownerOf(id), (o) => o?.tenant),
    status
  })
})

const curveOff = (op: string) =>
  new Forbidden({ op, field: "hello", message: `${op}: this server runs without CURVE; there is no tenant to bind` })
