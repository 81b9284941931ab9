/**
 * The HELLO handshake (src/services/auth/internal/Handshake.ts) through the
 * Tenancy service alone (`Tenancy.layerTest`: real key files, no sockets):
 *
 * - ZAP: a listed CURVE key of the server's domain gets "200" and its
 *   tenant; an unlisted key, another domain or no CURVE gets "400".
 * - HELLO: a proof over the nonce of this peer's HELLO_CHALLENGE binds the
 *   peer to the key's tenant (status counts its connection); a HELLO
 *   without a challenge, with a wrong proof or an unlisted key is
 *   `forbidden` naming the field, and binds nothing; a nonce serves once.
 * - Reload: a key dropped from the file unbinds its connections at once.
 * - CURVE off: HELLO is `forbidden` (`field: "hello"`), the guard is the identity.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { Hello, HelloChallenge, type Op } from "../../../src/schema/Op.ts"
import { Forbidden } from "../../../src/schema/WireError.ts"
import { helloProof, z85Decode } from "../../../src/services/auth/Curve.ts"
import { Tenancy } from "../../../src/services/auth/Tenancy.ts"
import type { RequestContext } from "../../../src/services/server/Handler.ts"
import type { ZapRequest } from "../../../src/services/zmq/Sockets.ts"
import { makeTestKeys } from "../../support/CurveKeys.ts"

const keys = makeTestKeys({ a: "tenantA", b: "tenantB admin" }, ["stranger"])
const curveOn = Tenancy.layerTest({ curveSecretKeyFile: keys.serverSecretFile, curveAuthorizedKeys: keys.authorizedKeysFile })

const ctx = (peer: string): RequestContext => ({ routingId: Buffer.from(peer, "hex"), peer, skipBinding: false })

/** Calls Tenancy's own row for `op` (HELLO_CHALLENGE or HELLO) as peer `peer`. */
const call = (op: Op, payload: ReadonlyArray<unknown>, peer: string) =>
  Effect.flatMap(Tenancy, (t) => t.module.rows.find((r) => r.op.id === op.id)!.handle(payload, ctx(peer)))

const proofFor = (name: string, nonce: Uint8Array) => {
  const k = keys.clients[name]!
  return new Uint8Array(helloProof(k.secretKey, k.serverPublicKey, Buffer.from(nonce)))
}

/** HELLO_CHALLENGE then HELLO with client `name`'s key, as `peer`. */
const hello = (name: string, peer: string) =>
  Effect.gen(function*() {
    const nonce = (yield* call(HelloChallenge, [], peer)) as Uint8Array
    return yield* call(Hello, [keys.clients[name]!.publicKey, proofFor(name, nonce)], peer)
  })

const connectionsOf = (status: Record<string, unknown>) =>
  Object.fromEntries((status.tenants as ReadonlyArray<{ tenant: string; connections: number }>).map((r) => [r.tenant, r.connections]))

const zap = (publicKey: string, overrides: { domain?: string; mechanism?: string } = {}): ZapRequest => ({
  version: "1.0",
  requestId: Buffer.from("1"),
  domain: overrides.domain ?? "mpcache",
  address: "127.0.0.1",
  identity: Buffer.alloc(0),
  mechanism: overrides.mechanism ?? "CURVE",
  credentials: [z85Decode(publicKey)!]
})

describe("Handshake", () => {
  it.effect("ZAP admits a listed CURVE key of the domain only", () =>
    Effect.gen(function*() {
      const tenancy = yield* Tenancy
      assert.deepStrictEqual(yield* tenancy.authenticate(zap(keys.clients["a"]!.publicKey)), { statusCode: "200", statusText: "OK", userId: "tenantA" })
      for (const request of [zap(keys.clients["stranger"]!.publicKey), zap(keys.clients["a"]!.publicKey, { domain: "other" }), zap(keys.clients["a"]!.publicKey, { mechanism: "PLAIN" })]) {
        assert.deepStrictEqual(yield* tenancy.authenticate(request), { statusCode: "400", statusText: "key not authorized", userId: "" })
      }
    }).pipe(Effect.provide(curveOn)))

  it.effect("a proof over the peer's nonce binds it to the key's tenant; a nonce serves once", () =>
    Effect.gen(function*() {
      const tenancy = yield* Tenancy
      assert.deepStrictEqual(yield* hello("a", "0a"), { tenant: "tenantA", salt_group: "tenantA", admin: false })
      assert.deepStrictEqual(yield* hello("b", "0b"), { tenant: "tenantB", salt_group: "tenantB", admin: true })
      assert.deepStrictEqual(connectionsOf(yield* tenancy.status()), { tenantA: 1, tenantB: 1 })
      // The same nonce again: it was used up by the first HELLO.
      const nonce = (yield* call(HelloChallenge, [], "0c")) as Uint8Array
      yield* call(Hello, [keys.clients["a"]!.publicKey, proofFor("a", nonce)], "0c")
      const again = yield* Effect.flip(call(Hello, [keys.clients["a"]!.publicKey, proofFor("a", nonce)], "0c"))
      assert.instanceOf(again, Forbidden)
      assert.strictEqual(again.message, "hello: no challenge outstanding for this connection (send hello_challenge first)")
      yield* tenancy.disconnected("0c")
      assert.deepStrictEqual(connectionsOf(yield* tenancy.status()), { tenantA: 1, tenantB: 1 })
    }).pipe(Effect.provide(curveOn)))

  it.effect("HELLO without a challenge, with a wrong proof or an unlisted key is forbidden naming the field, and binds nothing", () =>
    Effect.gen(function*() {
      const tenancy = yield* Tenancy
      const noChallenge = yield* Effect.flip(call(Hello, [keys.clients["a"]!.publicKey, new Uint8Array(32)], "0a"))
      assert.deepStrictEqual([noChallenge._tag, (noChallenge as Forbidden).field], ["Forbidden", "proof"])

      const nonce = (yield* call(HelloChallenge, [], "0a")) as Uint8Array
      // b's proof presented with a's key.
      const wrong = yield* Effect.flip(call(Hello, [keys.clients["a"]!.publicKey, proofFor("b", nonce)], "0a"))
      assert.deepStrictEqual([(wrong as Forbidden).field, wrong.message], ["proof", "hello: the proof does not match the public key"])

      const nonce2 = (yield* call(HelloChallenge, [], "0a")) as Uint8Array
      const unlisted = yield* Effect.flip(call(Hello, [keys.clients["stranger"]!.publicKey, proofFor("stranger", nonce2)], "0a"))
      assert.deepStrictEqual([(unlisted as Forbidden).field, unlisted.message], ["public_key", "hello: this public key is not authorized"])
      assert.deepStrictEqual((yield* tenancy.status()).tenants, [])
    }).pipe(Effect.provide(curveOn)))

  it.effect("a key dropped by reload unbinds its connection at once; the others stay bound", () =>
    Effect.gen(function*() {
      const tenancy = yield* Tenancy
      yield* hello("a", "0a")
      yield* hello("b", "0b")
      keys.authorize({ b: "tenantB admin" })
      assert.strictEqual(yield* tenancy.reload, 1)
      assert.deepStrictEqual(connectionsOf(yield* tenancy.status()), { tenantB: 1 })
      keys.authorize({ a: "tenantA", b: "tenantB admin" })
      assert.strictEqual(yield* tenancy.reload, 2)
      // The binding is not restored by the key's return: the connection must say HELLO again.
      assert.deepStrictEqual(connectionsOf(yield* tenancy.status()), { tenantB: 1 })
    }).pipe(Effect.provide(curveOn)))

  it.effect("with CURVE off HELLO is forbidden and the guard is the identity", () =>
    Effect.gen(function*() {
      const tenancy = yield* Tenancy
      assert.isFalse(tenancy.enabled)
      const refused = yield* Effect.flip(call(HelloChallenge, [], "0a"))
      assert.deepStrictEqual([refused._tag, (refused as Forbidden).field], ["Forbidden", "hello"])
      const table = { rows: [], byId: new Map() }
      assert.strictEqual(tenancy.guard(table, []), table)
      assert.deepStrictEqual(yield* tenancy.status(), { auth: { curve: false, authorized_keys: 0 } })
    }).pipe(Effect.provide(Tenancy.layerTest())))
})
