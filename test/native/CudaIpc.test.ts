/**
 * The cuda_ipc backend of the native addon (DESIGN §3.2, §4) against the fake
 * libcudart (test/support/fakecudart): libcudart found through MPCACHE_CUDART
 * at run time, device selection by UUID, IPC handles opened and closed,
 * gather/scatter through a CUDA stream, close waiting for copies in flight,
 * one release per mapping whichever path comes first, and a clear refusal
 * when no libcudart can be loaded (in a child process: the library is loaded
 * once per process).
 *
 * The fake's counters are shared by every process loading it; this file's
 * tests run one after another, so they compare before/after deltas.
 */
import { spawnSync } from "node:child_process"
import { afterAll } from "vitest"
import { assert, describe, it } from "@effect/vitest"
import { Context, Effect, Exit, Fiber, Layer, Scope } from "effect"
import { NativeMemoryLive } from "../../src/layers/NativeMemory.ts"
import { NativeError, NativeMemory } from "../../src/native/Native.ts"
import { cudaSegmentKey } from "../../src/services/kv/KvCacheLayout.ts"
import { InvalidArgument } from "../../src/schema/WireError.ts"
import {
  decodeFakeHandle,
  FAKE_DEVICES,
  type FakeCudartState,
  readFakeState,
  removeFakeCudart,
  setFakeCopyDelay,
  useFakeCudartInProcess
} from "../support/FakeCudart.ts"
import { childScript } from "../support/ChildScripts.ts"

// Before any CUDA call of this process: the addon loads libcudart on the first one.
const fake = useFakeCudartInProcess()
afterAll(() => removeFakeCudart(fake))
const [DEV0, DEV1] = FAKE_DEVICES
const PROBE = childScript("cuda-probe")
const KiB = 1024

const pattern = (n: number, seed: number): Uint8Array => {
  const out = new Uint8Array(n)
  for (let i = 0; i < n; i++) out[i] = (i * 31 + seed) % 251 + 1
  return out
}
const sameBytes = (a: Uint8Array, b: Uint8Array): boolean => Buffer.compare(a, b) === 0
const hex = (b: Uint8Array) => Buffer.from(b).toString("hex")

/** Counter deltas since `before`. */
const since = (before: FakeCudartState) => {
  const now = readFakeState(fake)
  return {
    ipcOpens: now.ipcOpens - before.ipcOpens,
    ipcCloses: now.ipcCloses - before.ipcCloses,
    streamsCreated: now.streamsCreated - before.streamsCreated,
    streamsDestroyed: now.streamsDestroyed - before.streamsDestroyed,
    violations: now.violations - before.violations,
    peerOpens: now.peerOpens - before.peerOpens
  }
}
const slotOf = (handle: Uint8Array) => readFakeState(fake).slots[decodeFakeHandle(handle).slot]!

describe("CUDA backend through the fake libcudart", () => {
  it.effect("MPCACHE_CUDART selects the library; its two devices are listed with their UUIDs", () =>
    Effect.gen(function*() {
      const mem = yield* NativeMemory
      assert.deepStrictEqual(yield* mem.cudaBackend(), {
        available: true,
        reason: "",
        library: fake.library,
        tried: [fake.library],
        devices: [{ ordinal: 0, uuid: DEV0 }, { ordinal: 1, uuid: DEV1 }]
      })
      assert.isTrue(yield* mem.cudaAvailable())
    }).pipe(Effect.provide(NativeMemoryLive)))

  it.effect("an exported allocation's 64-byte handle decodes to its fake segment; opened, it is a mapping named after it", () =>
    Effect.gen(function*() {
      const mem = yield* NativeMemory
      const before = readFakeState(fake)
      const alloc = yield* mem.allocateCuda(DEV1, 64 * KiB)
      assert.strictEqual(alloc.ipcHandle.length, 64)
      assert.strictEqual(alloc.deviceUuid, DEV1)
      assert.strictEqual(alloc.sizeBytes, 64 * KiB)
      const decoded = decodeFakeHandle(alloc.ipcHandle)
      assert.strictEqual(decoded.magic, "FAKECUDA")
      assert.strictEqual(decoded.device, 1, "allocated on the device the UUID names")
      assert.strictEqual(decoded.size, 64 * KiB)
      assert.match(decoded.segment, /^\/fakecuda-\d+-\d+-\d+$/)
      assert.deepStrictEqual(mem.stats(), { openMappings: 1, mappedBytes: 64 * KiB })

      const mapping = yield* mem.mapCudaIpc(alloc.ipcHandle, DEV1, 64 * KiB)
      assert.strictEqual(mapping.name, `cuda:${DEV1}:${hex(alloc.ipcHandle)}`)
      assert.strictEqual(mapping.name, cudaSegmentKey(DEV1, alloc.ipcHandle), "the name is the layout's segment key")
      assert.strictEqual(mapping.sizeBytes, 64 * KiB)
      assert.isFalse(mapping.isClosed())
      assert.deepStrictEqual(mem.stats(), { openMappings: 2, mappedBytes: 128 * KiB })
      assert.deepStrictEqual(since(before), {
        ipcOpens: 1,
        ipcCloses: 0,
        streamsCreated: 2,
        streamsDestroyed: 0,
        violations: 0,
        peerOpens: 0
      })
      assert.include(slotOf(alloc.ipcHandle), { opens: 1, importRefs: 1, closes: 0 })

      const short = yield* Effect.flip(Effect.scoped(mem.mapCudaIpc(alloc.ipcHandle.subarray(0, 63), DEV1, 4096)))
      assert.instanceOf(short, InvalidArgument)
      assert.strictEqual(short.message, "openCudaIpcMapping: the IPC handle must be 64 bytes (a cudaIpcMemHandle_t), got 63")
      // A handle the driver refuses: a CudaFault naming the mapping, the device and the CUDA error (issue 13 item 4).
      const garbage = yield* Effect.flip(Effect.scoped(mem.mapCudaIpc(new Uint8Array(64), DEV1, 4096)))
      assert.instanceOf(garbage, NativeError)
      const segment = cudaSegmentKey(DEV1, new Uint8Array(64))
      assert.deepStrictEqual(
        garbage._tag === "NativeError"
          ? { errno: garbage.errno, call: garbage.call, segment: garbage.segment, device: garbage.device, cudaError: garbage.cudaError, cudaErrorName: garbage.cudaErrorName, cudaErrorString: garbage.cudaErrorString }
          : {},
        { errno: "EINVAL_HANDLE", call: "cudaIpcOpenMemHandle", segment, device: DEV1, cudaError: 1, cudaErrorName: "cudaErrorInvalidValue", cudaErrorString: "invalid argument" }
      )
      assert.strictEqual(
        garbage.message,
        `openCudaIpcMapping: cudaIpcOpenMemHandle failed: invalid argument (cudaErrorInvalidValue, cudaError 1) for ${segment}; expected a handle from cudaIpcGetMemHandle of a live process on this host, on that device`
      )
      const zero = yield* Effect.flip(Effect.scoped(mem.mapCudaIpc(alloc.ipcHandle, DEV1, 0)))
      assert.instanceOf(zero, InvalidArgument)
      assert.include(zero.message, "must be an integer >= 1")
      assert.deepStrictEqual(mem.stats(), { openMappings: 2, mappedBytes: 128 * KiB })
    }).pipe(Effect.scoped, Effect.provide(NativeMemoryLive)))

  it.effect("the device is chosen by its UUID (any spelling); an unknown or malformed UUID is an InvalidArgument", () =>
    Effect.gen(function*() {
      const mem = yield* NativeMemory
      const on0 = yield* mem.allocateCuda(DEV0, 4 * KiB)
      assert.strictEqual(decodeFakeHandle(on0.ipcHandle).device, 0)
      const before = readFakeState(fake)
      // Bare, upper-case, no dashes: the same device 0, so the fake sees the open on its own device.
      yield* mem.mapCudaIpc(on0.ipcHandle, "FACEC0DA000040008000000000000000", 4 * KiB)
      assert.deepStrictEqual(since(before).peerOpens, 0)
      // Declared on device 1: opened with device 1 current (a peer open in the fake's books).
      yield* mem.mapCudaIpc(on0.ipcHandle, DEV1, 4 * KiB)
      assert.deepStrictEqual(since(before).peerOpens, 1)
      assert.strictEqual(since(before).ipcOpens, 2)

      const unknown = "GPU-facec0da-0000-4000-8000-000000000009"
      const notHere = yield* Effect.flip(Effect.scoped(mem.mapCudaIpc(on0.ipcHandle, unknown, 4 * KiB)))
      assert.instanceOf(notHere, InvalidArgument)
      assert.strictEqual(
        notHere.message,
        `openCudaIpcMapping: device_uuid ${unknown} is not a CUDA device of this host (devices: ${DEV0}, ${DEV1})`
      )
      const malformed = yield* Effect.flip(Effect.scoped(mem.mapCudaIpc(on0.ipcHandle, "GPU-1", 4 * KiB)))
      assert.instanceOf(malformed, InvalidArgument)
      assert.include(malformed.message, `device_uuid "GPU-1" is not a GPU UUID`)
      const allocUnknown = yield* Effect.flip(Effect.scoped(mem.allocateCuda(unknown, 4 * KiB)))
      assert.instanceOf(allocUnknown, InvalidArgument)
      assert.include(allocUnknown.message, "cudaAllocate: device_uuid")
      const memInfoUnknown = yield* Effect.flip(mem.cudaMemInfo(unknown))
      assert.instanceOf(memInfoUnknown, InvalidArgument)
      assert.strictEqual(since(before).ipcOpens, 2, "refused opens never reach cudaIpcOpenMemHandle")
    }).pipe(Effect.scoped, Effect.provide(NativeMemoryLive)))

  it.effect("gather and scatter are byte-exact across the exporter's allocation and the IPC mapping, each synchronised", () =>
    Effect.gen(function*() {
      const mem = yield* NativeMemory
      const size = 256 * KiB
      const alloc = yield* mem.allocateCuda(DEV1, size)
      const mapping = yield* mem.mapCudaIpc(alloc.ipcHandle, DEV1, size)
      const src = pattern(10_000, 7)
      // Scatter non-contiguous ranges through the exporter's allocation …
      yield* mem.scatter(alloc, new Float64Array([128 * KiB, 0, 4096, 100, 5000, 3000, size - 1000, 9000, 1000, 0, 4096, 0]), src)
      // … and read them back through the server's IPC mapping, in another layout.
      const back = new Uint8Array(8096)
      const syncsBefore = readFakeState(fake).syncs
      yield* mem.gather(mapping, new Float64Array([size - 1000, 0, 1000, 128 * KiB, 1000, 4096, 100, 5096, 3000]), back)
      assert.strictEqual(readFakeState(fake).syncs - syncsBefore, 1, "one cudaStreamSynchronize per copy")
      const expected = new Uint8Array(8096)
      expected.set(src.subarray(9000, 10_000), 0)
      expected.set(src.subarray(0, 4096), 1000)
      expected.set(src.subarray(5000, 8000), 5096)
      assert.isTrue(sameBytes(back, expected))

      // The other way: the server scatters, the exporter sees it.
      const fromServer = pattern(64 * KiB, 99)
      yield* mem.scatter(mapping, new Float64Array([64 * KiB, 0, 64 * KiB]), fromServer)
      const seen = new Uint8Array(64 * KiB)
      yield* mem.gather(alloc, new Float64Array([64 * KiB, 0, 64 * KiB]), seen)
      assert.isTrue(sameBytes(seen, fromServer))

      // The shm backend's range checks hold for CUDA mappings too.
      const past = yield* Effect.flip(mem.gather(mapping, new Float64Array([size - 10, 0, 11]), new Uint8Array(11)))
      assert.instanceOf(past, InvalidArgument)
      assert.include(past.message, `gather on segment ${mapping.name}: range #0`)
      assert.include(past.message, `exceeds the mapping: mappingOffset + length must be <= ${size} bytes`)
      // Device memory has no host view; prefault is a no-op.
      const view = yield* Effect.flip(mem.view(mapping))
      assert.instanceOf(view, NativeError)
      assert.include(view.message, "is CUDA device memory, which has no host view")
      yield* mem.prefault(mapping, 0, size)
      assert.strictEqual(readFakeState(fake).violations, 0)
    }).pipe(Effect.scoped, Effect.provide(NativeMemoryLive)))

  it.live("closing the scope during slow copies waits for them, then closes the IPC handle and destroys the stream once", () =>
    Effect.gen(function*() {
      const mem = yield* NativeMemory
      const size = 64 * KiB
      const alloc = yield* mem.allocateCuda(DEV0, size)
      const src = pattern(size, 3)
      yield* mem.scatter(alloc, new Float64Array([0, 0, size]), src)
      const scope = yield* Scope.make()
      const mapping = yield* mem.mapCudaIpc(alloc.ipcHandle, DEV0, size).pipe(Scope.provide(scope))
      const before = readFakeState(fake)

      setFakeCopyDelay(fake, 150)
      yield* Effect.addFinalizer(() => Effect.sync(() => setFakeCopyDelay(fake, 0)))
      const dest = new Uint8Array(size)
      // Four ranges: four queued cudaMemcpyAsync of 150 ms each on the mapping's stream.
      const copy = yield* Effect.forkChild(
        mem.gather(mapping, new Float64Array([0, 0, size / 4, size / 4, size / 4, size / 4, size / 2, size / 2, size / 4, 3 * size / 4, 3 * size / 4, size / 4]), dest),
        { startImmediately: true }
      )
      const close = yield* Effect.forkChild(Scope.close(scope, Exit.void), { startImmediately: true })
      assert.isTrue(mapping.isClosed())
      const late = yield* Effect.flip(mem.scatter(mapping, new Float64Array([0, 0, 1]), new Uint8Array(1)))
      assert.strictEqual(late._tag === "NativeError" ? late.errno : late._tag, "ECLOSED")
      yield* Effect.sleep("200 millis")
      assert.strictEqual(since(before).ipcCloses, 0, "the handle is still open while the copy runs")
      assert.deepStrictEqual(mem.stats(), { openMappings: 2, mappedBytes: 2 * size })

      yield* Fiber.join(copy)
      yield* Fiber.join(close)
      assert.isTrue(sameBytes(dest, src))
      assert.strictEqual(mapping.releases(), 1)
      assert.deepStrictEqual(since(before), {
        ipcOpens: 0,
        ipcCloses: 1,
        streamsCreated: 0,
        streamsDestroyed: 1,
        violations: 0,
        peerOpens: 0
      })
      assert.include(slotOf(alloc.ipcHandle), { opens: 1, closes: 1, importRefs: 0 })
      assert.deepStrictEqual(mem.stats(), { openMappings: 1, mappedBytes: size })
    }).pipe(Effect.scoped, Effect.provide(NativeMemoryLive)))

  it.live("device memory stays in use while the server holds the handle, and comes back when it closes it", () =>
    Effect.gen(function*() {
      const mem = yield* NativeMemory
      const size = 8 * 1024 * KiB
      const baseline = (yield* mem.cudaMemInfo(DEV1)).free
      const exporterScope = yield* Scope.make()
      const alloc = yield* mem.allocateCuda(DEV1, size).pipe(Scope.provide(exporterScope))
      assert.strictEqual((yield* mem.cudaMemInfo(DEV1)).free, baseline - size)
      const serverScope = yield* Scope.make()
      yield* mem.mapCudaIpc(alloc.ipcHandle, DEV1, size).pipe(Scope.provide(serverScope))
      // The exporter frees (or dies): the server's mapping keeps the memory alive …
      yield* Scope.close(exporterScope, Exit.void)
      assert.strictEqual((yield* mem.cudaMemInfo(DEV1)).free, baseline - size)
      // … until the server closes its handle.
      yield* Scope.close(serverScope, Exit.void)
      assert.strictEqual((yield* mem.cudaMemInfo(DEV1)).free, baseline)
      assert.isTrue(slotOf(alloc.ipcHandle).unlinked)
    }).pipe(Effect.scoped, Effect.provide(NativeMemoryLive)))
})

describe("one IPC close per mapping, whichever release comes first", () => {
  const buildLayer = Effect.gen(function*() {
    const layerScope = yield* Scope.make()
    const context = yield* Layer.buildWithScope(Layer.fresh(NativeMemoryLive), layerScope)
    return { layerScope, mem: Context.get(context, NativeMemory) }
  })

  /** An exporter allocation in a layer of its own, both living until the end of the test. */
  const exported = (size: number) =>
    Effect.gen(function*() {
      const mem = Context.get(yield* Layer.build(Layer.fresh(NativeMemoryLive)), NativeMemory)
      const alloc = yield* mem.allocateCuda(DEV1, size)
      yield* mem.scatter(alloc, new Float64Array([0, 0, size]), pattern(size, 5))
      return alloc
    })

  it.live("scope first, then layer shutdown", () =>
    Effect.gen(function*() {
      const alloc = yield* exported(4 * KiB)
      const { layerScope, mem } = yield* buildLayer
      const before = readFakeState(fake)
      const mapScope = yield* Scope.make()
      const mapping = yield* mem.mapCudaIpc(alloc.ipcHandle, DEV1, 4 * KiB).pipe(Scope.provide(mapScope))
      yield* Scope.close(mapScope, Exit.void)
      yield* Scope.close(layerScope, Exit.void)
      assert.strictEqual(mapping.releases(), 1)
      assert.deepStrictEqual(since(before), {
        ipcOpens: 1,
        ipcCloses: 1,
        streamsCreated: 1,
        streamsDestroyed: 1,
        violations: 0,
        peerOpens: 0
      })
    }).pipe(Effect.scoped))

  it.live("layer shutdown first, with a slow copy in flight, then the scope", () =>
    Effect.gen(function*() {
      const size = 16 * KiB
      const alloc = yield* exported(size)
      const { layerScope, mem } = yield* buildLayer
      const before = readFakeState(fake)
      const mapScope = yield* Scope.make()
      const mapping = yield* mem.mapCudaIpc(alloc.ipcHandle, DEV1, size).pipe(Scope.provide(mapScope))
      setFakeCopyDelay(fake, 200)
      yield* Effect.addFinalizer(() => Effect.sync(() => setFakeCopyDelay(fake, 0)))
      const dest = new Uint8Array(size)
      const copy = yield* Effect.forkChild(mem.gather(mapping, new Float64Array([0, 0, size]), dest), {
        startImmediately: true
      })
      yield* Scope.close(layerScope, Exit.void) // server shutdown: waits for the copy, then closes the handle
      assert.strictEqual(since(before).ipcCloses, 1)
      yield* Fiber.join(copy)
      assert.isTrue(sameBytes(dest, pattern(size, 5)))
      yield* Scope.close(mapScope, Exit.void) // unregister after shutdown: a no-op
      assert.strictEqual(mapping.releases(), 1)
      assert.deepStrictEqual(since(before), {
        ipcOpens: 1,
        ipcCloses: 1,
        streamsCreated: 1,
        streamsDestroyed: 1,
        violations: 0,
        peerOpens: 0
      })
      const refused = yield* Effect.flip(Effect.scoped(mem.mapCudaIpc(alloc.ipcHandle, DEV1, size)))
      assert.strictEqual(refused._tag === "NativeError" ? refused.errno : refused._tag, "ECLOSED")
    }).pipe(Effect.scoped))

  it.live("scope and layer closing concurrently", () =>
    Effect.gen(function*() {
      const alloc = yield* exported(4 * KiB)
      const { layerScope, mem } = yield* buildLayer
      const before = readFakeState(fake)
      const mapScope = yield* Scope.make()
      const mapping = yield* mem.mapCudaIpc(alloc.ipcHandle, DEV1, 4 * KiB).pipe(Scope.provide(mapScope))
      yield* Effect.all([Scope.close(mapScope, Exit.void), Scope.close(layerScope, Exit.void)], { concurrency: "unbounded" })
      assert.strictEqual(mapping.releases(), 1)
      assert.strictEqual(since(before).ipcCloses, 1)
      assert.strictEqual(since(before).violations, 0)
      assert.include(slotOf(alloc.ipcHandle), { opens: 1, closes: 1, importRefs: 0 })
    }).pipe(Effect.scoped))
})

describe("no usable libcudart (a process of its own)", () => {
  const probe = (env: Record<string, string>) => {
    const run = spawnSync(process.execPath, [PROBE], { encoding: "utf8", env: { ...process.env, ...env }, timeout: 30_000 })
    assert.strictEqual(run.status, 0, run.stderr)
    return JSON.parse(run.stdout.trim().split("\n").pop() ?? "{}") as {
      info: { available: boolean; reason: string; tried: ReadonlyArray<string> }
      map: { tag: string; message: string }
      allocate: { tag: string; message: string }
      register: { tag: string; message: string }
    }
  }

  it("library not found: mapping and registering cuda_ipc are InvalidArguments saying so", () => {
    const missing = "/nonexistent/libcudart.so"
    const out = probe({ MPCACHE_CUDART: missing })
    const why = `libcudart not found: tried ${missing}`
    assert.deepStrictEqual(out.info, { available: false, reason: why, library: "", tried: [missing], devices: [] } as never)
    assert.deepStrictEqual(out.map, { tag: "InvalidArgument", message: `CUDA IPC backend not available on this host (${why})` })
    assert.deepStrictEqual(out.allocate, out.map)
    assert.deepStrictEqual(out.register, {
      tag: "InvalidArgument",
      message: `register_kv_cache: kv_caches[0].kind: cuda_ipc: CUDA IPC backend not available on this host (${why})`
    })
  })

  it("library loads but reports no device: the same refusal, with cudart's reason", () => {
    const out = probe({ MPCACHE_CUDART: fake.library, FAKECUDART_DEVICES: "0" })
    assert.isFalse(out.info.available)
    assert.strictEqual(
      out.info.reason,
      `${fake.library} loaded, but cudaGetDeviceCount failed: no CUDA-capable device is detected (cudaErrorNoDevice, cudaError 100)`
    )
    assert.strictEqual(out.register.tag, "InvalidArgument")
    assert.include(out.register.message, "CUDA IPC backend not available on this host")
  })

  it("a library without the runtime's symbols is not a backend", () => {
    const out = probe({ MPCACHE_CUDART: "libm.so.6" })
    assert.isFalse(out.info.available)
    assert.match(out.info.reason, /^libm\.so\.6 lacks symbol cuda\w+$/)
    assert.include(out.map.message, "CUDA IPC backend not available on this host (libm.so.6 lacks symbol")
  })
})
