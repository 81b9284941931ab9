/**
 * @internal
 *
 * Fault handling of the LMCache-driven transfer module (issue 13 items 1
 * and 4, issue 25 item 3): what a copy through a registered context does
 * when it hits a vanished page ({@link SegmentFault}) or a failing CUDA call
 * ({@link CudaFault}). The context is released through its one finalizer
 * (the core's `unregister(id, "fault")`, which also releases the owner's
 * mapped bytes), the fault is remembered (at most {@link MAX_FAULT_RECORDS}
 * ids, oldest forgotten first) so that later requests naming the id get the
 * same `invalid_argument` instead of `not_registered`, and the one "copy
 * failed" branch of every copy (STORE, RETRIEVE, Blend's scatter) is
 * {@link FaultRelease.copyFailed}.
 *
 * The public contract is documented on `LmcacheDrivenTransfer.releaseFaulted`
 * and `LmcacheDrivenTransfer.copyFailed`, which are these functions.
 */
import { Effect, Option } from "effect"
import {
  type CudaFault,
  isSegmentFault,
  isWorkerMemoryFault,
  type NativeError,
  type NativeMemory,
  SEGMENT_SHRANK,
  type WorkerMemoryFault
} from "../../../native/Native.ts"
import { formatInstanceId, type InstanceId } from "../../../schema/InstanceId.ts"
import { RegisterKvCache } from "../../../schema/Op.ts"
import type { TensorDescriptor } from "../../../schema/TensorDescriptor.ts"
import { InvalidArgument, type NotRegistered, type WireError } from "../../../schema/WireError.ts"
import { segmentKeyOf } from "../../kv/KvCacheLayout.ts"
import type { InstanceModule } from "../InstanceModule.ts"
import type { ContextEntry } from "../LmcacheDrivenTransfer.ts"

/** What a fault left for later requests of the id: a shrunk segment (its registered and current bytes, where it hit) or a CUDA failure. */
export type FaultRecord =
  | {
    readonly _tag: "SegmentShrank"
    readonly segment: string
    readonly registeredBytes: number
    /** Bytes of the segment when the fault was handled; undefined when its name was gone. */
    readonly currentBytes: number | undefined
    readonly call: string
    readonly offset: number
  }
  | {
    readonly _tag: "CudaFailed"
    /** The descriptor of the failed mapping, "kv_caches[i]" (the first that views it). */
    readonly field: string
    readonly fault: CudaFault
  }

/** At most this many faulted ids are remembered (oldest forgotten first): a bound on a worker that faults forever. */
export const MAX_FAULT_RECORDS = 1024

/** "kv_caches[i]": the first descriptor of `descriptors` that views segment `key` (a shm name or a cudaSegmentKey). */
export const fieldOfSegment = (descriptors: ReadonlyArray<TensorDescriptor>, key: string): string => {
  const i = descriptors.findIndex((d) => segmentKeyOf(d) === key)
  return i < 0 ? "kv_caches" : `kv_caches[${i}]`
}

/**
 * The reply to a CUDA failure on instance `idText`'s descriptor `field`
 * (issue 13 item 4): invalid_argument naming the instance, the descriptor,
 * the device and the CUDA error, and what the server did about it (at
 * REGISTER: nothing kept; later: the context released).
 */
export const cudaFaultError = (op: string, idText: string, field: string, f: CudaFault): InvalidArgument => {
  const error = `${f.cudaErrorName} (cudaError ${f.cudaError}: ${f.cudaErrorString})`
  const refused = f.errno === "EINVAL_HANDLE"
  return new InvalidArgument({
    op,
    instance_id: idText,
    field,
    expected: refused
      ? `a CUDA IPC handle from cudaIpcGetMemHandle of a live process on this host, on device ${f.device}`
      : `a usable CUDA IPC mapping on device ${f.device}`,
    actual: `${f.call} failed with ${error}`,
    message: refused
      ? `${op}: instance ${idText}: ${field} (cuda_ipc on device ${f.device}): the CUDA driver refused the IPC handle: ${f.call} failed with ${error}; expected a handle from cudaIpcGetMemHandle of a live process on this host, on that device; nothing of the instance is kept`
      : `${op}: instance ${idText}: ${field} (cuda_ipc on device ${f.device}): ${f.call} failed with ${error}; the device memory cannot be used (a device lost, an ECC error or a sticky CUDA error); ${
        op === RegisterKvCache.name ? "nothing of the instance is kept" : "its context is released: register it again once the device is healthy"
      }`
  })
}

/** The reply for `op` on `id` whose context a fault released (the record's fields in expected/actual). */
export const faultError = (op: string, id: InstanceId, r: FaultRecord): InvalidArgument => {
  const idText = formatInstanceId(id)
  if (r._tag === "CudaFailed") return cudaFaultError(op, idText, r.field, r.fault)
  const memfd = r.segment.startsWith("memfd:")
  const now = r.currentBytes !== undefined ? `${r.currentBytes} bytes now` : memfd ? "a passed memfd, shrunk by its owner" : "its name is gone"
  return new InvalidArgument({
    op,
    instance_id: idText,
    field: "kv_caches",
    expected: `segment ${r.segment} of at least ${r.registeredBytes} bytes (as registered)`,
    actual: r.currentBytes !== undefined ? `${r.currentBytes} bytes` : memfd ? `segment ${r.segment} shrank` : `segment ${r.segment} is gone`,
    message: `${op}: instance ${idText}: segment ${r.segment}: ${SEGMENT_SHRANK} (${r.registeredBytes} bytes registered, ${now}; ${r.call} faulted on the page at byte ${r.offset}); its context is released: recreate the memory and register it again`
  })
}

/** Options of {@link FaultRelease.copyFailed}: the reply for a context released meanwhile, and who releases a fault. */
export interface CopyFailedOptions {
  readonly missing?: NotRegistered
  readonly release?: (fault: WorkerMemoryFault) => Effect.Effect<InvalidArgument>
}

/** The fault handling of one module instance (see the module header). */
export interface FaultRelease {
  /** Releases `entry` (if still the one held for `id`) after `fault`, remembers it, returns the reply for `op`. */
  readonly releaseFaulted: (
    op: string,
    id: InstanceId,
    entry: ContextEntry,
    fault: WorkerMemoryFault,
    registeredBytes?: number
  ) => Effect.Effect<InvalidArgument>
  /** The context for a transfer; an id a fault released answers that fault instead of not_registered. */
  readonly resolveForTransfer: (op: string, id: InstanceId) => Effect.Effect<ContextEntry, WireError>
  /** The one "copy failed" branch: a fault is released; else `options.missing` / not_registered when gone, `whenHeld` when held. */
  readonly copyFailed: <A>(
    op: string,
    id: InstanceId,
    entry: ContextEntry,
    error: InvalidArgument | NativeError | undefined,
    whenHeld: Effect.Effect<A, WireError>,
    options?: CopyFailedOptions
  ) => Effect.Effect<A, WireError>
  /** Forgets the fault of `id` (a new registration or an UNREGISTER of it). */
  readonly forget: (id: InstanceId) => void
}

/**
 * The fault handling over `contexts` (the module's per-instance core);
 * `segmentSize` (NativeMemory's: bytes of a named segment, failing when it
 * is gone) measures a shrunk segment for the reply.
 */
export const makeFaultRelease = (
  contexts: InstanceModule<ContextEntry>,
  segmentSize: NativeMemory["Service"]["segmentSize"]
): FaultRelease => {
  const faults = new Map<InstanceId, FaultRecord>()

  /** What a fault leaves for later requests of the id (a shrunk segment's size is read now). */
  const faultRecord = (entry: ContextEntry, fault: WorkerMemoryFault, mappedBytes?: number) =>
    isSegmentFault(fault)
      ? Effect.map(
        // A passed memfd has no name to measure it by: the server closed its descriptor after mapping it.
        fault.segment.startsWith("memfd:") ? Effect.succeedNone : Effect.option(segmentSize(fault.segment)),
        (size): FaultRecord => ({
          _tag: "SegmentShrank",
          segment: fault.segment,
          registeredBytes: entry.mappings.get(fault.segment)?.sizeBytes ?? mappedBytes ?? 0,
          currentBytes: Option.getOrUndefined(size),
          call: fault.call,
          offset: fault.offset
        })
      )
      : Effect.succeed<FaultRecord>({ _tag: "CudaFailed", field: fieldOfSegment(entry.descriptors, fault.segment), fault })

  const releaseFaulted = (op: string, id: InstanceId, entry: ContextEntry, fault: WorkerMemoryFault, mappedBytes?: number) =>
    Effect.gen(function*() {
      const record = yield* faultRecord(entry, fault, mappedBytes)
      const held = yield* contexts.get(id)
      if (held?.scope === entry.scope) {
        // Recorded before the release, so a request arriving meanwhile already gets this error.
        if (faults.size >= MAX_FAULT_RECORDS) faults.delete(faults.keys().next().value!)
        faults.set(id, record)
        // Through the one finalizer, which tells the context's owner (its mapped bytes go with the entry).
        yield* contexts.releaseFaulted(id)
        yield* Effect.logWarning(
          `instance ${formatInstanceId(id)}: ${fault.message}; released its context (${entry.mappings.size} segment(s))`
        )
      }
      return faultError(op, id, faults.get(id) ?? record)
    })

  const resolveForTransfer = (op: string, id: InstanceId): Effect.Effect<ContextEntry, WireError> =>
    contexts.resolveForTransfer(op, id).pipe(
      Effect.catch((missing): Effect.Effect<never, WireError> => {
        const record = faults.get(id)
        return Effect.fail(record === undefined ? missing : faultError(op, id, record))
      })
    )

  const copyFailed = <A>(
    op: string,
    id: InstanceId,
    entry: ContextEntry,
    error: InvalidArgument | NativeError | undefined,
    whenHeld: Effect.Effect<A, WireError>,
    options: CopyFailedOptions = {}
  ): Effect.Effect<A, WireError> =>
    error !== undefined && isWorkerMemoryFault(error)
      ? Effect.flatMap((options.release ?? ((f: WorkerMemoryFault) => releaseFaulted(op, id, entry, f)))(error), Effect.fail)
      : Effect.flatMap(contexts.isRegistered(id), (held) => held ? whenHeld : Effect.fail(options.missing ?? contexts.notRegistered(op, id)))

  return { releaseFaulted, resolveForTransfer, copyFailed, forget: (id) => void faults.delete(id) }
}
