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
 *
 * And the binding of a released id (issue 24 item 13): after tenant A's
 * UNREGISTER or reap of X, tenant B's REGISTER of X is `forbidden` for the
 * registration grace (saying when X frees), A gets X back, and 1 ms past the
 * grace B may take it.
 *
 * And admission before decoding (issue 24 item 3): every guarded row refuses a
 *   peer that has not said HELLO from the peer alone, so the MQ server never
 *   decodes an unbound peer's payload; HELLO itself is always admitted.
 *
 * And ownership in the entry (issue 25 item 1):
 * - a reap whose fan-out runs while the same worker's re-REGISTER is
 *   mapping (driven by latches: the fan-out held in a target, the acquire
 *   held in the module) leaves the new entry owned by its tenant: the other
 *   tenant's UNREGISTER is `forbidden`;
 * - a tenant at `--tenant-max-mapped-bytes` whose worker's memory faults
 *   (a STORE's copy hits a shrunk segment) registers again at once, and the
 *   faulted id stays bound to it for the grace;
 * - the tenant's mapped bytes, exact after each of REGISTER_KV_CACHE,
 *   CB_REGISTER_ROPE, UNREGISTER_KV_CACHE (the RoPE state's bytes remain)
 *   and CB_UNREGISTER_ROPE.
 */
import { truncateSync } from "node:fs"
import { assert, describe, it } from "@effect/vitest"
import { Deferred, Effect, Exit, Fiber, Scope } from "effect"
import { TestClock } from "effect/testing"
import { NativeMemory } from "../../../src/native/Native.ts"
import { makeInstanceId } from "../../../src/schema/InstanceId.ts"
import {
  CbRegisterRope,
  CbUnregisterRope,
  Hello,
  HelloChallenge,
  type Op,
  OPS,
  type PayloadOf,
  PrepareStore,
  RegisterKvCache,
  RegisterKvCacheEngineDrivenContext,
  type ResponseOf,
  Store,
  UnregisterKvCache,
  UnregisterKvCacheEngineDrivenContext
} from "../../../src/schema/Op.ts"
import { Forbidden, Overloaded, type WireError } from "../../../src/schema/WireError.ts"
import { layerModulesTest, layerModulesTestBare } from "../../../src/layers/Server.ts"
import { helloProof } from "../../../src/services/auth/Curve.ts"
import { mappedBytesOf, Tenancy } from "../../../src/services/auth/Tenancy.ts"
import { noopTarget } from "../../../src/services/liveness/LivenessTarget.ts"
import { Reaper } from "../../../src/services/liveness/Reaper.ts"
import { row, type ServerModule } from "../../../src/services/server/Handler.ts"
import { makeTrackedInstances } from "../../../src/services/server/InstanceModule.ts"
import { LmcacheDrivenTransfer } from "../../../src/services/server/LmcacheDrivenTransfer.ts"
import { Handlers } from "../../../src/services/server/MqServer.ts"
import { makeTestKeys } from "../../support/CurveKeys.ts"
import { workerCache } from "../../support/LivenessEnv.ts"
import { makeTableSegment } from "../../support/RopeReference.ts"

const keys = makeTestKeys({ a: "tenantA", b: "tenantB" })
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

/** Tenant B's connection in the released-id tests (A's is `call`'s default peer). */
const PEER_B = "0b0b0b0b"

/** HELLO_CHALLENGE and HELLO with client `name`'s key: binds `peer` to its tenant. */
const bindTenant = (name: "a" | "b", tenant: string, peer?: string) =>
  Effect.gen(function*() {
    const k = keys.clients[name]!
    const nonce = yield* call(HelloChallenge, [], peer)
    const grant = yield* call(Hello, [k.publicKey, new Uint8Array(helloProof(k.secretKey, k.serverPublicKey, nonce))], peer)
    assert.deepStrictEqual(grant, { tenant, salt_group: tenant, admin: false })
  })

/** Binds `call`'s default peer to tenant A. */
const bindTenantA = bindTenant("a", "tenantA")

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

/** Bytes one `workerCache` maps: 1 layer × K and V × 4 blocks × 16 tokens × 1 head × 8 × 2 bytes (float16). */
const WORKER_CACHE_BYTES = 2 * 4 * 16 * 8 * 2

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
      assert.strictEqual(yield* tenancy.tenantOf(makeInstanceId(21n)), undefined, "the refused REGISTER claimed nothing")
      // Half a second refills ten tokens, not enough for eleven.
      yield* TestClock.adjust("500 millis")
      for (let i = 22; i <= 31; i++) yield* call(RegisterKvCacheEngineDrivenContext, [context(i)])
      assert.instanceOf(yield* Effect.flip(call(RegisterKvCacheEngineDrivenContext, [context(32)])), Overloaded)
      yield* TestClock.adjust("1 second")
      yield* call(RegisterKvCacheEngineDrivenContext, [context(21)])
      assert.strictEqual(yield* tenancy.tenantOf(makeInstanceId(21n)), "tenantA")
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
      assert.strictEqual(yield* (yield* Tenancy).tenantOf(makeInstanceId(7n)), undefined)
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

describe("a released instance id stays its tenant's for the registration grace (TestClock)", () => {
  const X = makeInstanceId(4242n)
  /** What B is told while X is bound to A: when and how A released it, and when it frees. */
  const squat = (what: "was unregistered" | "was reaped", agoSeconds: number, freesInSeconds: number) =>
    new Forbidden({
      op: "register_kv_cache_engine_driven_context",
      instance_id: "4242",
      field: "instance_id",
      expected: "an id no other tenant released within the registration grace (3600 s)",
      actual: `another tenant's instance, ${what} ${agoSeconds} s ago`,
      message:
        `register_kv_cache_engine_driven_context: instance 4242 belongs to another tenant: it ${what} ${agoSeconds} s ago, and an id stays bound to its last tenant for the registration grace (--worker-registration-grace-seconds 3600) after its UNREGISTER or reap; it frees in ${freesInSeconds} s. Nothing was changed; register under another id`
    })

  it.effect("after A's UNREGISTER of X, B's REGISTER of X is forbidden until the grace ends; A re-registers X; 1 ms past the grace B may", () =>
    Effect.gen(function*() {
      yield* bindTenantA
      yield* bindTenant("b", "tenantB", PEER_B)
      const tenancy = yield* Tenancy
      yield* call(RegisterKvCacheEngineDrivenContext, [context(4242)])
      yield* call(UnregisterKvCacheEngineDrivenContext, [X])
      assert.strictEqual(yield* tenancy.tenantOf(X), undefined, "nothing holds X")
      yield* TestClock.adjust("1000 seconds")
      assert.deepStrictEqual(yield* Effect.flip(call(RegisterKvCacheEngineDrivenContext, [context(4242)], PEER_B)), squat("was unregistered", 1000, 2600))
      assert.strictEqual(yield* tenancy.tenantOf(X), undefined, "the refused REGISTER claimed nothing")
      // A gets its id back, and releases it again: the grace starts over from this UNREGISTER.
      assert.deepStrictEqual(yield* call(RegisterKvCacheEngineDrivenContext, [context(4242)]), { shm_name: "", pool_size: 0 })
      assert.strictEqual(yield* tenancy.tenantOf(X), "tenantA")
      yield* call(UnregisterKvCacheEngineDrivenContext, [X])
      yield* TestClock.adjust("3600 seconds")
      assert.deepStrictEqual(yield* Effect.flip(call(RegisterKvCacheEngineDrivenContext, [context(4242)], PEER_B)), squat("was unregistered", 3600, 0))
      yield* TestClock.adjust("1 millis")
      yield* call(RegisterKvCacheEngineDrivenContext, [context(4242)], PEER_B)
      assert.strictEqual(yield* tenancy.tenantOf(X), "tenantB")
      // Now X is B's: A's REGISTER of it is the plain "belongs to another tenant".
      const a = yield* Effect.flip(call(RegisterKvCacheEngineDrivenContext, [context(4242)]))
      assert.strictEqual(a.message, "register_kv_cache_engine_driven_context: instance 4242 belongs to another tenant; nothing was changed")
    }).pipe(Effect.provide(env())))

  it.effect("after a reap of A's X, B's REGISTER of X is forbidden saying it was reaped; A, back from its pause, gets X again", () =>
    Effect.gen(function*() {
      yield* bindTenantA
      yield* bindTenant("b", "tenantB", PEER_B)
      const tenancy = yield* Tenancy
      yield* call(RegisterKvCacheEngineDrivenContext, [context(4242)])
      // Never pinged: the registration grace (3600 s) is its window; 1 ms past it the scan reaps it.
      yield* TestClock.adjust("3600001 millis")
      const reaped = yield* (yield* Reaper).scan(3_600_001)
      assert.deepStrictEqual(reaped.map((r) => r.id), [X])
      assert.strictEqual(yield* tenancy.tenantOf(X), undefined)
      yield* TestClock.adjust("30 seconds")
      assert.deepStrictEqual(yield* Effect.flip(call(RegisterKvCacheEngineDrivenContext, [context(4242)], PEER_B)), squat("was reaped", 30, 3570))
      yield* call(RegisterKvCacheEngineDrivenContext, [context(4242)])
      assert.strictEqual(yield* tenancy.tenantOf(X), "tenantA")
    }).pipe(Effect.provide(env())))

  it.effect("a REGISTER of X by A that fails keeps X bound to A", () =>
    Effect.gen(function*() {
      yield* bindTenantA
      yield* bindTenant("b", "tenantB", PEER_B)
      yield* call(RegisterKvCacheEngineDrivenContext, [context(4242)])
      yield* call(UnregisterKvCacheEngineDrivenContext, [X])
      // 48 does not divide the chunk size (32): invalid_argument, nothing registered.
      const bad = yield* Effect.flip(call(RegisterKvCacheEngineDrivenContext, [{ ...context(4242), block_size: 48 }]))
      assert.strictEqual(bad._tag, "InvalidArgument")
      assert.deepStrictEqual(yield* Effect.flip(call(RegisterKvCacheEngineDrivenContext, [context(4242)], PEER_B)), squat("was unregistered", 0, 3600))
    }).pipe(Effect.provide(env())))
})

/** The real per-instance core of an engine-driven-like test module ("latched"), its entries closed with `scope`. */
const latchedCore = (scope: Scope.Scope) =>
  makeTrackedInstances<{ readonly scope: Scope.Closeable }>({
    name: "latched",
    kind: "engine_driven",
    registerOp: RegisterKvCacheEngineDrivenContext.name,
    unregisterOp: UnregisterKvCacheEngineDrivenContext.name,
    differs: "another context",
    missing: "is not registered",
    remedy: "register it again",
    details: () => ({})
  }).pipe(Scope.provide(scope))

describe("an instance's owner lives in its entries (issue 25 item 1, TestClock)", () => {
  const X = makeInstanceId(4242n)
  const curve = { chunkSize: 32, curveSecretKeyFile: keys.serverSecretFile, curveAuthorizedKeys: keys.authorizedKeysFile }
  /** The `tenants` rows of /api/status: instances and mapped bytes per tenant. */
  const holdings = Effect.flatMap(Tenancy, (t) => t.status()).pipe(
    Effect.map((s) => (s["tenants"] as ReadonlyArray<{ tenant: string; instances: number; mapped_bytes: number }>).map((r) => [r.tenant, r.instances, r.mapped_bytes]))
  )

  it.effect("a reap's fan-out during the same worker's re-REGISTER leaves the new entry owned: another tenant's UNREGISTER is forbidden", () =>
    Effect.gen(function*() {
      const scope = yield* Scope.make()
      const fanOut = yield* Deferred.make<void>()
      const resumeFanOut = yield* Deferred.make<void>()
      const mapping = yield* Deferred.make<void>()
      const mapped = yield* Deferred.make<void>()
      let acquires = 0
      // A module on the real per-instance core whose second acquire (the re-REGISTER's mapping) waits on a latch.
      const core = yield* latchedCore(scope)
      const latched: ServerModule = {
        name: "latched",
        target: core.target,
        rows: [
          row(RegisterKvCacheEngineDrivenContext, "SYNC", ([c], ctx) =>
            core.register(c.instance_id, {
              owner: ctx.owner,
              same: () => true,
              acquire: (entryScope) =>
                ++acquires === 1
                  ? Effect.succeed({ scope: entryScope })
                  : Effect.as(Effect.andThen(Deferred.succeed(mapping, undefined), Deferred.await(mapped)), { scope: entryScope })
            }).pipe(Effect.as({ shm_name: "", pool_size: 0 }))),
          row(UnregisterKvCacheEngineDrivenContext, "SYNC", ([id]) => Effect.asVoid(core.unregister(id)))
        ]
      }
      // A target after it whose drop, in the reap's fan-out, waits on a latch.
      const fanOutLatch: ServerModule = {
        name: "fan-out latch",
        rows: [],
        target: {
          ...noopTarget("fan-out latch"),
          dropInstanceState: () => Effect.andThen(Deferred.succeed(fanOut, undefined), Deferred.await(resumeFanOut))
        }
      }
      yield* Effect.gen(function*() {
        yield* bindTenantA
        yield* bindTenant("b", "tenantB", PEER_B)
        const tenancy = yield* Tenancy
        yield* call(RegisterKvCacheEngineDrivenContext, [context(4242)])
        assert.strictEqual(yield* tenancy.tenantOf(X), "tenantA")
        // Never pinged: 1 ms past the registration grace the scan pops X, then waits in its fan-out.
        yield* TestClock.adjust("3600001 millis")
        const scan = yield* Effect.forkChild((yield* Reaper).scan(3_600_001))
        yield* Deferred.await(fanOut)
        assert.strictEqual(yield* tenancy.tenantOf(X), undefined, "popped")
        // A's worker registers X again; its mapping waits while the fan-out finishes.
        const again = yield* Effect.forkChild(call(RegisterKvCacheEngineDrivenContext, [context(4242)]))
        yield* Deferred.await(mapping)
        yield* Deferred.succeed(resumeFanOut, undefined)
        assert.deepStrictEqual((yield* Fiber.join(scan)).map((r) => r.id), [X])
        yield* Deferred.succeed(mapped, undefined)
        assert.deepStrictEqual(yield* Fiber.join(again), { shm_name: "", pool_size: 0 })
        assert.strictEqual(yield* tenancy.tenantOf(X), "tenantA")
        const stranger = yield* Effect.flip(call(UnregisterKvCacheEngineDrivenContext, [X], PEER_B))
        assert.deepStrictEqual(
          stranger,
          new Forbidden({
            op: "unregister_kv_cache_engine_driven_context",
            instance_id: "4242",
            field: "instance_id",
            message: "unregister_kv_cache_engine_driven_context: instance 4242 belongs to another tenant; nothing was changed"
          })
        )
        assert.isTrue(yield* core.isRegistered(X), "B's UNREGISTER changed nothing")
        assert.deepStrictEqual(yield* holdings, [["tenantA", 1, 0], ["tenantB", 0, 0]])
      }).pipe(Effect.provide(layerModulesTestBare({ config: curve, plugins: [latched, fanOutLatch] })))
      yield* Scope.close(scope, Exit.void)
    }))

  it.effect("a transfer that passed the guard before another tenant's REGISTER landed is refused by the module's own look-up, and touches nothing", () =>
    Effect.gen(function*() {
      const scope = yield* Scope.make()
      const entered = yield* Deferred.make<void>()
      const go = yield* Deferred.make<void>()
      // A module on the real per-instance core whose transfer waits on a latch between the guard and its look-up.
      const core = yield* latchedCore(scope)
      const latched: ServerModule = {
        name: "latched",
        target: core.target,
        rows: [
          row(RegisterKvCacheEngineDrivenContext, "SYNC", ([c], ctx) =>
            core.register(c.instance_id, { owner: ctx.owner, same: () => true, acquire: (entryScope) => Effect.succeed({ scope: entryScope }) })
              .pipe(Effect.as({ shm_name: "", pool_size: 0 }))),
          row(PrepareStore, "NORMAL", ([, id]) =>
            Effect.andThen(
              Effect.andThen(Deferred.succeed(entered, undefined), Deferred.await(go)),
              Effect.flatMap(core.resolveForTransfer(PrepareStore.name, id), () => Effect.die(new Error("B's transfer reached A's entry")))
            ))
        ]
      }
      yield* Effect.gen(function*() {
        yield* bindTenantA
        yield* bindTenant("b", "tenantB", PEER_B)
        const key = { model_name: "m", world_size: 1, worker_id: 0, token_ids: [1, 2], start: 0, end: 2, request_id: "r", cache_salt: "" }
        // B's PREPARE_STORE of X passes the guard (X is nobody's yet) and waits before its look-up …
        const stranger = yield* Effect.forkChild(Effect.flip(call(PrepareStore, [key, X], PEER_B)))
        yield* Deferred.await(entered)
        // … while A registers X.
        yield* call(RegisterKvCacheEngineDrivenContext, [context(4242)])
        assert.strictEqual(yield* (yield* Tenancy).tenantOf(X), "tenantA")
        yield* TestClock.adjust("5000 millis")
        yield* Deferred.succeed(go, undefined)
        assert.deepStrictEqual(
          yield* Fiber.join(stranger),
          new Forbidden({
            op: "prepare_store",
            instance_id: "4242",
            field: "instance_id",
            message: "prepare_store: instance 4242 belongs to another tenant; nothing was changed"
          })
        )
        // A's entry is as A left it: no transfer activity latched, last_seen not moved by B's request.
        const [summary] = yield* core.target.instances()
        assert.strictEqual(summary!.has_transfer_activity, false)
        assert.strictEqual(summary!.last_seen_age_seconds, 5)
      }).pipe(Effect.provide(layerModulesTestBare({ config: curve, plugins: [latched] })))
      yield* Scope.close(scope, Exit.void)
    }))

  it.effect("a tenant at --tenant-max-mapped-bytes whose worker's memory faults registers again at once; the faulted id stays its own", () =>
    Effect.gen(function*() {
      yield* bindTenantA
      yield* bindTenant("b", "tenantB", PEER_B)
      const cache = yield* workerCache
      const bytes = mappedBytesOf(cache.descriptors)
      assert.strictEqual(bytes, WORKER_CACHE_BYTES, "the limit is one worker cache")
      yield* call(RegisterKvCacheEngineDrivenContext, [context(1)]) // maps nothing: 0 bytes
      yield* call(RegisterKvCache, [X, cache.descriptors, "m", 1, "vllm", {}, []])
      assert.deepStrictEqual(yield* holdings, [["tenantA", 2, bytes], ["tenantB", 0, 0]])
      // The worker shrinks its segment: the STORE's gather faults and the context is released.
      truncateSync(`/dev/shm/${cache.segmentNames[0]!}`, 0)
      const key = { model_name: "m", world_size: 1, worker_id: 0, token_ids: Array.from({ length: 32 }, (_, i) => i), start: 0, end: 32, request_id: "r", cache_salt: "" }
      const fault = yield* Effect.flip(call(Store, [key, X, [[1, 2]], new Uint8Array(1)]))
      assert.strictEqual(fault._tag, "InvalidArgument")
      assert.deepStrictEqual(yield* holdings, [["tenantA", 1, 0], ["tenantB", 0, 0]], "the faulted context's bytes went with it")
      const fresh = yield* workerCache
      yield* call(RegisterKvCache, [makeInstanceId(4243n), fresh.descriptors, "m", 1, "vllm", {}, []])
      assert.deepStrictEqual(yield* holdings, [["tenantA", 2, bytes], ["tenantB", 0, 0]])
      // Nothing holds X now: it stays bound to A for the grace, like an UNREGISTER's.
      const squatted = yield* Effect.flip(call(RegisterKvCacheEngineDrivenContext, [context(4242)], PEER_B))
      assert.strictEqual(squatted.message.split(":").slice(0, 2).join(":"), "register_kv_cache_engine_driven_context: instance 4242 belongs to another tenant")
      assert.include(squatted.message, "it was released after a fault in its memory 0 s ago")
    }).pipe(Effect.provide(env({ tenantMaxMappedBytes: WORKER_CACHE_BYTES }))))

  it.effect("mapped bytes, exact after REGISTER_KV_CACHE, CB_REGISTER_ROPE, UNREGISTER_KV_CACHE (the RoPE state's remain) and CB_UNREGISTER_ROPE", () =>
    Effect.gen(function*() {
      yield* bindTenantA
      const cache = yield* workerCache
      const kv = mappedBytesOf(cache.descriptors)
      const table = yield* makeTableSegment(32, 8) // 32 rows of 8 float32: 1024 bytes
      const rope = mappedBytesOf([table])
      assert.notStrictEqual(kv, rope)
      yield* call(RegisterKvCache, [X, cache.descriptors, "m", 1, "vllm", {}, []])
      assert.deepStrictEqual(yield* holdings, [["tenantA", 1, kv]])
      yield* call(CbRegisterRope, [X, [table], 8, true, [0], [null]])
      assert.deepStrictEqual(yield* holdings, [["tenantA", 1, kv + rope]])
      yield* call(UnregisterKvCache, [X])
      assert.deepStrictEqual(yield* holdings, [["tenantA", 1, rope]])
      yield* call(CbUnregisterRope, [X])
      assert.deepStrictEqual(yield* holdings, [["tenantA", 0, 0]])
    }).pipe(Effect.provide(env())))
})
