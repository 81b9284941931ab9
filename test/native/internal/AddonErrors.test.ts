/**
 * The mapping of what the addon throws to typed failures
 * (src/native/internal/AddonErrors.ts): per kind of call, which codes are
 * the caller's (InvalidArgument, with the message it gets) and which the
 * system's (NativeError with call and errno), a fault's fields carried over,
 * and the errors the real addon throws mapped the same way.
 */
import { assert, describe, it } from "@effect/vitest"
import { randomUUID } from "node:crypto"
import { Effect, Exit } from "effect"
import { countFault, cudaFaults, toCopyError, toCudaError, toMapError, toNativeError } from "../../../src/native/internal/AddonErrors.ts"
import { loadNativeAddon } from "../../../src/native/internal/AddonLoader.ts"
import { NativeError } from "../../../src/native/NativeError.ts"
import { InvalidArgument } from "../../../src/schema/WireError.ts"

/** An Error as the addon throws one: its message, a string `code`, a string `call` and any fault fields. */
const addonError = (message: string, fields: Readonly<Record<string, string | number>>): Error =>
  Object.assign(new Error(message), fields)

/** What a guarded fault of a gather carries (src/native/addon/guard.h). */
const segmentFault = addonError("gather: SIGBUS at offset 4096 of kv-0", { code: "EFAULT", call: "gather", segment: "kv-0", offset: 4096, signal: "SIGBUS" })

/** What a failed cudaMemcpyAsync on a worker's handle carries. */
const cudaFailure = addonError("cudaMemcpyAsync: unspecified launch failure", {
  code: "ECUDA",
  call: "cudaMemcpyAsync",
  segment: "cuda:GPU-1:ab",
  device: "GPU-1",
  cudaError: 719,
  cudaErrorName: "cudaErrorLaunchFailure",
  cudaErrorString: "unspecified launch failure"
})

describe("toNativeError", () => {
  it("keeps the addon's call, code and message, and no fault fields", () => {
    assert.deepStrictEqual(
      toNativeError(addonError("shm_open kv-0: Permission denied", { code: "EACCES", call: "shm_open", segment: "kv-0" }), "shmCreate"),
      new NativeError({ call: "shm_open", errno: "EACCES", message: "shm_open kv-0: Permission denied" })
    )
  })

  it("names the fallback call and EUNKNOWN for an Error without them, and for anything thrown", () => {
    assert.deepStrictEqual(toNativeError(new Error("boom"), "munmap"), new NativeError({ call: "munmap", errno: "EUNKNOWN", message: "boom" }))
    assert.deepStrictEqual(toNativeError("boom", "close"), new NativeError({ call: "close", errno: "EUNKNOWN", message: "boom" }))
  })

  it("maps what the real addon throws for a missing segment", () => {
    const name = `mpcache-test-${randomUUID()}`
    let thrown: unknown
    try {
      loadNativeAddon().shmSize(name)
    } catch (e) {
      thrown = e
    }
    const mapped = toNativeError(thrown, "shmSize")
    assert.deepStrictEqual({ tag: mapped._tag, errno: mapped.errno, names: mapped.message.includes(name) }, { tag: "NativeError", errno: "ENOENT", names: true })
  })
})

describe("toMapError", () => {
  it("a missing segment is the caller's, naming where it was expected", () => {
    assert.deepStrictEqual(
      toMapError("kv-0", 4096, addonError("shm_open kv-0: No such file or directory", { code: "ENOENT", call: "shm_open" })),
      new InvalidArgument({ message: "shared-memory segment kv-0 does not exist (expected /dev/shm/kv-0, created by the worker before it registers)" })
    )
  })

  it("a segment shorter than asked is the caller's, with the rule", () => {
    assert.deepStrictEqual(
      toMapError("kv-0", 8192, addonError("segment kv-0 has 4096 bytes", { code: "EINVAL_SIZE", call: "openMapping" })),
      new InvalidArgument({ message: "segment kv-0 has 4096 bytes; expected nbytes (8192) <= the segment's size" })
    )
  })

  it("a bad name or size is the caller's with the addon's words; the rest the system's", () => {
    assert.deepStrictEqual(toMapError("a/b", 1, addonError("bad name a/b", { code: "EINVAL" })), new InvalidArgument({ message: "bad name a/b" }))
    assert.deepStrictEqual(toMapError("x", 1, addonError("name too long", { code: "ENAMETOOLONG" })), new InvalidArgument({ message: "name too long" }))
    assert.deepStrictEqual(
      toMapError("kv-0", 1, addonError("mmap kv-0: Cannot allocate memory", { code: "ENOMEM", call: "mmap" })),
      new NativeError({ call: "mmap", errno: "ENOMEM", message: "mmap kv-0: Cannot allocate memory" })
    )
    assert.deepStrictEqual(
      toMapError("kv-0", 1, addonError("x", { code: "EMFILE" })),
      new NativeError({ call: "openMapping", errno: "EMFILE", message: "x" })
    )
  })
})

describe("toCudaError", () => {
  it("no backend and a bad device are the caller's", () => {
    assert.deepStrictEqual(toCudaError(addonError("no CUDA", { code: "ENOCUDA" }), "cudaAllocate"), new InvalidArgument({ message: "no CUDA" }))
    assert.deepStrictEqual(toCudaError(addonError("bad UUID", { code: "EINVAL" }), "cudaAllocate"), new InvalidArgument({ message: "bad UUID" }))
  })

  it("a failed CUDA call is a NativeError with every fault field", () => {
    assert.deepStrictEqual(
      toCudaError(cudaFailure, "openCudaIpcMapping"),
      new NativeError({
        call: "cudaMemcpyAsync",
        errno: "ECUDA",
        message: "cudaMemcpyAsync: unspecified launch failure",
        segment: "cuda:GPU-1:ab",
        device: "GPU-1",
        cudaError: 719,
        cudaErrorName: "cudaErrorLaunchFailure",
        cudaErrorString: "unspecified launch failure"
      })
    )
  })
})

describe("toCopyError", () => {
  it("bad ranges or buffers are the caller's; a closed mapping the system's", () => {
    assert.deepStrictEqual(toCopyError(addonError("range 3 outside", { code: "EINVAL_RANGE" }), "scatter"), new InvalidArgument({ message: "range 3 outside" }))
    assert.deepStrictEqual(toCopyError(addonError("not a buffer", { code: "EINVAL" }), "gather"), new InvalidArgument({ message: "not a buffer" }))
    assert.deepStrictEqual(
      toCopyError(addonError("mapping kv-0 is closed", { code: "ECLOSED" }), "gather"),
      new NativeError({ call: "gather", errno: "ECLOSED", message: "mapping kv-0 is closed" })
    )
  })

  it("a guarded fault keeps its segment and offset (and drops the signal, which NativeError has no field for)", () => {
    assert.deepStrictEqual(
      toCopyError(segmentFault, "gather"),
      new NativeError({ call: "gather", errno: "EFAULT", message: "gather: SIGBUS at offset 4096 of kv-0", segment: "kv-0", offset: 4096 })
    )
  })
})

describe("countFault", () => {
  it.effect("counts a CUDA fault once in cudaFaults; a segment fault and other failures not there; each failure passes through", () =>
    Effect.gen(function*() {
      const before = cudaFaults()
      const cuda = toCudaError(cudaFailure, "openCudaIpcMapping")
      const segment = toCopyError(segmentFault, "gather")
      const other = new InvalidArgument({ message: "x" })
      const exits = [
        yield* Effect.exit(countFault(Effect.fail(cuda))),
        yield* Effect.exit(countFault(Effect.fail(segment))),
        yield* Effect.exit(countFault(Effect.fail(other))),
        yield* Effect.exit(countFault(Effect.succeed(1)))
      ]
      assert.deepStrictEqual(exits, [Exit.fail(cuda), Exit.fail(segment), Exit.fail(other), Exit.succeed(1)])
      assert.strictEqual(cudaFaults() - before, 1)
    }))
})
