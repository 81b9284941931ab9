/**
 * A child process for the CUDA backend tests: libcudart is loaded once per
 * process, so "no library" (or a library with no device) is tested in a
 * process of its own, with MPCACHE_CUDART set by the parent. Prints one JSON
 * line: what the probe found, how mapCudaIpc fails, and how a server in this
 * process answers a REGISTER_KV_CACHE with a cuda_ipc descriptor.
 *
 *   MPCACHE_CUDART=/nonexistent/libcudart.so node test/support/cuda-probe.ts
 */
import { Effect } from "effect"
import { NativeMemory } from "../../src/native/Native.ts"
import { makeInstanceId } from "../../src/schema/InstanceId.ts"
import { RegisterKvCache } from "../../src/schema/Op.ts"
import type { TensorDescriptor } from "../../src/schema/TensorDescriptor.ts"
import { MqClient } from "../../src/services/client/MqClient.ts"
import { testServer } from "./TestServer.ts"

const DEVICE = "GPU-facec0da-0000-4000-8000-000000000000"

const descriptor: TensorDescriptor = {
  kind: "cuda_ipc",
  ipc_handle: new Uint8Array(64),
  device_uuid: DEVICE,
  nbytes: 2 * 4 * 16 * 16 * 2,
  dtype: "float16",
  shape: [2, 4, 16, 1, 16],
  stride: [4 * 16 * 16, 16 * 16, 16, 16, 1],
  storage_offset: 0
}

const program = Effect.gen(function*() {
  const native = yield* NativeMemory
  const info = yield* native.cudaBackend()
  const mapError = yield* Effect.flip(Effect.scoped(native.mapCudaIpc(new Uint8Array(64), DEVICE, 4096)))
  const allocError = yield* Effect.flip(Effect.scoped(native.allocateCuda(DEVICE, 4096)))
  const client = yield* MqClient
  const registerError = yield* Effect.flip(
    client.request(RegisterKvCache, [makeInstanceId(7n), [descriptor], "tiny", 1, "vllm", {}, []])
  )
  return {
    info,
    map: { tag: mapError._tag, message: mapError.message },
    allocate: { tag: allocError._tag, message: allocError.message },
    register: { tag: registerError._tag, message: registerError.message },
    stats: native.stats()
  }
})

Effect.runPromise(program.pipe(Effect.scoped, Effect.provide(testServer({ config: { chunkSize: 32 } })))).then(
  (result) => process.stdout.write(`${JSON.stringify(result)}\n`),
  (error: unknown) => {
    process.stderr.write(`cuda-probe failed: ${String(error)}\n`)
    process.exitCode = 1
  }
)
