/**
 * The live native memory backend (DESIGN §2, §4): the {@link NativeMemory}
 * service over the C++ addon. It owns every mapping the server opens:
 * shared-memory segments, CUDA IPC mappings, and (worker side) CUDA
 * allocations.
 *
 * Each mapping has one release (close: stop taking copies, wait for those in
 * flight, munmap — for CUDA: cudaIpcCloseMemHandle or cudaFree, then
 * cudaStreamDestroy), shared by two paths: the Scope the mapping was acquired in
 * (UNREGISTER, reap: the per-entry scope) and this layer's own finalizer
 * (server shutdown), which releases whatever is still open. The release body
 * runs once, whichever path comes first and however many call it; later
 * callers wait for the same munmap.
 */
import { Effect, Layer } from "effect"
import {
  type AddonMapping,
  type CopyPart,
  type CudaAllocation,
  type CudaBackendInfo,
  loadNativeAddon,
  makeNativeCalls,
  NativeError,
  NativeMemory,
  type NativeMemoryShape,
  type ShmMapping
} from "../native/Native.ts"
import { toNativeError } from "../native/internal/AddonErrors.ts"
import { InvalidArgument } from "../schema/WireError.ts"

/** A mapping this layer opened: the addon's object, its handle, its release. */
interface Tracked {
  readonly native: AddonMapping
  readonly handle: ShmMapping
  /** Memory this process created (the L1 pool, CUDA allocations): not in `usage()`. */
  readonly owned: boolean
  /** Idempotent: the body (close + munmap) runs once; every call waits for it. */
  readonly release: Effect.Effect<void>
}

/**
 * The live {@link NativeMemory}: loads the addon (a missing build is a defect
 * whose message says to run `npm ci`), tracks the mappings it opens and, when
 * the layer's scope closes, releases every one still open, waiting for copies
 * in flight (server shutdown). Stats are the addon's process-wide counters.
 *
 * @category layers
 */
export const NativeMemoryLive: Layer.Layer<NativeMemory> = Layer.effect(
  NativeMemory,
  Effect.gen(function*() {
    const calls = makeNativeCalls(yield* Effect.sync(loadNativeAddon))
    let shutDown = false
    const open = yield* Effect.acquireRelease(
      Effect.sync(() => new Set<Tracked>()),
      (open) =>
        Effect.suspend(() => {
          shutDown = true
          return Effect.forEach([...open], (t) => t.release, { concurrency: "unbounded", discard: true })
        })
    )
    const byHandle = new WeakMap<ShmMapping, Tracked>()

    const describeMapping = (native: AddonMapping): string =>
      native.kind === "shm"
        ? `shared-memory segment ${native.name}`
        : native.kind === "cuda_ipc"
        ? `CUDA IPC mapping ${native.name}`
        : `CUDA allocation ${native.name}`

    const track = (native: AddonMapping, owned: boolean): Tracked => {
      let releases = 0
      let closing: Promise<NativeError | undefined> | undefined
      const base = {
        name: native.name,
        sizeBytes: native.size,
        identity: native.identity,
        isClosed: () => native.closed,
        releases: () => releases
      }
      const handle: ShmMapping = Object.freeze(
        native.kind === "cuda_alloc"
          ? { ...base, ipcHandle: native.ipcHandle(), deviceUuid: native.device } satisfies CudaAllocation
          : base
      )
      const tracked: Tracked = {
        native,
        handle,
        owned,
        release: Effect.suspend(() => {
          if (closing === undefined) {
            releases++
            closing = native.close().then(
              () => undefined,
              (e: unknown) => toNativeError(e, "munmap")
            ).finally(() => open.delete(tracked))
          }
          const done = closing
          return Effect.promise(() => done).pipe(
            Effect.flatMap((error) =>
              error === undefined
                ? Effect.logDebug(`released ${describeMapping(native)} (${native.size} bytes)`)
                : Effect.logWarning(`releasing the mapping of ${native.name} failed: ${error.message}`)
            )
          )
        })
      }
      open.add(tracked)
      byHandle.set(handle, tracked)
      return tracked
    }

    /** The tracked mapping behind a handle; InvalidArgument for a foreign one. */
    const resolve = (call: string, mapping: ShmMapping): Effect.Effect<Tracked, InvalidArgument> => {
      const tracked = byHandle.get(mapping)
      return tracked === undefined
        ? Effect.fail(
          new InvalidArgument({
            message: `${call}: the mapping of segment ${mapping.name} was not opened by this NativeMemory; expected a ShmMapping from its map()`
          })
        )
        : Effect.succeed(tracked)
    }

    const copyAll = (
      direction: "gather" | "scatter",
      parts: ReadonlyArray<CopyPart>,
      buffer: Uint8Array
    ): Effect.Effect<void, InvalidArgument | NativeError> =>
      Effect.suspend(() => {
        const natives: Array<AddonMapping> = []
        for (const part of parts) {
          const tracked = byHandle.get(part.mapping)
          if (tracked === undefined) return resolve(direction, part.mapping).pipe(Effect.asVoid)
          natives.push(tracked.native)
        }
        return calls.copyBatch(direction, natives, parts.map((p) => p.ranges), buffer)
      })

    /** Scoped: opens with `open` (unless shut down), tracks, releases with the scope. */
    const acquire = (
      call: string,
      what: string,
      open: Effect.Effect<AddonMapping, InvalidArgument | NativeError>,
      owned = false
    ) =>
      Effect.acquireRelease(
        Effect.suspend(() =>
          shutDown
            ? Effect.fail(
              new NativeError({
                call,
                errno: "ECLOSED",
                message: `cannot map ${what}: the native memory layer is shut down`
              })
            )
            : open.pipe(
              Effect.map((native) => track(native, owned)),
              Effect.tap((t) => Effect.logDebug(`mapped ${describeMapping(t.native)} (${t.native.size} bytes)`))
            )
        ),
        (tracked) => tracked.release
      ).pipe(Effect.map((tracked) => tracked.handle))

    let cudaInfo: CudaBackendInfo | undefined
    const cudaBackend = (): Effect.Effect<CudaBackendInfo> =>
      cudaInfo !== undefined
        ? Effect.succeed(cudaInfo)
        : calls.cudaProbe().pipe(
          Effect.tap((info) =>
            Effect.sync(() => {
              cudaInfo = info
            }).pipe(
              Effect.andThen(
                info.available
                  ? Effect.logInfo(
                    `CUDA backend: ${info.library}, ${info.devices.length} device(s): ${info.devices.map((d) => d.uuid).join(", ")}`
                  )
                  : Effect.logInfo(`CUDA backend not available: ${info.reason}`)
              )
            )
          )
        )

    const service: NativeMemoryShape = {
      createSegment: calls.createSegment,
      unlinkSegment: calls.unlinkSegment,
      segmentSize: calls.segmentSize,
      unlinkSegmentIf: calls.unlinkSegmentIf,
      map: (name, nbytes, options) => acquire("map", `segment ${name}`, calls.openMapping(name, nbytes), options?.owned === true),
      mapFd: (fd, name, nbytes) => acquire("mapFd", `passed descriptor ${name}`, calls.openMappingFd(fd, name, nbytes)),
      mapCudaIpc: (ipcHandle, deviceUuid, nbytes) =>
        acquire(
          "mapCudaIpc",
          `a CUDA IPC handle on device ${deviceUuid}`,
          // Probing first hands MPCACHE_CUDART from this thread's environment to the loader.
          Effect.andThen(cudaBackend(), calls.openCudaIpcMapping(ipcHandle, deviceUuid, nbytes))
        ),
      allocateCuda: (deviceUuid, nbytes) =>
        acquire(
          "allocateCuda",
          `a CUDA allocation on device ${deviceUuid}`,
          Effect.andThen(cudaBackend(), calls.cudaAllocate(deviceUuid, nbytes)),
          true
        ).pipe(Effect.map((handle) => handle as CudaAllocation)),
      cudaBackend,
      cudaAvailable: () => Effect.map(cudaBackend(), (info) => info.available),
      cudaMemInfo: (deviceUuid) => Effect.andThen(cudaBackend(), calls.cudaMemGetInfo(deviceUuid)),
      gather: (mapping, ranges, dest) =>
        Effect.flatMap(resolve("gather", mapping), (t) => calls.copy("gather", t.native, ranges, dest)),
      scatter: (mapping, ranges, src) =>
        Effect.flatMap(resolve("scatter", mapping), (t) => calls.copy("scatter", t.native, ranges, src)),
      gatherAll: (parts, dest) => copyAll("gather", parts, dest),
      scatterAll: (parts, src) => copyAll("scatter", parts, src),
      prefault: (mapping, offset, length, options) =>
        Effect.flatMap(resolve("prefault", mapping), (t) => calls.prefault(t.native, offset, length, options?.touch === true)),
      view: (mapping) => Effect.flatMap(resolve("view", mapping), (t) => calls.view(t.native)),
      stats: calls.stats,
      usage: () => {
        let mappings = 0
        let hostBytes = 0
        let deviceBytes = 0
        for (const t of open) {
          if (t.owned) continue
          mappings++
          if (t.native.kind === "shm") hostBytes += t.native.size
          else deviceBytes += t.native.size
        }
        return { mappings, hostBytes, deviceBytes }
      },
      guardedFaults: calls.guardedFaults,
      cudaFaults: calls.cudaFaults
    }
    return service
  })
)
