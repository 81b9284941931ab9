/**
 * cpu_memfd with CURVE and tenants on (issue 13 item 2 with issue 14): the
 * descriptor exchange needs the connection's HELLO like any op, a memfd
 * instance belongs to the tenant that registered it, and another tenant can
 * neither unregister it nor use the token its owner was given. Real
 * sockets (ZeroMQ with CURVE, the Unix descriptor socket), real memfds.
 */
import { randomUUID } from "node:crypto"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { createMemfd, sendFds } from "../../src/native/FdPassing.ts"
import { pack, unpack } from "../../src/schema/Frame.ts"
import { makeInstanceId } from "../../src/schema/InstanceId.ts"
import { GetServerInfo, RegisterKvCache, UnregisterKvCache } from "../../src/schema/Op.ts"
import type { TensorDescriptor } from "../../src/schema/TensorDescriptor.ts"
import { Forbidden, InvalidArgument } from "../../src/schema/WireError.ts"
import { Tenancy } from "../../src/services/auth/Tenancy.ts"
import { makeMqClient, type MqClientShape } from "../../src/services/client/MqClient.ts"
import { MqServer } from "../../src/services/server/MqServer.ts"
import { layerTest } from "../../src/layers/Server.ts"
import type { DealerCurve } from "../../src/services/zmq/Sockets.ts"
import { makeTestKeys } from "../support/CurveKeys.ts"

const keys = makeTestKeys({ a: "tenantA", b: "tenantB" }, [])
const socket = join(tmpdir(), `mpcache-memfd-tenants-${randomUUID()}.fds`)
const server = layerTest({
  config: { curveSecretKeyFile: keys.serverSecretFile, curveAuthorizedKeys: keys.authorizedKeysFile, fdSocket: socket, chunkSize: 64 }
})
const clientFor = (curve: DealerCurve | undefined) =>
  Effect.flatMap(MqServer, (s) => makeMqClient({ endpoint: s.endpoint, requestTimeoutMs: 5_000, lingerMs: 0, ...(curve === undefined ? {} : { curve }) }))

const LAYER_BYTES = 2 * 16 * 16 * 2 * 16 * 2
const layer = (token: Uint8Array): TensorDescriptor => ({
  kind: "cpu_memfd",
  fd_token: token,
  fd_index: 0,
  device_uuid: "cpu",
  nbytes: LAYER_BYTES,
  dtype: "bfloat16",
  shape: [2, 16, 16, 2, 16],
  stride: [16 * 16 * 2 * 16, 16 * 2 * 16, 2 * 16, 16, 1],
  storage_offset: 0
})

/** GET_SERVER_INFO on `c`, then one memfd passed for `id`: the token. */
const tokenFor = (c: MqClientShape, id: number, fd: number) =>
  Effect.gen(function*() {
    const info = yield* c.request(GetServerInfo, [])
    assert.deepStrictEqual(info.features, ["cpu_memfd", "named_segments", "curve", "tenants", "kv_events"])
    const reply = unpack(yield* sendFds(info.fd_socket, pack({ version: 1, nonce: info.fd_nonce, instance_id: id, fds: 1 }), [fd], 5_000))
    return (reply!.value as { token: Uint8Array }).token
  })

describe("cpu_memfd with tenants (CURVE on)", () => {
  it.live("a memfd instance is its registering tenant's; another tenant can neither unregister it nor use its owner's token", () =>
    Effect.gen(function*() {
      const a = yield* clientFor(keys.clients["a"])
      const b = yield* clientFor(keys.clients["b"])
      const fd = yield* createMemfd(`mpcache-memfd-tenant-${randomUUID().slice(0, 8)}`, LAYER_BYTES)
      const register = (c: MqClientShape, id: number, token: Uint8Array) =>
        c.request(RegisterKvCache, [makeInstanceId(id), [layer(token)], "m", 1, "vllm", {}, []])

      yield* register(a, 77, yield* tokenFor(a, 77, fd))
      const tenancy = yield* Tenancy
      assert.strictEqual(yield* tenancy.tenantOf(makeInstanceId(77)), "tenantA")
      const unregister = yield* Effect.flip(b.request(UnregisterKvCache, [makeInstanceId(77)]))
      assert.instanceOf(unregister, Forbidden)
      // A re-REGISTER of A's instance by B, with a token of its own, is the tenant guard's refusal.
      const takeover = yield* Effect.flip(register(b, 77, yield* tokenFor(b, 77, fd)))
      assert.instanceOf(takeover, Forbidden)
      // A's token for a new instance, used by B: refused by the token's binding to A's connection.
      const aToken = yield* tokenFor(a, 78, fd)
      const stolen = yield* Effect.flip(register(b, 78, aToken))
      assert.instanceOf(stolen, InvalidArgument)
      assert.include(stolen.message, "was issued to another ZeroMQ connection")
      assert.strictEqual(yield* tenancy.tenantOf(makeInstanceId(78)), undefined)
      yield* register(a, 78, aToken)
      assert.strictEqual(yield* tenancy.tenantOf(makeInstanceId(78)), "tenantA")
      yield* a.request(UnregisterKvCache, [makeInstanceId(77)])
      yield* a.request(UnregisterKvCache, [makeInstanceId(78)])
      assert.strictEqual(yield* tenancy.tenantOf(makeInstanceId(77)), undefined)
    }).pipe(Effect.scoped, Effect.provide(server)))

  it.live("without HELLO (a client outside the allowlist) the connection gets no descriptor socket", () =>
    Effect.gen(function*() {
      const stranger = yield* clientFor(undefined)
      const refused = yield* Effect.flip(stranger.request(GetServerInfo, []))
      // ZAP refuses the handshake: the request is never delivered, so it times out.
      assert.strictEqual(refused._tag, "RequestTimeout")
    }).pipe(Effect.scoped, Effect.provide(server)))
})
