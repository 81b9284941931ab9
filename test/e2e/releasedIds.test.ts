/**
 * Squatting a released instance id (issue 24 item 13; docs/security.md
 * "13." and "Tenant rules"), with a real `mpcache serve` child with CURVE
 * and two tenants on real sockets: tenant B tries to register the id tenant
 * A just released — by a clean UNREGISTER, and by a reap after A's worker
 * process was SIGKILLed — so that A's re-REGISTER of its own id would be
 * `forbidden`. B is refused, told the rule and when the id frees; A gets
 * its id back; both stay served. (The grace's end is tested on the
 * TestClock in test/services/auth/Tenancy.test.ts.)
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { ClientLive } from "../../src/layers/Client.ts"
import { type InstanceId, makeInstanceId } from "../../src/schema/InstanceId.ts"
import { Ping, RegisterKvCacheEngineDrivenContext, UnregisterKvCacheEngineDrivenContext } from "../../src/schema/Op.ts"
import { Forbidden } from "../../src/schema/WireError.ts"
import { makeMqClient } from "../../src/services/client/MqClient.ts"
import type { DealerCurve } from "../../src/services/zmq/Sockets.ts"
import { startScript } from "../support/Cli.ts"
import { makeTestKeys } from "../support/CurveKeys.ts"
import { getJson, ipcEndpoint, startServer } from "../support/LiveFleet.ts"
import { childScript } from "../support/ChildScripts.ts"

const WORKER = childScript("engine-driven-worker-main")

/** The context engine-driven-worker-main.ts registers, for instance `id`. */
const context = (id: InstanceId) => ({
  instance_id: id,
  model_name: "e2e-ed-model",
  world_size: 1,
  block_size: 16,
  num_layers: 4,
  hidden_dim_size: 32,
  dtype_str: "bfloat16" as const,
  use_mla: false
})

/**
 * Asserts that `e` is B's refusal of `id`, released by A `how`: every detail key, and a message that
 * names the rule and how long ago the id was released and when it frees (together the 3600 s grace).
 */
const assertSquatRefused = (e: unknown, id: InstanceId, how: "was unregistered" | "was reaped") => {
  assert.instanceOf(e, Forbidden)
  const f = e as Forbidden
  assert.deepStrictEqual([f.code, f.op, f.instance_id, f.field, f.expected], [
    "forbidden",
    "register_kv_cache_engine_driven_context",
    String(id),
    "instance_id",
    "an id no other tenant released within the registration grace (3600 s)"
  ])
  const m = new RegExp(
    `^register_kv_cache_engine_driven_context: instance ${id} belongs to another tenant: it ${how} ([\\d.]+) s ago, and an id stays bound to its last tenant for the registration grace \\(--worker-registration-grace-seconds 3600\\) after its UNREGISTER or reap; it frees in ([\\d.]+) s\\. Nothing was changed; register under another id$`
  ).exec(f.message)
  assert.isNotNull(m, f.message)
  assert.closeTo(Number(m![1]) + Number(m![2]), 3600, 1e-6, "released ago + frees in = the grace")
  assert.strictEqual(f.actual, `another tenant's instance, ${how} ${m![1]} s ago`)
}

describe("squatting a released instance id (issue 24 item 13, real processes)", () => {
  it.live("tenant B cannot register the id tenant A released by UNREGISTER or lost to a reap; A gets it back; both stay served", () =>
    Effect.scoped(Effect.gen(function*() {
      const keys = makeTestKeys({ a: "tenantA", b: "tenantB" })
      const endpoint = ipcEndpoint()
      const { server, httpPort } = yield* startServer(endpoint, [
        "--l1-size-gb", "0.01", "--no-l1-prefault", "--worker-disconnect-grace-seconds", "1",
        "--curve-secret-key-file", keys.serverSecretFile, "--curve-authorized-keys", keys.authorizedKeysFile
      ])
      const client = (curve: DealerCurve | undefined) => makeMqClient({ endpoint, requestTimeoutMs: 10_000, lingerMs: 0, ...(curve === undefined ? {} : { curve }) })
      const a = yield* client(keys.clients["a"])
      const b = yield* client(keys.clients["b"])
      const releasedIds = Effect.map(getJson(`http://127.0.0.1:${httpPort}/api/status`), (s) => (s as { auth: { released_ids: unknown } }).auth.released_ids)

      // 1. A clean UNREGISTER.
      const x = makeInstanceId(777n)
      yield* a.request(RegisterKvCacheEngineDrivenContext, [context(x)])
      yield* a.request(UnregisterKvCacheEngineDrivenContext, [x])
      assert.deepStrictEqual(yield* releasedIds, { held: 1, dropped: 0, max: 65_536, grace_seconds: 3600 })
      assertSquatRefused(yield* Effect.flip(b.request(RegisterKvCacheEngineDrivenContext, [context(x)])), x, "was unregistered")
      assert.deepStrictEqual(yield* a.request(RegisterKvCacheEngineDrivenContext, [context(x)]), { shm_name: "", pool_size: 0 })
      assert.deepStrictEqual(yield* releasedIds, { held: 0, dropped: 0, max: 65_536, grace_seconds: 3600 }, "held again: the binding ended")

      // 2. A reap: A's worker process dies between PREPARE and COMMIT; the disconnect reaps its instance.
      const hung = yield* startScript(WORKER, [JSON.stringify({ endpoint, mode: "prepare-and-hang", seed: 5, tokenCount: 256, requestId: "hang", curve: keys.clients["a"] })])
      const [line] = yield* hung.waitForStdout(/\{.*\}\n/, 30_000)
      const lost = makeInstanceId(BigInt((JSON.parse(line) as { readonly instanceId: string }).instanceId))
      yield* hung.stop("SIGKILL")
      yield* server.waitForStderr(new RegExp(`reaped instance ${lost}: .*reason disconnect`), 30_000)
      assertSquatRefused(yield* Effect.flip(b.request(RegisterKvCacheEngineDrivenContext, [context(lost)])), lost, "was reaped")
      // A's restarted worker (a new connection with A's key) registers its id again.
      const restarted = yield* client(keys.clients["a"])
      assert.deepStrictEqual(yield* restarted.request(RegisterKvCacheEngineDrivenContext, [context(lost)]), { shm_name: "", pool_size: 0 })

      // Everyone is still served: B registers an id of its own, A's instances answer PING.
      yield* b.request(RegisterKvCacheEngineDrivenContext, [context(makeInstanceId(888n))])
      assert.deepStrictEqual(
        [yield* a.request(Ping, [x]), yield* restarted.request(Ping, [lost]), yield* b.request(Ping, [makeInstanceId(888n)])],
        [true, true, true]
      )
    })).pipe(Effect.provide(ClientLive)), 90_000)
})
