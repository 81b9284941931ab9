/**
 * The failure of the native memory addon's calls (DESIGN §1 "native code",
 * §8): {@link NativeError} (the system refused; the caller's mistakes are
 * {@link InvalidArgument} instead), the faults of worker memory a copy can
 * end with ({@link SegmentFault}, {@link CudaFault}: the server answers them
 * by releasing the instance, issue 13) and the metric that counts them.
 * Turning what the addon throws into these is `internal/AddonErrors.ts`'s.
 */
import { Metric, Schema } from "effect"
import type { InvalidArgument } from "../schema/WireError.ts"

/**
 * A native call failed: `call` names it (shm_open, ftruncate, mmap, munmap,
 * gather …), `errno` the code ("ENOENT", "EACCES", "ECLOSED" for a copy on a
 * closed mapping …), `message` says what failed on which segment and why
 * (strerror for system errors). Problems with the caller's input are
 * {@link InvalidArgument} instead.
 *
 * @category errors
 */
export class NativeError extends Schema.TaggedError<NativeError>()("NativeError", {
  call: Schema.String,
  errno: Schema.String,
  message: Schema.String,
  /** A guarded fault (errno "EFAULT", see {@link isSegmentFault}): the segment whose page vanished. */
  segment: Schema.optionalKey(Schema.String),
  /** A guarded fault: the byte offset in that mapping where the copy hit the missing page. */
  offset: Schema.optionalKey(Schema.Number),
  /** A CUDA failure on a mapping ({@link isCudaFault}): the device's UUID ("GPU-…"). */
  device: Schema.optionalKey(Schema.String),
  /** A CUDA failure: the cudaError_t. */
  cudaError: Schema.optionalKey(Schema.Number),
  /** A CUDA failure: its name ("cudaErrorLaunchFailure", cudaGetErrorName). */
  cudaErrorName: Schema.optionalKey(Schema.String),
  /** A CUDA failure: cudaGetErrorString's words ("unspecified launch failure"). */
  cudaErrorString: Schema.optionalKey(Schema.String)
}) {}

/**
 * A NativeError of a guarded fault (issue 13 item 1, DESIGN §8): a copy
 * (`call` "gather" / "scatter") or prefault ("prefault") of a worker's
 * segment took SIGBUS or SIGSEGV on the mapping, because the worker shrank
 * the segment (`ftruncate`) below the size it registered; the addon's fault
 * guard (src/native/addon/guard.h) ended that one copy instead of the
 * process. `segment` names it, `offset` is where in the mapping the copy
 * hit the first missing page (bytes). The mapping stays mapped (a copy of
 * the pages still there works); the server releases the instance.
 *
 * @category error handling
 */
export type SegmentFault = NativeError & { readonly errno: "EFAULT"; readonly segment: string; readonly offset: number }

/** Whether `e` is a {@link SegmentFault}. */
export const isSegmentFault = (e: { readonly _tag: string }): e is SegmentFault =>
  e instanceof NativeError && e.errno === "EFAULT" && e.segment !== undefined

/** What every fault reply says, after naming the instance and the segment (issue 13). */
export const SEGMENT_SHRANK = "the segment shrank below its registered size"

/**
 * A NativeError of a CUDA call that failed on a worker's CUDA memory (issue
 * 13 item 4): errno "EINVAL_HANDLE" when cudaIpcOpenMemHandle refused the
 * handle (`call` "cudaIpcOpenMemHandle"), "ECUDA" when another call failed
 * opening it or copying through it (cudaSetDevice, cudaMemcpyAsync,
 * cudaStreamSynchronize: a device lost mid-copy, an ECC error, a sticky
 * error after which the context is unusable). `segment` is the mapping's
 * name (`cuda:<device>:<hex of the handle>`), `device` its device's UUID,
 * `cudaError` / `cudaErrorName` / `cudaErrorString` what cudart said. The
 * server answers invalid_argument and releases the instance.
 *
 * @category error handling
 */
export type CudaFault = NativeError & {
  readonly errno: "ECUDA" | "EINVAL_HANDLE"
  readonly segment: string
  readonly device: string
  readonly cudaError: number
  readonly cudaErrorName: string
  readonly cudaErrorString: string
}

/** Whether `e` is a {@link CudaFault}. */
export const isCudaFault = (e: { readonly _tag: string }): e is CudaFault =>
  e instanceof NativeError && (e.errno === "ECUDA" || e.errno === "EINVAL_HANDLE") && e.cudaErrorName !== undefined &&
  e.segment !== undefined && e.device !== undefined

/** A fault of worker memory the server answers by releasing the instance (issue 13 items 1 and 4). */
export type WorkerMemoryFault = SegmentFault | CudaFault

/** Whether `e` is a {@link WorkerMemoryFault}. */
export const isWorkerMemoryFault = (e: { readonly _tag: string }): e is WorkerMemoryFault => isSegmentFault(e) || isCudaFault(e)

/**
 * The `kind` label of {@link guardedFaultsTotal}: `segment_shrank` (a
 * guarded SIGBUS/SIGSEGV: the segment shrank under a copy),
 * `cuda_handle_refused` (cudaIpcOpenMemHandle refused a REGISTER's handle),
 * `cuda_error` (another CUDA call failed on a worker's memory).
 */
export type FaultKind = "segment_shrank" | "cuda_handle_refused" | "cuda_error"

/** The {@link FaultKind} of a fault. */
export const faultKind = (e: WorkerMemoryFault): FaultKind =>
  isSegmentFault(e) ? "segment_shrank" : e.errno === "EINVAL_HANDLE" ? "cuda_handle_refused" : "cuda_error"

/**
 * Faults of worker memory that ended a request, by `kind` ({@link FaultKind})
 * and `call` ("gather", "scatter", "prefault" for segment_shrank; the CUDA
 * call for the CUDA kinds): one per faulted copy job or refused open.
 * `/api/status` fault_guard.guarded_faults is the sum of kind
 * segment_shrank, fault_guard.cuda_faults the sum of the CUDA kinds.
 *
 * @category metrics
 */
export const guardedFaultsTotal = Metric.counter("mpcache_guarded_faults_total", {
  description:
    "Requests of worker memory ended by a fault, by kind (segment_shrank: a guarded SIGBUS/SIGSEGV, the segment shrank under the copy; cuda_handle_refused: cudaIpcOpenMemHandle refused the handle; cuda_error: a CUDA call failed on the memory, e.g. a device lost mid-copy) and call",
  incremental: true
})
