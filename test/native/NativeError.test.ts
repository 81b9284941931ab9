/**
 * The native failure's fault kinds (src/native/NativeError.ts): which
 * NativeErrors are faults of worker memory, and the `kind` label each
 * counts under in mpcache_guarded_faults_total.
 */
import { assert, describe, it } from "@effect/vitest"
import { faultKind, isCudaFault, isSegmentFault, isWorkerMemoryFault, NativeError } from "../../src/native/NativeError.ts"
import { InvalidArgument } from "../../src/schema/WireError.ts"

const shrank = new NativeError({ call: "gather", errno: "EFAULT", message: "m", segment: "kv-0", offset: 4096 })
const cudaFields = { segment: "cuda:GPU-1:ab", device: "GPU-1", cudaError: 719, cudaErrorName: "cudaErrorLaunchFailure", cudaErrorString: "s" }
const copyFailed = new NativeError({ call: "cudaMemcpyAsync", errno: "ECUDA", message: "m", ...cudaFields })
const refused = new NativeError({ call: "cudaIpcOpenMemHandle", errno: "EINVAL_HANDLE", message: "m", ...cudaFields })

/** The fault kind of `e`, or "none" when it is no fault of worker memory. */
const kindOf = (e: NativeError) => (isWorkerMemoryFault(e) ? faultKind(e) : "none")

describe("fault kinds", () => {
  it("a guarded fault is a segment fault (segment_shrank); EFAULT without a segment is not", () => {
    assert.deepStrictEqual([isSegmentFault(shrank), isCudaFault(shrank), isWorkerMemoryFault(shrank)], [true, false, true])
    assert.strictEqual(kindOf(shrank), "segment_shrank")
    assert.isFalse(isWorkerMemoryFault(new NativeError({ call: "gather", errno: "EFAULT", message: "m" })))
  })

  it("a refused handle is cuda_handle_refused, another failed CUDA call cuda_error; without the CUDA fields neither", () => {
    assert.deepStrictEqual([isCudaFault(refused), isCudaFault(copyFailed), isSegmentFault(copyFailed)], [true, true, false])
    assert.deepStrictEqual([kindOf(refused), kindOf(copyFailed)], ["cuda_handle_refused", "cuda_error"])
    assert.isFalse(isCudaFault(new NativeError({ call: "cudaMemcpyAsync", errno: "ECUDA", message: "m", segment: "s", device: "GPU-1" })))
  })

  it("other failures are no faults of worker memory", () => {
    assert.isFalse(isWorkerMemoryFault(new NativeError({ call: "munmap", errno: "EINVAL", message: "m" })))
    assert.isFalse(isWorkerMemoryFault(new InvalidArgument({ message: "m" })))
  })
})
