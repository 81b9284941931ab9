/**
 * The tenant limits of REGISTER (issue 14 item 4) on the server's modules
 * without sockets, on the TestClock: the real handler table behind the
 * tenant guard, a connection bound by a real HELLO proof, real shared
 * memory for the registrations that map it.
 *
 * - `--tenant-max-registers-per-second` (20): the 21st REGISTER within a
 *   second is `overloaded` naming the limit; once the clock has moved one
 *   second the next is accepted.
 * - `--tenant-max-mapped-bytes`: a REGISTER that would map more is
 *   `overloaded` naming the limit, and nothing is mapped or registered.
 * - Admission before decoding (issue 24 item 3): every guarded row refuses a
 *   peer that has not said HELLO from the peer alone, so the MQ server never
 *   decodes an unbound peer's payload; HELLO itself is always admitted.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { TestClock } from "effect/testing"
import { NativeMemory } from "../../../src/native/Native.ts"
import { makeInstanceId } from "../../../src/schema/InstanceId.ts"
import { Hello, HelloChallenge, type Op, OPS, type PayloadOf, RegisterKvCache, RegisterKvCacheEngineDrivenContext, type ResponseOf } from "../../../src/schema/Op.ts"
import { Forbidden, Overloaded, type WireError } from "../../../src/schema/WireError.ts"
import { layerModulesTest } from "../../../src/layers/Server.ts"
import { helloProof } from "../../../src/services/auth/Curve.ts"
import { mappedBytesOf, Tenancy } from "../../../src/services/auth/Tenancy.ts"
import { LmcacheDrivenTransfer } from "../../../src/services/server/LmcacheDrivenTransfer.ts"
import { Handlers } from "../../../src/services/server/MqServer.ts"
import { makeTestKeys } from "../../support/CurveKeys.ts"
import { workerCache } from "../../support/LivenessEnv.ts"

const keys = makeTestKeys({ a: "tenantA" })
const env = (config: Record<string, number> = {}) =>
  layerModulesTest({
    config: {
      chunkSize: 32,
      engineDrivenTransport: "inline",
      curveSecretKeyFile: keys.serverSecretFile,
      curveAuthorizedKeys: keys.authorizedKeysFile,
      ...config
    }
  })

/** Calls the guarded table as the dispatcher does, as peer `peer`. */
const call = <O extends Op>(op: O, payload: PayloadOf<O>, peer = "0a0b0c0d") =>
  Effect.flatMap(Handlers, (table) =>
    table.byId.get(op.id)!.handle(payload, { routingId: Buffer.from(peer, "hex"), peer, skipBinding: false })) as Effect.Effect<
      ResponseOf<O>,
      WireError,
      Handlers
    >

/** HELLO_CHALLENGE and HELLO with tenant A's key: binds `peer` to tenant A. */
const bindTenantA = Effect.gen(function*() {
  const a = keys.clients["a"]!
  const nonce = yield* call(HelloChallenge, [])
  const grant = yield* call(Hello, [a.publicKey, new Uint8Array(helloProof(a.secretKey, a.serverPublicKey, nonce))])
  assert.deepStrictEqual(grant, { tenant: "tenantA", salt_group: "tenantA", admin: false })
})

const context = (id: number) => ({
  instance_id: makeInstanceId(BigInt(id)),
  model_name: "m",
  world_size: 1,
  block_size: 16,
  num_layers: 2,
  hidden_dim_size: 8,
  dtype_str: "float16" as const,
  use_mla: false
})

/** The mapped-bytes limit of the second test: below one worker cache's segment. */
const LIMIT = 1_000

describe("tenant REGISTER limits (TestClock)", () => {
  it.effect("the 21st REGISTER within a second is overloaded naming --tenant-max-registers-per-second; a second later one is accepted", () =>
    Effect.gen(function*() {
      yield* bindTenantA
      const tenancy = yield* Tenancy
      for (let i = 1; i <= 20; i++) yield* call(RegisterKvCacheEngineDrivenContext, [context(i)])
      const over = yield* Effect.flip(call(RegisterKvCacheEngineDrivenContext, [context(21)]))
      assert.deepStrictEqual(
        over,
        new Overloaded({
          op: "register_kv_cache_engine_driven_context",
          field: "tenant-max-registers-per-second",
          expected: "20 per second",
          actual: "tenant tenantA registered faster",
          message:
            "register_kv_cache_engine_driven_context: over the tenant limit --tenant-max-registers-per-second (20 per second; tenant tenantA registered faster); retry later or raise the limit"
        })
      )
      assert.strictEqual(tenancy.tenantOf(makeInstanceId(21n)), undefined, "the refused REGISTER claimed nothing")
      // Half a second refills ten tokens, not enough for eleven.
      yield* TestClock.adjust("500 millis")
      for (let i = 22; i <= 31; i++) yield* call(RegisterKvCacheEngineDrivenContext, [context(i)])
      assert.instanceOf(yield* Effect.flip(call(RegisterKvCacheEngineDrivenContext, [context(32)])), Overloaded)
      yield* TestClock.adjust("1 second")
      yield* call(RegisterKvCacheEngineDrivenContext, [context(21)])
      assert.strictEqual(tenancy.tenantOf(makeInstanceId(21n)), "tenantA")
    }).pipe(Effect.provide(env())))

  it.effect("a REGISTER over --tenant-max-mapped-bytes is overloaded naming the limit; nothing is mapped or registered", () =>
    Effect.gen(function*() {
      yield* bindTenantA
      const cache = yield* workerCache
      const bytes = mappedBytesOf(cache.descriptors)
      assert.isAbove(bytes, LIMIT)
      const native = yield* NativeMemory
      const before = native.stats()
      const over = yield* Effect.flip(call(RegisterKvCache, [makeInstanceId(7n), cache.descriptors, "m", 1, "vllm", {}, []]))
      assert.deepStrictEqual(
        over,
        new Overloaded({
          op: "register_kv_cache",
          field: "tenant-max-mapped-bytes",
          expected: `${LIMIT} bytes`,
          actual: `tenant tenantA maps 0 and asks for ${bytes} more`,
          message: `register_kv_cache: over the tenant limit --tenant-max-mapped-bytes (${LIMIT} bytes; tenant tenantA maps 0 and asks for ${bytes} more); retry later or raise the limit`
        })
      )
      assert.deepStrictEqual(native.stats(), before, "nothing mapped")
      assert.isFalse(yield* (yield* LmcacheDrivenTransfer).isRegistered(makeInstanceId(7n)))
      assert.strictEqual((yield* Tenancy).tenantOf(makeInstanceId(7n)), undefined)
    }).pipe(Effect.provide(env({ tenantMaxMappedBytes: LIMIT }))))

  it.effect("a peer that has not said HELLO is refused by every guarded row before its payload is decoded; once bound it is admitted", () =>
    Effect.gen(function*() {
      const table = yield* Handlers
      const peer = "0a0b0c0d"
      const ctx = { routingId: Buffer.from(peer, "hex"), peer, skipBinding: false }
      const served = OPS.filter((op) => table.byId.has(op.id))
      assert.isAbove(served.length, 20)
      for (const op of served) {
        const admit = table.byId.get(op.id)!.admit
        if (op.id === Hello.id || op.id === HelloChallenge.id) {
          assert.strictEqual(admit, undefined, `${op.name} is how a peer binds`)
          continue
        }
        assert.deepStrictEqual(
          admit?.(ctx),
          new Forbidden({
            op: op.name,
            field: "hello",
            message: `${op.name}: this connection has not said HELLO with an authorized key (hello_challenge, then hello)`
          })
        )
      }
      yield* bindTenantA
      for (const op of served) assert.strictEqual(table.byId.get(op.id)!.admit?.(ctx), undefined, op.name)
    }).pipe(Effect.provide(env())))
})
