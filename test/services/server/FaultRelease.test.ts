/**
 * Fault handling of the LMCache-driven transfer module
 * (src/services/server/internal/FaultRelease.ts; issue 13 items 1 and 4,
 * issue 25 item 3), on the real per-instance core: a fault releases the
 * context held for the id once, through its finalizer; later requests get
 * the fault's reply, not not_registered, until the id is forgotten; the one
 * "copy failed" branch answers each case.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect, Scope } from "effect"
import { NativeError } from "../../../src/native/NativeError.ts"
import type { CudaFault, SegmentFault } from "../../../src/native/NativeError.ts"
import { makeInstanceId } from "../../../src/schema/InstanceId.ts"
import { RegisterKvCache } from "../../../src/schema/Op.ts"
import { InvalidArgument, NotRegistered } from "../../../src/schema/WireError.ts"
import type { TensorDescriptor } from "../../../src/schema/TensorDescriptor.ts"
import { makeTrackedInstances } from "../../../src/services/server/InstanceModule.ts"
import type { ContextEntry } from "../../../src/services/server/LmcacheDrivenTransfer.ts"
import {
  cudaFaultError,
  faultError,
  fieldOfSegment,
  makeFaultRelease,
  MAX_FAULT_RECORDS
} from "../../../src/services/server/internal/FaultRelease.ts"

const ID = makeInstanceId(7n)

const shrank = (segment: string, offset = 4096) =>
  new NativeError({ call: "gather", errno: "EFAULT", message: `gather faulted in ${segment}`, segment, offset }) as SegmentFault
const cudaFields = { segment: "cuda:GPU-1:ab", device: "GPU-1", cudaError: 719, cudaErrorName: "cudaErrorLaunchFailure", cudaErrorString: "unspecified launch failure" }
const cudaFailed = new NativeError({ call: "cudaMemcpyAsync", errno: "ECUDA", message: "m", ...cudaFields }) as CudaFault
const cudaRefused = new NativeError({ call: "cudaIpcOpenMemHandle", errno: "EINVAL_HANDLE", message: "m", ...cudaFields }) as CudaFault

/** A context entry owning `scope` whose finalizer pushes to `released`; no mappings (the faulted size comes from the caller). */
const entryOf = (scope: Scope.Closeable, released: Array<string>, label: string): Effect.Effect<ContextEntry> =>
  Effect.as(Scope.addFinalizer(scope, Effect.sync(() => released.push(label))), {
    modelName: "m",
    worldSize: 1,
    engineType: "vllm",
    descriptors: [],
    geometry: {
      numLayers: 1,
      numBlocks: 4,
      blockSizeTokens: 16,
      numHeads: 1,
      headSize: 8,
      dtype: "float16",
      elementBytes: 2,
      hiddenDim: 8,
      blockBytes: 256
    },
    layers: [],
    mappings: new Map(),
    memfd: undefined,
    memoryIdentities: [],
    scope
  })

/** The real per-instance core, fault handling over it (segment sizes from `sizes`; absent: the name is gone). */
const setup = (sizes: ReadonlyMap<string, number> = new Map()) =>
  Effect.gen(function*() {
    const contexts = yield* makeTrackedInstances<ContextEntry>({
      name: "faulty",
      kind: "kv_cache",
      registerOp: RegisterKvCache.name,
      unregisterOp: "unregister_kv_cache",
      differs: "another context",
      missing: "holds no test context",
      remedy: "register again",
      details: () => ({})
    })
    const released: Array<string> = []
    const register = (id: typeof ID, label: string) =>
      Effect.map(
        contexts.register(id, { same: () => false, acquire: (scope) => entryOf(scope, released, label) }),
        (r) => r.entry
      )
    const segmentSize = (name: string) => {
      const n = sizes.get(name)
      return n === undefined ? Effect.fail(new NativeError({ call: "fstat", errno: "ENOENT", message: `${name}: no such segment` })) : Effect.succeed(n)
    }
    return { contexts, released, register, faults: makeFaultRelease(contexts, segmentSize) }
  })

describe("releaseFaulted", () => {
  it.effect("releases the held context once, through its finalizer; later requests get the fault, not not_registered", () =>
    Effect.gen(function*() {
      const { contexts, released, register, faults } = yield* setup(new Map([["kv-0", 1024]]))
      const entry = yield* register(ID, "first")
      const reply = yield* faults.releaseFaulted("store", ID, entry, shrank("kv-0"), 8192)
      assert.instanceOf(reply, InvalidArgument)
      assert.strictEqual(reply.field, "kv_caches")
      assert.strictEqual(reply.expected, "segment kv-0 of at least 8192 bytes (as registered)")
      assert.strictEqual(reply.actual, "1024 bytes")
      assert.strictEqual(
        reply.message,
        "store: instance 7: segment kv-0: the segment shrank below its registered size (8192 bytes registered, 1024 bytes now; gather faulted on the page at byte 4096); its context is released: recreate the memory and register it again"
      )
      assert.deepStrictEqual(released, ["first"])
      assert.isFalse(yield* contexts.isRegistered(ID))
      // A later request of another op gets the same fault, for its op.
      const later = yield* Effect.flip(faults.resolveForTransfer("retrieve", ID))
      assert.instanceOf(later, InvalidArgument)
      assert.strictEqual(later.message, reply.message.replace(/^store:/, "retrieve:"))
      // A second copy of the same request faulting: nothing released twice, the first record answers.
      const again = yield* faults.releaseFaulted("store", ID, entry, shrank("kv-0", 0), 8192)
      assert.strictEqual(again.message, reply.message)
      assert.deepStrictEqual(released, ["first"])
    }).pipe(Effect.scoped))

  it.effect("an entry no longer held (released and registered again) is not released; nothing is recorded", () =>
    Effect.gen(function*() {
      const { contexts, released, register, faults } = yield* setup()
      const old = yield* register(ID, "old")
      yield* contexts.unregister(ID)
      const current = yield* register(ID, "current")
      const reply = yield* faults.releaseFaulted("store", ID, old, shrank("kv-0"), 64)
      assert.strictEqual(reply.actual, "segment kv-0 is gone")
      assert.deepStrictEqual(released, ["old"])
      assert.strictEqual(yield* faults.resolveForTransfer("store", ID), current)
    }).pipe(Effect.scoped))

  it.effect("forget: a new registration or UNREGISTER makes the id answer not_registered again", () =>
    Effect.gen(function*() {
      const { register, faults } = yield* setup()
      yield* faults.releaseFaulted("store", ID, yield* register(ID, "a"), shrank("memfd:kv-0"), 64)
      assert.instanceOf(yield* Effect.flip(faults.resolveForTransfer("store", ID)), InvalidArgument)
      faults.forget(ID)
      const missing = yield* Effect.flip(faults.resolveForTransfer("store", ID))
      assert.instanceOf(missing, NotRegistered)
      assert.strictEqual(missing.message, "store: instance 7 holds no test context (never registered, unregistered or reaped); register again")
    }).pipe(Effect.scoped))

  it.effect(`remembers at most ${MAX_FAULT_RECORDS} faulted ids, the oldest forgotten first`, () =>
    Effect.gen(function*() {
      const { register, faults } = yield* setup()
      for (let i = 0; i <= MAX_FAULT_RECORDS; i++) {
        const id = makeInstanceId(BigInt(1000 + i))
        yield* faults.releaseFaulted("store", id, yield* register(id, `${i}`), shrank("kv-0"), 64)
      }
      assert.instanceOf(yield* Effect.flip(faults.resolveForTransfer("store", makeInstanceId(1000n))), NotRegistered)
      assert.instanceOf(yield* Effect.flip(faults.resolveForTransfer("store", makeInstanceId(1001n))), InvalidArgument)
      assert.instanceOf(yield* Effect.flip(faults.resolveForTransfer("store", makeInstanceId(BigInt(1000 + MAX_FAULT_RECORDS)))), InvalidArgument)
    }).pipe(Effect.scoped))
})

describe("copyFailed: the one branch of every copy", () => {
  it.effect("a fault is released (by default releaseFaulted, else options.release) and answered", () =>
    Effect.gen(function*() {
      const { released, register, faults } = yield* setup()
      const entry = yield* register(ID, "a")
      const byDefault = yield* Effect.flip(faults.copyFailed("retrieve", ID, entry, cudaFailed, Effect.succeed("held")))
      assert.instanceOf(byDefault, InvalidArgument)
      assert.strictEqual(byDefault.field, "kv_caches")
      assert.deepStrictEqual(released, ["a"])
      const other = yield* register(ID, "b")
      const seen: Array<string> = []
      const custom = yield* Effect.flip(faults.copyFailed("cb_retrieve_pre_computed", ID, other, shrank("rope-0"), Effect.succeed("held"), {
        release: (f) => Effect.sync(() => (seen.push(f.segment), new InvalidArgument({ message: "released by the caller" })))
      }))
      assert.strictEqual(custom.message, "released by the caller")
      assert.deepStrictEqual(seen, ["rope-0"])
      assert.deepStrictEqual(released, ["a"])
    }).pipe(Effect.scoped))

  it.effect("another error: whenHeld while the context is held; the module's not_registered (or options.missing) once it is gone", () =>
    Effect.gen(function*() {
      const { contexts, register, faults } = yield* setup()
      const entry = yield* register(ID, "a")
      const plain = new NativeError({ call: "scatter", errno: "EINVAL", message: "bad range" })
      assert.strictEqual(yield* faults.copyFailed("store", ID, entry, plain, Effect.succeed("held")), "held")
      assert.strictEqual(yield* faults.copyFailed("store", ID, entry, undefined, Effect.succeed("held")), "held")
      yield* contexts.unregister(ID)
      const gone = yield* Effect.flip(faults.copyFailed("store", ID, entry, plain, Effect.succeed("held")))
      assert.instanceOf(gone, NotRegistered)
      assert.strictEqual(gone.message, "store: instance 7 holds no test context (never registered, unregistered or reaped); register again")
      const missing = new NotRegistered({ op: "x", instance_id: "7", message: "no kv context" })
      assert.strictEqual(yield* Effect.flip(faults.copyFailed("store", ID, entry, plain, Effect.succeed("held"), { missing })), missing)
    }).pipe(Effect.scoped))
})

describe("replies", () => {
  it("a shrunk passed memfd has no name to measure: the reply says it shrank", () => {
    const r = faultError("store", ID, { _tag: "SegmentShrank", segment: "memfd:3:42", registeredBytes: 4096, currentBytes: undefined, call: "gather", offset: 0 })
    assert.strictEqual(r.actual, "segment memfd:3:42 shrank")
    assert.include(r.message, "4096 bytes registered, a passed memfd, shrunk by its owner;")
  })

  it("a CUDA failure names the descriptor, the device and the error; REGISTER keeps nothing, a transfer releases the context", () => {
    const atRegister = cudaFaultError(RegisterKvCache.name, "7", "kv_caches[1]", cudaRefused)
    assert.strictEqual(atRegister.field, "kv_caches[1]")
    assert.strictEqual(atRegister.expected, "a CUDA IPC handle from cudaIpcGetMemHandle of a live process on this host, on device GPU-1")
    assert.strictEqual(atRegister.actual, "cudaIpcOpenMemHandle failed with cudaErrorLaunchFailure (cudaError 719: unspecified launch failure)")
    assert.isTrue(atRegister.message.endsWith("nothing of the instance is kept"))
    const atStore = cudaFaultError("store", "7", "kv_caches[0]", cudaFailed)
    assert.strictEqual(atStore.expected, "a usable CUDA IPC mapping on device GPU-1")
    assert.isTrue(atStore.message.endsWith("its context is released: register it again once the device is healthy"))
  })

  it("fieldOfSegment names the first descriptor viewing the segment, or kv_caches when none does", () => {
    const d = (shm_name: string): TensorDescriptor => ({
      kind: "cpu_shm",
      device_uuid: "",
      nbytes: 64,
      dtype: "float16",
      shape: [2, 1, 16, 1],
      stride: [16, 16, 1, 1],
      storage_offset: 0,
      shm_name
    })
    assert.strictEqual(fieldOfSegment([d("a"), d("b"), d("b")], "b"), "kv_caches[1]")
    assert.strictEqual(fieldOfSegment([d("a")], "z"), "kv_caches")
  })
})
