/**
 * What the addon throws, as the typed failures of `src/native/NativeError.ts`:
 * each mapper reads the Error's `code` and `call` (and a fault's fields) and
 * decides whether the caller asked for something wrong
 * ({@link InvalidArgument}) or the system refused ({@link NativeError}), per
 * kind of call (segments, mappings, CUDA, copies); and {@link countFault},
 * which counts the faults of worker memory a copy ends with.
 *
 * @internal
 */
import { Effect, Metric } from "effect"
import { InvalidArgument } from "../../schema/WireError.ts"
import { faultKind, guardedFaultsTotal, isCudaFault, isWorkerMemoryFault, NativeError } from "../NativeError.ts"

/** What a fault adds to an addon error: a guarded fault's segment and offset, a CUDA failure's segment, device and error. */
interface FaultFields {
  segment?: string
  offset?: number
  device?: string
  cudaError?: number
  cudaErrorName?: string
  cudaErrorString?: string
}

/** The `code`, `call` and message of an addon error (or of anything thrown), and its {@link FaultFields}. */
const describe = (cause: unknown, fallbackCall: string): { code: string; call: string; message: string; fault: FaultFields } => {
  if (cause instanceof Error) {
    const e = cause as Error & Record<string, unknown>
    const fault: FaultFields = {}
    for (const key of ["segment", "device", "cudaErrorName", "cudaErrorString"] as const) {
      const v = e[key]
      if (typeof v === "string") fault[key] = v
    }
    for (const key of ["offset", "cudaError"] as const) {
      const v = e[key]
      if (typeof v === "number") fault[key] = v
    }
    return {
      code: typeof e["code"] === "string" ? e["code"] : "EUNKNOWN",
      call: typeof e["call"] === "string" ? e["call"] : fallbackCall,
      message: cause.message,
      fault
    }
  }
  return { code: "EUNKNOWN", call: fallbackCall, message: String(cause), fault: {} }
}

/**
 * Any addon failure as a NativeError (segment-level calls, close).
 *
 * @category error handling
 */
export const toNativeError = (cause: unknown, fallbackCall: string): NativeError => {
  const d = describe(cause, fallbackCall)
  return new NativeError({ call: d.call, errno: d.code, message: d.message })
}

/**
 * A failure of openMapping: a missing segment, a segment shorter than asked
 * and malformed input are the caller's (InvalidArgument); the rest NativeError.
 *
 * @category error handling
 */
export const toMapError = (name: string, nbytes: number, cause: unknown): InvalidArgument | NativeError => {
  const d = describe(cause, "openMapping")
  switch (d.code) {
    case "ENOENT":
      return new InvalidArgument({
        message: `shared-memory segment ${name} does not exist (expected /dev/shm/${name}, created by the worker before it registers)`
      })
    case "EINVAL_SIZE":
      return new InvalidArgument({ message: `${d.message}; expected nbytes (${nbytes}) <= the segment's size` })
    case "EINVAL":
    case "ENAMETOOLONG":
      return new InvalidArgument({ message: d.message })
    default:
      return new NativeError({ call: d.call, errno: d.code, message: d.message })
  }
}

/**
 * A failure of a CUDA open, allocation or query: no backend (ENOCUDA) and a
 * bad or unknown device UUID or argument (EINVAL) are the caller's
 * (InvalidArgument); the rest NativeError, with its fault fields: a handle
 * cudart refuses (EINVAL_HANDLE) and a failed CUDA call (ECUDA) are
 * {@link CudaFault}s.
 *
 * @category error handling
 */
export const toCudaError = (cause: unknown, fallbackCall: string): InvalidArgument | NativeError => {
  const d = describe(cause, fallbackCall)
  switch (d.code) {
    case "ENOCUDA":
    case "EINVAL":
      return new InvalidArgument({ message: d.message })
    default:
      return new NativeError({ call: d.call, errno: d.code, message: d.message, ...d.fault })
  }
}

/**
 * A failure of gather/scatter/prefault: bad ranges or buffers are
 * InvalidArgument; ECLOSED and the rest NativeError; a guarded fault a
 * NativeError EFAULT with its segment and offset ({@link SegmentFault}).
 *
 * @category error handling
 */
export const toCopyError = (cause: unknown, fallbackCall: string): InvalidArgument | NativeError => {
  const d = describe(cause, fallbackCall)
  if (d.code === "EINVAL_RANGE" || d.code === "EINVAL") return new InvalidArgument({ message: d.message })
  return new NativeError({ call: d.call, errno: d.code, message: d.message, ...d.fault })
}

/**
 * CUDA opens and copies of worker memory ended by a {@link CudaFault} in this process since it started
 * (process-wide, as the addon's own `guardedFaults` counter is): what `/api/status` reports.
 */
let cudaFaultCount = 0

/** {@link cudaFaultCount}: CUDA faults of worker memory in this process since it started. */
export const cudaFaults = (): number => cudaFaultCount

/**
 * Counts a {@link WorkerMemoryFault} in {@link guardedFaultsTotal} (labels `kind`, `call`), and a CUDA one in
 * `cudaFaultCount`; other failures pass untouched. Inside the copy's uninterruptible region: a batch whose first
 * failure interrupts its siblings still counts each of their faults, as the addon's own counter does.
 */
export const countFault = <A, R>(
  copy: Effect.Effect<A, InvalidArgument | NativeError, R>
): Effect.Effect<A, InvalidArgument | NativeError, R> =>
  Effect.tapError(copy, (e) => {
    if (!isWorkerMemoryFault(e)) return Effect.void
    if (isCudaFault(e)) cudaFaultCount++
    return Metric.update(Metric.withAttributes(guardedFaultsTotal, { kind: faultKind(e), call: e.call }), 1)
  })
