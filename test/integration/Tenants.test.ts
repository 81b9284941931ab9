/**
 * Tenants over real sockets with CURVE on (issue 14 items 1, 3, 4;
 * docs/security.md): tenant A attacks tenant B's instance and is answered
 * `forbidden` (PING: `true`) while nothing of B's changes; clients outside
 * the allowlist get nothing, over tcp:// on loopback, and are told why
 * within their timeout; limits answer `overloaded` naming the flag.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect, Exit, Fiber, Scope } from "effect"
import type { CacheKey } from "../../src/schema/CacheKey.ts"
import { makeInstanceId } from "../../src/schema/InstanceId.ts"
import {
  Clear,
  Noop,
  Ping,
  PingRegistered,
  PrepareStore,
  RegisterKvCacheEngineDrivenContext,
  UnregisterKvCacheEngineDrivenContext
} from "../../src/schema/Op.ts"
import { Forbidden, Overloaded } from "../../src/schema/WireError.ts"
import { Tenancy } from "../../src/services/auth/Tenancy.ts"
import { handshakeRefusal } from "../../src/services/client/HandshakeRefusal.ts"
import { ClientClosed, makeMqClient, RequestTimeout } from "../../src/services/client/MqClient.ts"
import { LivenessTargets } from "../../src/services/liveness/LivenessTarget.ts"
import { MqServer } from "../../src/services/server/MqServer.ts"
import { layerTest } from "../../src/layers/Server.ts"
import type { DealerCurve } from "../../src/services/zmq/Sockets.ts"
import { makeTestKeys } from "../support/CurveKeys.ts"

const keys = makeTestKeys({ a: "tenantA", b: "tenantB", admin: "ops admin" }, ["stranger"])

const server = (config: Record<string, number> = {}) =>
  layerTest({
    config: {
      engineDrivenTransport: "inline",
      curveSecretKeyFile: keys.serverSecretFile,
      curveAuthorizedKeys: keys.authorizedKeysFile,
      ...config
    }
  })

const clientFor = (curve: DealerCurve | undefined, requestTimeoutMs = 5_000) =>
  Effect.flatMap(MqServer, (s) =>
    makeMqClient({ endpoint: s.endpoint, requestTimeoutMs, lingerMs: 0, ...(curve === undefined ? {} : { curve }) }))

const context = (id: bigint) => ({
  instance_id: makeInstanceId(id),
  model_name: "m",
  world_size: 1,
  block_size: 16,
  num_layers: 2,
  hidden_dim_size: 8,
  dtype_str: "float16" as const,
  use_mla: false
})

const key: CacheKey = {
  model_name: "m",
  world_size: 1,
  worker_id: 0,
  token_ids: Array.from({ length: 256 }, (_, i) => i),
  start: 0,
  end: 256,
  request_id: "r1",
  cache_salt: ""
}

/** B's instance as the liveness targets see it. */
const instanceOf = (id: bigint) =>
  Effect.gen(function*() {
    const targets = yield* LivenessTargets
    const all = yield* Effect.forEach(targets, (t) => t.instances())
    return all.flat().find((i) => i.instance_id === String(id))
  })

describe("tenants (CURVE on, real sockets)", () => {
  it.live("tenant A cannot unregister, ping-refresh, ping_registered, transfer through or CLEAR tenant B's instance; B's state is unchanged", () =>
    Effect.gen(function*() {
      const a = yield* clientFor(keys.clients["a"])
      const b = yield* clientFor(keys.clients["b"])
      const id = 4242n
      const pool = yield* b.request(RegisterKvCacheEngineDrivenContext, [context(id)])
      assert.deepStrictEqual(pool, { shm_name: "", pool_size: 0 })
      const tenancy = yield* Tenancy
      assert.strictEqual(yield* tenancy.tenantOf(makeInstanceId(id)), "tenantB")
      const before = yield* instanceOf(id)
      assert.strictEqual(before?.has_liveness_signal, false)

      const unregister = yield* Effect.flip(a.request(UnregisterKvCacheEngineDrivenContext, [makeInstanceId(id)]))
      assert.instanceOf(unregister, Forbidden)
      assert.strictEqual(unregister.code, "forbidden")
      assert.strictEqual(unregister.instance_id, "4242")
      assert.strictEqual(unregister.op, "unregister_kv_cache_engine_driven_context")

      assert.strictEqual(yield* a.request(Ping, [makeInstanceId(id)]), true)
      assert.strictEqual((yield* instanceOf(id))?.has_liveness_signal, false, "a stranger's PING touched nothing")

      const pingRegistered = yield* Effect.flip(a.request(PingRegistered, [makeInstanceId(id), ["engine_driven"]]))
      assert.instanceOf(pingRegistered, Forbidden)
      const prepare = yield* Effect.flip(a.request(PrepareStore, [key, makeInstanceId(id)]))
      assert.instanceOf(prepare, Forbidden)
      assert.strictEqual(prepare.field, "instance_id")
      const clear = yield* Effect.flip(a.request(Clear, [true]))
      assert.instanceOf(clear, Forbidden)
      assert.strictEqual(clear.message, "clear: tenant tenantA is not admin")
      const reRegister = yield* Effect.flip(a.request(RegisterKvCacheEngineDrivenContext, [context(id)]))
      assert.instanceOf(reRegister, Forbidden)

      const after = yield* instanceOf(id)
      assert.strictEqual(after?.has_liveness_signal, false)
      assert.strictEqual(after?.has_transfer_activity, false)
      assert.strictEqual(yield* tenancy.tenantOf(makeInstanceId(id)), "tenantB")
      // B itself is served: its ping latches the signal, its unregister works, then the id is no one's.
      assert.strictEqual(yield* b.request(Ping, [makeInstanceId(id)]), true)
      assert.strictEqual((yield* instanceOf(id))?.has_liveness_signal, true)
      assert.deepStrictEqual(yield* b.request(PingRegistered, [makeInstanceId(id), ["engine_driven"]]), [])
      yield* b.request(UnregisterKvCacheEngineDrivenContext, [makeInstanceId(id)])
      assert.strictEqual(yield* instanceOf(id), undefined)
      assert.strictEqual(yield* tenancy.tenantOf(makeInstanceId(id)), undefined)
      // An admin tenant may CLEAR.
      const admin = yield* clientFor(keys.clients["admin"])
      yield* admin.request(Clear, [false])
    }).pipe(Effect.scoped, Effect.provide(server())))

  it.live("over tcp:// on loopback: an authorized key is served; an unlisted key and a client without CURVE are refused at the handshake, each told why within its timeout", () =>
    Effect.gen(function*() {
      const s = yield* MqServer
      assert.match(s.endpoint, /^tcp:\/\/127\.0\.0\.1:\d+$/)
      const a = yield* clientFor(keys.clients["a"])
      assert.strictEqual(yield* a.request(Noop, []), "OK")
      const stranger = yield* clientFor(keys.clients["stranger"], 800)
      const refused = yield* Effect.flip(stranger.request(Noop, []))
      assert.deepStrictEqual(
        refused,
        new RequestTimeout({
          op: "noop",
          endpoint: s.endpoint,
          timeoutMs: 800,
          handshake: handshakeRefusal({ reason: "auth", status: 400, address: "", code: "" }, true)
        })
      )
      const plain = yield* clientFor(undefined, 800)
      const noCurve = yield* Effect.flip(plain.request(Noop, []))
      assert.instanceOf(noCurve, RequestTimeout)
      assert.oneOf(noCurve.handshake, [
        handshakeRefusal({ reason: "mechanism", address: "", code: "ERR_ZMTP_MECHANISM_MISMATCH" }, false),
        handshakeRefusal({ reason: "protocol", address: "", code: "EPIPE" }, false)
      ])
      assert.strictEqual(yield* a.request(Noop, []), "OK")
    }).pipe(Effect.scoped, Effect.provide(server())))

  it.live("closing a refused client while its request waits on the send ends that request at once with ClientClosed", () =>
    Effect.gen(function*() {
      const clientScope = yield* Scope.make()
      const stranger = yield* Scope.provide(clientScope)(clientFor(keys.clients["stranger"], 60_000))
      // The first request finds the refusal; the second one's send then has no connection to queue on.
      yield* Effect.flip(stranger.request(Noop, [], { timeoutMs: 500 }))
      const waiting = yield* Effect.forkChild(Effect.exit(stranger.request(Noop, [])))
      yield* Effect.sleep("200 millis")
      assert.isUndefined(waiting.pollUnsafe(), "still waiting on the send")
      yield* Scope.close(clientScope, Exit.void)
      const ended = yield* Fiber.join(waiting).pipe(Effect.timeout("5 seconds"))
      assert.deepStrictEqual(ended, Exit.fail(new ClientClosed({ op: "noop", endpoint: stranger.endpoint })))
    }).pipe(Effect.scoped, Effect.provide(server())))

  it.live("over tcp:// on loopback: a CURVE client of a server without CURVE is told the server does not speak it", () =>
    Effect.gen(function*() {
      const s = yield* MqServer
      const a = yield* clientFor(keys.clients["a"], 800)
      const refused = yield* Effect.flip(a.request(Noop, []))
      assert.deepStrictEqual(
        refused,
        new RequestTimeout({
          op: "noop",
          endpoint: s.endpoint,
          timeoutMs: 800,
          handshake: handshakeRefusal({ reason: "mechanism", address: "", code: "ERR_ZMTP_MECHANISM_MISMATCH" }, true)
        })
      )
    }).pipe(Effect.scoped, Effect.provide(layerTest({}))))

  it.live("a key removed by reload loses its connection's binding at once; the others keep working", () =>
    Effect.gen(function*() {
      const a = yield* clientFor(keys.clients["a"])
      const b = yield* clientFor(keys.clients["b"])
      assert.strictEqual(yield* b.request(Noop, []), "OK")
      keys.authorize({ a: "tenantA", admin: "ops admin" })
      const tenancy = yield* Tenancy
      assert.strictEqual(yield* tenancy.reload, 2)
      const refused = yield* Effect.flip(b.request(Noop, []))
      assert.instanceOf(refused, Forbidden)
      assert.strictEqual(refused.message, "hello: this public key is not authorized")
      assert.strictEqual(yield* a.request(Noop, []), "OK")
      keys.authorize({ a: "tenantA", b: "tenantB", admin: "ops admin" })
      yield* tenancy.reload
    }).pipe(Effect.scoped, Effect.provide(server())))

  it.live("REGISTERs over --tenant-max-registers-per-second are overloaded; over --tenant-max-instances too; the limits are per tenant", () =>
    Effect.gen(function*() {
      const a = yield* clientFor(keys.clients["a"])
      yield* a.request(RegisterKvCacheEngineDrivenContext, [context(1n)])
      yield* a.request(RegisterKvCacheEngineDrivenContext, [context(2n)])
      const over = yield* Effect.flip(a.request(RegisterKvCacheEngineDrivenContext, [context(3n)]))
      assert.instanceOf(over, Overloaded)
      assert.strictEqual(over.field, "tenant-max-registers-per-second")
      assert.strictEqual(over.expected, "2 per second")
      const b = yield* clientFor(keys.clients["b"])
      yield* b.request(RegisterKvCacheEngineDrivenContext, [context(5n)])
      yield* b.request(RegisterKvCacheEngineDrivenContext, [context(6n)])
    }).pipe(Effect.scoped, Effect.provide(server({ tenantMaxRegistersPerSecond: 2 }))))

  it.live("over --tenant-max-instances a REGISTER of a new instance is overloaded; an idempotent one of a held instance is not", () =>
    Effect.gen(function*() {
      const a = yield* clientFor(keys.clients["a"])
      yield* a.request(RegisterKvCacheEngineDrivenContext, [context(1n)])
      yield* a.request(RegisterKvCacheEngineDrivenContext, [context(2n)])
      const full = yield* Effect.flip(a.request(RegisterKvCacheEngineDrivenContext, [context(3n)]))
      assert.instanceOf(full, Overloaded)
      assert.strictEqual(
        full.message,
        "register_kv_cache_engine_driven_context: over the tenant limit --tenant-max-instances (2 instances; tenant tenantA holds 2); retry later or raise the limit"
      )
      const again = yield* Effect.exit(a.request(RegisterKvCacheEngineDrivenContext, [context(1n)]))
      assert.isTrue(Exit.isSuccess(again))
    }).pipe(Effect.scoped, Effect.provide(server({ tenantMaxInstances: 2 }))))
})

