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
 *
 * The machinery is in `internal/` (issue 25 item 5): Handshake.ts (ZAP,
 * HELLO, the keys and their reload) and TenantGuard.ts (the checks on every
 * other op, the limits, released ids). This module holds the service.
 */
import { Context, Effect, Layer } from "effect"
import type { InstanceId } from "../../schema/InstanceId.ts"
import { Hello, HelloChallenge } from "../../schema/Op.ts"
import { Forbidden } from "../../schema/WireError.ts"
import type { LivenessTarget } from "../liveness/LivenessTarget.ts"
import { type HandlerTable, row, type ServerModule } from "../server/Handler.ts"
import { ServerConfig, type ServerConfigInput } from "../server/ServerConfig.ts"
import type { HandshakeFailure, ZapReply, ZapRequest } from "../zmq/Sockets.ts"
import type { AuthorizedKeysInvalid } from "./AuthorizedKeys.ts"
import { makeHandshake } from "./internal/Handshake.ts"
import { makeTenantGuard } from "./internal/TenantGuard.ts"

export { AUTH_FAILURE_REASONS, type AuthFailureReason, KV_EVENTS_ZAP_DOMAIN } from "./internal/Handshake.ts"
export { mappedBytesOf, namespaced, type TenantStatus } from "./internal/TenantGuard.ts"

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
  /**
   * A salt group's weight in L1 (issue 27 item 2): the sum of its tenants' `l1-share=W` (each absent one
   * `--tenant-l1-share-default`), from the authorized-keys file as last (re)loaded; a group no line names weighs the
   * default. Undefined with CURVE off: L1 is one LRU then.
   */
  readonly l1WeightOf: ((group: string) => number) | undefined
}>()("mpcache/services/auth/Tenancy") {
  /**
   * From `ServerConfig`: off without `curve`; with it, reads the server's
   * secret key and the authorized-keys file (failing with `KeyFileInvalid`
   * or `AuthorizedKeysInvalid` naming the file and line) and rereads the
   * latter on SIGHUP for the life of the layer.
   */
  static readonly layer = Layer.effect(this, Effect.suspend(() => make))
  /**
   * For tests: `layer` over `ServerConfig.layerTest(overrides)`, needing
   * nothing else (CURVE on when `curveSecretKeyFile` and
   * `curveAuthorizedKeys` name key files, e.g. test/support/CurveKeys.ts's).
   */
  static readonly layerTest = (overrides: Partial<ServerConfigInput> = {}) =>
    this.layer.pipe(Layer.provide(ServerConfig.layerTest(overrides)))
}

const make = Effect.gen(function*() {
  const config = yield* ServerConfig
  const curveFiles = config.curve
  if (curveFiles === undefined) {
    return Tenancy.of({
      enabled: false,
      curve: undefined,
      authenticate: () => Effect.succeed({ statusCode: "400", statusText: "CURVE is off", userId: "" }),
      handshakeFailed: () => Effect.void,
      reload: Effect.succeed(0),
      disconnected: () => Effect.void,
      guard: (table) => table,
      module: {
        name: "tenancy",
        rows: [
          row(HelloChallenge, "NORMAL", () => Effect.fail(curveOff(HelloChallenge.name))),
          row(Hello, "NORMAL", () => Effect.fail(curveOff(Hello.name)))
        ]
      },
      tenantOf: () => Effect.succeed(undefined),
      status: () => Effect.succeed({ auth: { curve: false, authorized_keys: 0 } }),
      l1WeightOf: undefined
    })
  }
  const handshake = yield* makeHandshake(curveFiles)
  const tenants = makeTenantGuard({
    limits: config.tenantLimits,
    graceSeconds: config.workerRegistrationGraceSeconds,
    grantOf: handshake.grantOf
  })
  // Weights by salt group, rebuilt when a reload gives a new key list (read at every eviction decision).
  let weightsOf: { readonly keys: unknown; readonly byGroup: ReadonlyMap<string, number> } | undefined
  const l1WeightOf = (group: string): number => {
    const keys = handshake.keys()
    if (weightsOf?.keys !== keys) {
      const perTenant = new Map<string, { readonly group: string; readonly weight: number }>()
      for (const g of keys.keys.values()) perTenant.set(g.tenant, { group: g.saltGroup, weight: g.l1Share ?? config.tenantL1ShareDefault })
      const byGroup = new Map<string, number>()
      for (const t of perTenant.values()) byGroup.set(t.group, (byGroup.get(t.group) ?? 0) + t.weight)
      weightsOf = { keys, byGroup }
    }
    return weightsOf.byGroup.get(group) ?? config.tenantL1ShareDefault
  }
  return Tenancy.of({
    enabled: true,
    curve: { secretKey: handshake.secretKey, publicKey: handshake.publicKey, zapDomain: handshake.zapDomain },
    authenticate: handshake.authenticate,
    handshakeFailed: handshake.handshakeFailed,
    reload: handshake.reload,
    disconnected: handshake.disconnected,
    guard: tenants.guard,
    module: { name: "tenancy", rows: handshake.rows },
    tenantOf: tenants.tenantOf,
    status: () =>
      Effect.map(tenants.tenants(handshake.keys().keys.values(), handshake.boundGrants()), (rows) => ({
        auth: {
          curve: true,
          authorized_keys: handshake.keys().keys.size,
          server_public_key: handshake.publicKey,
          released_ids: tenants.releasedIds()
        },
        tenants: rows
      })),
    l1WeightOf
  })
})

const curveOff = (op: string) =>
  new Forbidden({ op, field: "hello", message: `${op}: this server runs without CURVE; there is no tenant to bind` })
