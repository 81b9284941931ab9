/**
 * The LMCache-driven data path with cuda_ipc descriptors (DESIGN §3.2, §4),
 * over real sockets, against the fake libcudart (test/support/fakecudart):
 * REGISTER_KV_CACHE with device memory, STORE/RETRIEVE byte-exact,
 * descriptors sharing one IPC handle sharing one mapping, and UNREGISTER,
 * a failed REGISTER and server shutdown each closing every handle exactly
 * once (the fake's counters).
 *
 * The worker side (cudaMalloc + cudaIpcGetMemHandle, src/native/CudaExport.ts)
 * and the server share this process, and so one loaded libcudart — the fake,
 * chosen through MPCACHE_CUDART before the first CUDA call.
 * The whole suite runs with CURVE off and on (test/support/CurveMode.ts, issue 14).
 */
import { afterAll } from "vitest"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Exit, Layer, Scope } from "effect"
import { makeCudaPagedKvCache } from "../../src/services/client/CudaPagedKvCache.ts"
import { NativeMemory } from "../../src/native/Native.ts"
import type { CacheKey } from "../../src/schema/CacheKey.ts"
import { makeInstanceId } from "../../src/schema/InstanceId.ts"
import { EndSession, Lookup, QueryPrefetchStatus, RegisterKvCache, Retrieve, Store, UnregisterKvCache } from "../../src/schema/Op.ts"
import type { TensorDescriptor } from "../../src/schema/TensorDescriptor.ts"
import { InvalidArgument } from "../../src/schema/WireError.ts"
import { cudaSegmentKey } from "../../src/services/kv/KvCacheLayout.ts"
import { LmcacheDrivenTransfer } from "../../src/services/server/LmcacheDrivenTransfer.ts"
import { MqClient } from "../../src/services/client/MqClient.ts"
import type { PagedKvCache } from "../../src/services/client/PagedKvCache.ts"
import { decodeFakeHandle, FAKE_DEVICES, type FakeCudartState, readFakeState, removeFakeCudart, useFakeCudartInProcess } from "../support/FakeCudart.ts"
import { verifyTokens, writeTokens } from "../support/KvData.ts"
import { CURVE_MODES, curveFixture } from "../support/CurveMode.ts"
import { testServer } from "../support/TestServer.ts"

const fake = useFakeCudartInProcess()
afterAll(() => removeFakeCudart(fake))
const [DEV0, DEV1] = FAKE_DEVICES

const CHUNK = 32
const geometry = { numLayers: 3, numBlocks: 64, blockSizeTokens: 16, numHeads: 2, headSize: 8, dtype: "float16" as const }
const tokens = Array.from({ length: 200 }, (_, i) => (i * 7 + 3) % 5000)
const EVENT = new Uint8Array([4, 5, 6])

const key = (over: Partial<CacheKey> = {}): CacheKey => ({
  model_name: "tiny",
  world_size: 1,
  worker_id: 0,
  token_ids: tokens,
  start: 0,
  end: 128,
  request_id: "r1",
  cache_salt: "",
  ...over
})

const register = (id: bigint, descriptors: ReadonlyArray<TensorDescriptor>) =>
  Effect.gen(function*() {
    const client = yield* MqClient
    yield* client.request(RegisterKvCache, [makeInstanceId(id), descriptors, "tiny", 1, "vllm", {}, []])
  })
const unregister = (id: bigint) =>
  Effect.gen(function*() {
    const client = yield* MqClient
    yield* client.request(UnregisterKvCache, [makeInstanceId(id)])
  })

const since = (before: FakeCudartState) => {
  const now = readFakeState(fake)
  return {
    ipcOpens: now.ipcOpens - before.ipcOpens,
    ipcCloses: now.ipcCloses - before.ipcCloses,
    violations: now.violations - before.violations,
    peerOpens: now.peerOpens - before.peerOpens
  }
}
const slotsOf = (cache: { readonly descriptors: ReadonlyArray<TensorDescriptor> }) => {
  const state = readFakeState(fake)
  const slots = new Set(cache.descriptors.map((d) => decodeFakeHandle(d.ipc_handle!).slot))
  return [...slots].map((s) => state.slots[s]!)
}

describe.each(CURVE_MODES)("cuda_ipc through the server (CURVE $curve)", ({ curve }) => {
  const fx = curveFixture(curve)

  const env = () => testServer({ curve: fx, config: { chunkSize: CHUNK } })

  describe("cuda_ipc through the server (fake libcudart)", () => {
    it.live("REGISTER device memory, STORE from one cache, RETRIEVE into another byte-exact; UNREGISTER closes each handle once", () =>
      Effect.gen(function*() {
        const client = yield* MqClient
        const transfer = yield* LmcacheDrivenTransfer
        // A: one allocation for the three layers (one handle, three storage offsets); B: one per layer, on the other device.
        const a = yield* makeCudaPagedKvCache({ ...geometry, deviceUuid: DEV0 })
        const b = yield* makeCudaPagedKvCache({ ...geometry, deviceUuid: DEV1, allocation: "per-layer" })
        assert.deepStrictEqual(a.descriptors.map((d) => d.kind), ["cuda_ipc", "cuda_ipc", "cuda_ipc"])
        assert.strictEqual(new Set(a.descriptors.map((d) => Buffer.from(d.ipc_handle!).toString("hex"))).size, 1)
        const before = readFakeState(fake)

        yield* register(1n, a.descriptors)
        assert.deepStrictEqual(since(before), { ipcOpens: 1, ipcCloses: 0, violations: 0, peerOpens: 0 }, "one mapping per distinct handle")
        yield* register(2n, b.descriptors)
        assert.strictEqual(since(before).ipcOpens, 4)
        const entryA = (yield* transfer.contextOf(makeInstanceId(1n)))!
        assert.deepStrictEqual([...entryA.mappings.keys()], [cudaSegmentKey(DEV0, a.descriptors[0]!.ipc_handle!)])
        assert.strictEqual((yield* transfer.contextOf(makeInstanceId(2n)))!.mappings.size, 3)
        // A REGISTER of the same memory is a refresh: nothing reopened.
        yield* register(1n, a.descriptors)
        assert.strictEqual(since(before).ipcOpens, 4)

        const blocksA = [1, 2, 3, 4, 5, 6, 7, 8]
        const blocksB = [40, 41, 30, 31, 20, 21, 10, 11]
        yield* writeTokens(a, 7, blocksA)
        assert.deepStrictEqual(yield* client.request(Store, [key(), makeInstanceId(1n), [blocksA], EVENT]), [EVENT, true])
        yield* client.request(Lookup, [key({ worker_id: null }), 1])
        assert.strictEqual(yield* client.request(QueryPrefetchStatus, ["r1"]), 4)
        assert.deepStrictEqual(yield* client.request(Retrieve, [key(), makeInstanceId(2n), [blocksB], EVENT, 0]), [EVENT, true])
        assert.deepStrictEqual(yield* verifyTokens(b, 7, blocksB), [])
        yield* client.request(EndSession, ["r1"])

        yield* unregister(1n)
        assert.deepStrictEqual(since(before), { ipcOpens: 4, ipcCloses: 1, violations: 0, peerOpens: 0 })
        assert.deepStrictEqual(slotsOf(a).map((s) => [s.opens, s.closes, s.importRefs]), [[1, 1, 0]])
        yield* unregister(2n)
        yield* unregister(2n) // unknown by now: a warning, no second close
        assert.deepStrictEqual(since(before), { ipcOpens: 4, ipcCloses: 4, violations: 0, peerOpens: 0 })
        assert.deepStrictEqual(slotsOf(b).map((s) => [s.opens, s.closes, s.importRefs]), [[1, 1, 0], [1, 1, 0], [1, 1, 0]])
      }).pipe(Effect.scoped, Effect.provide(env())))

    it.live("bad cuda_ipc descriptors are refused with invalid_argument naming the field; a failed REGISTER leaves no handle open", () =>
      Effect.gen(function*() {
        const a = yield* makeCudaPagedKvCache({ ...geometry, numLayers: 2, deviceUuid: DEV0, allocation: "per-layer" })
        const bad = (descriptors: ReadonlyArray<TensorDescriptor>) => Effect.flip(register(9n, descriptors))
        const first = a.descriptors[0]!
        const before = readFakeState(fake)

        const { ipc_handle: _dropped, ...noHandle } = first
        const missing = yield* bad([noHandle])
        assert.instanceOf(missing, InvalidArgument)
        assert.strictEqual(missing.message, "register_kv_cache: kv_caches[0].ipc_handle: required for a cuda_ipc descriptor (the 64-byte cudaIpcMemHandle_t)")
        const short = yield* bad([{ ...first, ipc_handle: first.ipc_handle!.subarray(0, 32) }])
        assert.strictEqual(short.message, "register_kv_cache: kv_caches[0].ipc_handle: expected the 64-byte cudaIpcMemHandle_t, got 32 bytes")
        const cpu = yield* bad([{ ...first, device_uuid: "cpu" }])
        assert.include(cpu.message, "kv_caches[0].device_uuid: expected the GPU's UUID")
        const unknown = "GPU-facec0da-0000-4000-8000-00000000000f"
        const notHere = yield* bad([{ ...first, device_uuid: unknown }])
        assert.instanceOf(notHere, InvalidArgument)
        assert.strictEqual(
          notHere.message,
          `register_kv_cache: openCudaIpcMapping: device_uuid ${unknown} is not a CUDA device of this host (devices: ${DEV0}, ${DEV1})`
        )
        assert.deepStrictEqual(since(before), { ipcOpens: 0, ipcCloses: 0, violations: 0, peerOpens: 0 })

        // Layer 0 opens, layer 1's handle is refused by cudaIpcOpenMemHandle: layer 0's mapping is closed again.
        const garbage = new Uint8Array(64).fill(7)
        const halfway = yield* bad([first, { ...a.descriptors[1]!, ipc_handle: garbage }])
        assert.instanceOf(halfway, InvalidArgument)
        assert.deepStrictEqual(
          (({ _tag, op, instance_id, field, expected, actual, message }) => ({ _tag, op, instance_id, field, expected, actual, message }))(halfway),
          {
            _tag: "InvalidArgument",
            op: "register_kv_cache",
            instance_id: "9",
            field: "kv_caches[1]",
            expected: `a CUDA IPC handle from cudaIpcGetMemHandle of a live process on this host, on device ${DEV0}`,
            actual: "cudaIpcOpenMemHandle failed with cudaErrorInvalidValue (cudaError 1: invalid argument)",
            message: `register_kv_cache: instance 9: kv_caches[1] (cuda_ipc on device ${DEV0}): the CUDA driver refused the IPC handle: cudaIpcOpenMemHandle failed with cudaErrorInvalidValue (cudaError 1: invalid argument); expected a handle from cudaIpcGetMemHandle of a live process on this host, on that device; nothing of the instance is kept`
          }
        )
        assert.deepStrictEqual(since(before), { ipcOpens: 1, ipcCloses: 1, violations: 0, peerOpens: 0 })
        assert.isFalse(yield* (yield* LmcacheDrivenTransfer).isRegistered(makeInstanceId(9n)))
      }).pipe(Effect.scoped, Effect.provide(env())))

    it.live("server shutdown closes every handle still registered, once", () =>
      Effect.gen(function*() {
        const before = readFakeState(fake)
        const serverScope = yield* Scope.make()
        const context = yield* Layer.buildWithScope(env(), serverScope)
        const { caches, openMappings } = yield* Effect.gen(function*() {
          const a = yield* makeCudaPagedKvCache({ ...geometry, deviceUuid: DEV1 })
          const b = yield* makeCudaPagedKvCache({ ...geometry, deviceUuid: DEV0, allocation: "per-layer" })
          yield* register(1n, a.descriptors)
          yield* register(2n, b.descriptors)
          const caches: ReadonlyArray<PagedKvCache> = [a, b]
          return { caches, openMappings: (yield* NativeMemory).stats().openMappings }
        }).pipe(Scope.provide(serverScope), Effect.provide(context))
        assert.strictEqual(since(before).ipcOpens, 4)
        // The L1 pool, the workers' 4 allocations and the server's 4 IPC mappings.
        assert.strictEqual(openMappings, 1 + 4 + 4)
        yield* Scope.close(serverScope, Exit.void)
        assert.deepStrictEqual(since(before), { ipcOpens: 4, ipcCloses: 4, violations: 0, peerOpens: 0 })
        for (const cache of caches) {
          for (const slot of slotsOf(cache)) assert.deepStrictEqual([slot.opens, slot.closes, slot.importRefs, slot.freed], [1, 1, 0, true])
        }
      }))
  })
})
