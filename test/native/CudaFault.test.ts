/**
 * CUDA failures through the facade (issue 13 item 4), in-process against the
 * fake libcudart made to fail on demand (FakeCudart.ts setFakeFailure): the
 * importing side's cudaIpcOpenMemHandle refused, a cudaMemcpyAsync refused,
 * a copy lost under it with the error reported by cudaStreamSynchronize;
 * each a NativeError that is a CudaFault naming the mapping, the device and
 * the CUDA error (name and string), counted once in `cudaFaults()`. The
 * exporter's own copies (this process's allocation) never fail. Modes once
 * and always only: a sticky failure would break this process's fake CUDA for
 * the tests after it (the e2e test has it, test/e2e/cudaFault.test.ts).
 */
import { afterAll } from "vitest"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { NativeMemoryLive } from "../../src/layers/NativeMemory.ts"
import { isCudaFault, NativeError, NativeMemory } from "../../src/native/Native.ts"
import { cudaSegmentKey } from "../../src/services/kv/KvCacheLayout.ts"
import {
  clearFakeFailure,
  CUDA_ERRORS,
  FAKE_DEVICES,
  readFakeState,
  removeFakeCudart,
  setFakeFailure,
  useFakeCudartInProcess
} from "../support/FakeCudart.ts"

// Before any CUDA call of this process: the addon loads libcudart on the first one.
const fake = useFakeCudartInProcess()
afterAll(() => removeFakeCudart(fake))
const [DEV0] = FAKE_DEVICES
const KiB = 1024

const pattern = Uint8Array.from({ length: 16 * KiB }, (_, i) => (i * 13 + 5) % 251 + 1)
const all = new Float64Array([0, 0, 16 * KiB])

/** The fault fields of a CUDA failure, as data. */
const faultOf = (e: NativeError | { readonly _tag: string }) =>
  e instanceof NativeError
    ? {
      errno: e.errno,
      call: e.call,
      segment: e.segment,
      device: e.device,
      cudaError: e.cudaError,
      cudaErrorName: e.cudaErrorName,
      cudaErrorString: e.cudaErrorString,
      message: e.message
    }
    : { tag: e._tag }

/** An allocation of this process and the IPC mapping of it (the imported side, where failures are injected). */
const exportedAndImported = Effect.gen(function*() {
  const mem = yield* NativeMemory
  const alloc = yield* mem.allocateCuda(DEV0, 16 * KiB)
  const mapping = yield* mem.mapCudaIpc(alloc.ipcHandle, DEV0, 16 * KiB)
  yield* mem.scatter(alloc, all, pattern)
  return { mem, alloc, mapping, segment: cudaSegmentKey(DEV0, alloc.ipcHandle) }
})

describe("CUDA failures on demand (fake libcudart)", () => {
  it.effect("a copy lost under the device: the synchronize's error is a CudaFault, the bytes were not copied, the next copy works", () =>
    Effect.gen(function*() {
      const { mem, alloc, mapping, segment } = yield* exportedAndImported
      const before = { faults: mem.cudaFaults(), injected: readFakeState(fake).failures }
      setFakeFailure(fake, { point: "sync", error: CUDA_ERRORS.cudaErrorLaunchFailure })
      const out = new Uint8Array(16 * KiB)
      const lost = yield* Effect.flip(mem.gather(mapping, all, out))
      assert.isTrue(isCudaFault(lost))
      assert.deepStrictEqual(faultOf(lost), {
        errno: "ECUDA",
        call: "cudaStreamSynchronize",
        segment,
        device: DEV0,
        cudaError: 719,
        cudaErrorName: "cudaErrorLaunchFailure",
        cudaErrorString: "unspecified launch failure",
        message: `gather on ${segment}: cudaStreamSynchronize failed: unspecified launch failure (cudaErrorLaunchFailure, cudaError 719)`
      })
      assert.isTrue(out.every((b) => b === 0))
      // Once: disarmed by the failure; the exporter's own copy was never a candidate.
      assert.strictEqual(readFakeState(fake).failure.point, "none")
      yield* mem.gather(mapping, all, out)
      assert.strictEqual(Buffer.compare(out, pattern), 0)
      const back = yield* mem.gather(alloc, all, new Uint8Array(16 * KiB)).pipe(Effect.as("exporter copy ok"))
      assert.strictEqual(back, "exporter copy ok")
      assert.deepStrictEqual(
        { faults: mem.cudaFaults() - before.faults, injected: readFakeState(fake).failures - before.injected },
        { faults: 1, injected: 1 }
      )
    }).pipe(Effect.scoped, Effect.provide(NativeMemoryLive)))

  it.effect("a refused cudaMemcpyAsync, always until cleared; a skip lets the first calls pass", () =>
    Effect.gen(function*() {
      const { mem, mapping, segment } = yield* exportedAndImported
      const before = mem.cudaFaults()
      setFakeFailure(fake, { point: "memcpy", error: CUDA_ERRORS.cudaErrorDevicesUnavailable, mode: "always", skip: 1 })
      yield* mem.scatter(mapping, all, pattern)
      const refused = (yield* Effect.flip(mem.scatter(mapping, all, pattern)))
      const again = (yield* Effect.flip(mem.scatter(mapping, all, pattern)))
      const expected = {
        errno: "ECUDA",
        call: "cudaMemcpyAsync",
        segment,
        device: DEV0,
        cudaError: 46,
        cudaErrorName: "cudaErrorDevicesUnavailable",
        cudaErrorString: "CUDA-capable device(s) is/are busy or unavailable",
        message: `scatter on ${segment}: cudaMemcpyAsync failed: CUDA-capable device(s) is/are busy or unavailable (cudaErrorDevicesUnavailable, cudaError 46)`
      }
      assert.deepStrictEqual([faultOf(refused), faultOf(again)], [expected, expected])
      clearFakeFailure(fake)
      yield* mem.scatter(mapping, all, pattern)
      assert.strictEqual(mem.cudaFaults() - before, 2)
      assert.strictEqual(readFakeState(fake).violations, 0)
    }).pipe(Effect.scoped, Effect.provide(NativeMemoryLive)))

  it.effect("cudaIpcOpenMemHandle refusing a live handle: EINVAL_HANDLE with the device and the error; nothing stays open", () =>
    Effect.gen(function*() {
      const mem = yield* NativeMemory
      const alloc = yield* mem.allocateCuda(DEV0, 16 * KiB)
      const segment = cudaSegmentKey(DEV0, alloc.ipcHandle)
      const before = { faults: mem.cudaFaults(), opens: readFakeState(fake).ipcOpens, mapped: mem.stats() }
      setFakeFailure(fake, { point: "ipc_open", error: CUDA_ERRORS.cudaErrorDevicesUnavailable })
      const refused = yield* Effect.flip(Effect.scoped(mem.mapCudaIpc(alloc.ipcHandle, DEV0, 16 * KiB)))
      assert.deepStrictEqual(faultOf(refused), {
        errno: "EINVAL_HANDLE",
        call: "cudaIpcOpenMemHandle",
        segment,
        device: DEV0,
        cudaError: 46,
        cudaErrorName: "cudaErrorDevicesUnavailable",
        cudaErrorString: "CUDA-capable device(s) is/are busy or unavailable",
        message: `openCudaIpcMapping: cudaIpcOpenMemHandle failed: CUDA-capable device(s) is/are busy or unavailable (cudaErrorDevicesUnavailable, cudaError 46) for ${segment}; expected a handle from cudaIpcGetMemHandle of a live process on this host, on that device`
      })
      assert.deepStrictEqual(
        { faults: mem.cudaFaults() - before.faults, opens: readFakeState(fake).ipcOpens - before.opens, mapped: mem.stats() },
        { faults: 1, opens: 0, mapped: before.mapped }
      )
      // Once: the same handle opens now.
      yield* Effect.scoped(mem.mapCudaIpc(alloc.ipcHandle, DEV0, 16 * KiB))
      assert.strictEqual(readFakeState(fake).ipcOpens - before.opens, 1)
    }).pipe(Effect.scoped, Effect.provide(NativeMemoryLive)))
})
