/**
 * @internal
 *
 * Worker memory of the LMCache-driven transfer module (DESIGN §4; issue 13
 * items 2–4, issue 24 item 12): what REGISTER_KV_CACHE maps and what a reap
 * unlinks.
 *
 * - {@link WorkerMemory.claimTokens} claims the cpu_memfd tokens a REGISTER
 *   names (FdExchange) before anything else, so a replayed token is refused
 *   even when the instance is held; {@link WorkerMemory.memoryIdentities}
 *   and {@link WorkerMemory.memfdOrigin} are what a repeated REGISTER must
 *   match and what /api/status shows.
 * - {@link WorkerMemory.mapContext} maps a validated KV cache's segments
 *   into the entry's Scope (each once, however many layers view it; no page
 *   touched: no prefault, whose population would allocate a sparse memfd's
 *   holes, charged to the server) and takes the model's layout reference
 *   there. A refused CUDA IPC handle fails with the instance, descriptor,
 *   device and CUDA error (issue 13 item 4); every error is an
 *   InvalidArgument of REGISTER.
 * - {@link WorkerMemory.unlinkReapedNames} is `--unlink-reaped-segments`
 *   (issue 13 item 3).
 */
import { Effect, Scope } from "effect"
import { type CopyPart, isCudaFault, type NativeMemory, type ShmMapping } from "../../../native/Native.ts"
import { chunkRanges, type SegmentPlan, segmentPlan } from "./CopyPlan.ts"
import { sealNames } from "../../../native/FdPassing.ts"
import { formatInstanceId, type InstanceId } from "../../../schema/InstanceId.ts"
import { RegisterKvCache } from "../../../schema/Op.ts"
import type { TensorDescriptor } from "../../../schema/TensorDescriptor.ts"
import { InvalidArgument } from "../../../schema/WireError.ts"
import type { PagedKvGeometry, ValidatedKvCaches } from "../../kv/KvCacheLayout.ts"
import type { ClaimedFds, FdExchange } from "../FdExchange.ts"
import type { KvLayout, LayoutRegistry } from "../LayoutRegistry.ts"
import type { ContextEntry, MemfdOrigin } from "../LmcacheDrivenTransfer.ts"
import { cudaFaultError, fieldOfSegment } from "./FaultRelease.ts"

/** The L1 object layout of a context's geometry for `chunk`-token chunks (LayoutRegistry, L2 fingerprint). */
export const kvLayoutOf = (g: PagedKvGeometry, chunk: number): KvLayout => ({
  numLayers: g.numLayers,
  hiddenDim: g.hiddenDim,
  elementBytes: g.elementBytes,
  dtype: g.dtype,
  chunkBytes: 2 * g.numLayers * chunk * g.hiddenDim * g.elementBytes
})

/** The hex text of a cpu_memfd descriptor's token: the key of its claim. */
const tokenHexOf = (token: Uint8Array) => Buffer.from(token).toString("hex")

/** What the module maps worker memory with (see the module header). */
export interface WorkerMemory {
  /**
   * Scoped: claims every token the cpu_memfd descriptors name, keyed by the
   * token's hex; the descriptors close with the scope. InvalidArgument naming
   * `kv_caches[i].fd_token` when the server has no descriptor socket or the
   * claim is refused.
   */
  readonly claimTokens: (
    peer: string,
    id: InstanceId,
    kvCaches: ReadonlyArray<TensorDescriptor>
  ) => Effect.Effect<ReadonlyMap<string, ClaimedFds>, InvalidArgument, Scope.Scope>
  /** Per descriptor, the identity ("<dev>:<ino>") of the memfd it names ("" for other kinds); a token is unique per claim. */
  readonly memoryIdentities: (kvCaches: ReadonlyArray<TensorDescriptor>, claimed: ReadonlyMap<string, ClaimedFds>) => ReadonlyArray<string>
  /** The /api/status detail of claimed descriptors; undefined when none were passed. */
  readonly memfdOrigin: (validated: ValidatedKvCaches, claimed: ReadonlyMap<string, ClaimedFds>) => MemfdOrigin | undefined
  /** Maps the segments into `scope` and takes the layout reference there (segment name → mapping). */
  readonly mapContext: (
    scope: Scope.Closeable,
    id: InstanceId,
    kvCaches: ReadonlyArray<TensorDescriptor>,
    validated: ValidatedKvCaches,
    claimed: ReadonlyMap<string, ClaimedFds>,
    modelName: string,
    worldSize: number
  ) => Effect.Effect<ReadonlyMap<string, ShmMapping>, InvalidArgument>
  /**
   * The cpu_shm names of a reaped context, each unlinked only while it still
   * names the file the server mapped (st_dev/st_ino recorded at map time),
   * so a name a restarted worker re-created is kept. Logged per name; a
   * failure is a WARNING.
   */
  readonly unlinkReapedNames: (id: InstanceId, entry: ContextEntry) => Effect.Effect<void>
  /**
   * The block ids of `count` chunks of a transfer through `entry`
   * (`block_ids[0]`, `chunk / block_size` per chunk), or the reason to fail
   * closed: too few ids, or an id outside the registered blocks.
   */
  readonly blocksFor: (
    entry: ContextEntry,
    blockIds: ReadonlyArray<ReadonlyArray<number>>,
    count: number
  ) => { readonly perChunk: number; readonly list: ReadonlyArray<number> } | { readonly error: string }
  /**
   * One chunk's copy through `entry` (blocks `chunkBlocks`, the first
   * `skipTokens` tokens left out) as the parts of one batched copy, one per
   * segment. The context's segment plan is built at its first transfer.
   */
  readonly copyParts: (entry: ContextEntry, chunkBlocks: ReadonlyArray<number>, skipTokens?: number) => Array<CopyPart>
}

/**
 * The worker memory of a module over `native`, `layouts` and (when the
 * server has a descriptor socket) `fdExchange`, for `chunk`-token chunks.
 */
export const makeWorkerMemory = (deps: {
  readonly native: NativeMemory["Service"]
  readonly layouts: LayoutRegistry["Service"]
  readonly fdExchange: FdExchange["Service"] | undefined
  readonly chunk: number
}): WorkerMemory => {
  const { native, layouts, fdExchange, chunk } = deps

  const claimTokens = (peer: string, id: InstanceId, kvCaches: ReadonlyArray<TensorDescriptor>) =>
    Effect.gen(function*() {
      const claimed = new Map<string, ClaimedFds>()
      for (const [i, d] of kvCaches.entries()) {
        if (d.kind !== "cpu_memfd" || d.fd_token === undefined) continue
        const hex = tokenHexOf(d.fd_token)
        if (claimed.has(hex)) continue
        const field = `kv_caches[${i}].fd_token`
        if (fdExchange === undefined) {
          return yield* new InvalidArgument({ op: RegisterKvCache.name, field, message: `${RegisterKvCache.name}: ${field} names passed descriptors, but this server has no descriptor socket` })
        }
        claimed.set(hex, yield* fdExchange.claim(RegisterKvCache.name, id, peer, field, d.fd_token))
      }
      return claimed
    })

  const memoryIdentities = (kvCaches: ReadonlyArray<TensorDescriptor>, claimed: ReadonlyMap<string, ClaimedFds>) =>
    kvCaches.map((d) =>
      d.kind === "cpu_memfd" && d.fd_token !== undefined
        ? claimed.get(tokenHexOf(d.fd_token))?.fds[d.fd_index ?? 0]?.identity ?? ""
        : "")

  const memfdOrigin = (validated: ValidatedKvCaches, claimed: ReadonlyMap<string, ClaimedFds>): MemfdOrigin | undefined => {
    const first = claimed.values().next().value
    if (first === undefined) return undefined
    return {
      pid: first.pid,
      uid: first.uid,
      gid: first.gid,
      segments: [...validated.memfd].map(([segment, p]) => {
        const fd = claimed.get(p.tokenHex)?.fds[p.index]
        return { segment, bytes: fd?.size ?? 0, seals: sealNames(fd?.seals ?? -1) }
      })
    }
  }

  /** A passed descriptor (cpu_memfd) mapped into `scope`; the claim closes the descriptor after REGISTER. */
  const mapPassed = (
    scope: Scope.Closeable,
    name: string,
    nbytes: number,
    passed: { readonly tokenHex: string; readonly index: number; readonly field: string },
    claimed: ReadonlyMap<string, ClaimedFds>
  ) => {
    const fds = claimed.get(passed.tokenHex)?.fds ?? []
    const fd = fds[passed.index]
    return fd === undefined
      ? Effect.fail(new InvalidArgument({ message: `${passed.field}.fd_index: ${passed.index}, but the token's request passed ${fds.length} descriptor(s)` }))
      : native.mapFd(fd.fd, name, nbytes).pipe(Scope.provide(scope))
  }

  const mapContext: WorkerMemory["mapContext"] = (scope, id, kvCaches, validated, claimed, modelName, worldSize) =>
    Effect.gen(function*() {
      const mappings = new Map<string, ShmMapping>()
      for (const [name, nbytes] of validated.segments) {
        const ipc = validated.cudaIpc.get(name)
        if (ipc !== undefined) {
          // One IPC mapping (and stream) per distinct handle, however many layers view it. A handle the driver
          // refuses (or a device failing while it opens) fails the REGISTER with the instance, the descriptor,
          // the device and the CUDA error (issue 13 item 4); the mappings opened so far close with the scope.
          const mapping = yield* native.mapCudaIpc(ipc.ipcHandle, ipc.deviceUuid, nbytes).pipe(
            Scope.provide(scope),
            Effect.catchIf(isCudaFault, (f) =>
              Effect.fail(cudaFaultError(RegisterKvCache.name, formatInstanceId(id), fieldOfSegment(kvCaches, name), f)))
          )
          mappings.set(name, mapping)
          continue
        }
        const passed = validated.memfd.get(name)
        const mapping = passed === undefined
          ? yield* native.map(name, nbytes).pipe(Scope.provide(scope))
          : yield* mapPassed(scope, name, nbytes, passed, claimed)
        // No prefault (issue 24 item 12): populating the page tables would allocate every page of a
        // sparse memfd, charged to the server. The first copy through each page pays its fault instead
        // (measured in docs/security.md: about +0.2 s per GiB on a first RETRIEVE, once).
        mappings.set(name, mapping)
      }
      const { geometry } = validated
      yield* layouts.register(modelName, worldSize, kvLayoutOf(geometry, chunk))
      yield* Scope.addFinalizer(scope, layouts.unregister(modelName, worldSize))
      return mappings
    }).pipe(
      Effect.mapError((e) =>
        // A reply already built for this op (a refused CUDA handle) goes as it is.
        e._tag === "InvalidArgument" && e.op === RegisterKvCache.name
          ? e
          : e._tag === "InvalidArgument"
          ? new InvalidArgument({ message: `register_kv_cache: ${e.message}` })
          : new InvalidArgument({
            message: `register_kv_cache: mapping the KV cache failed: ${e.message}`
          })
      )
    )

  const unlinkReapedNames = (id: InstanceId, entry: ContextEntry) =>
    Effect.forEach(entry.mappings, ([name, mapping]) =>
      mapping.identity === ""
        ? Effect.void // CUDA memory: no name
        : native.unlinkSegmentIf(name, mapping.identity).pipe(
          Effect.flatMap((outcome) =>
            Effect.logInfo(
              outcome === "unlinked"
                ? `unlinked /dev/shm/${name} of reaped instance ${formatInstanceId(id)}`
                : outcome === "replaced"
                ? `kept /dev/shm/${name} of reaped instance ${formatInstanceId(id)}: the name now names another segment (re-created)`
                : `/dev/shm/${name} of reaped instance ${formatInstanceId(id)} was already unlinked`
            )
          ),
          Effect.catch((e) => Effect.logWarning(`could not unlink /dev/shm/${name} of reaped instance ${formatInstanceId(id)}: ${e.message}`))
        ), { discard: true })

  // Per context: its segments in copy-plan order and their mappings, built at its first transfer.
  const plans = new WeakMap<ContextEntry, { readonly segments: SegmentPlan; readonly mappings: ReadonlyArray<ShmMapping> }>()
  const planOf = (entry: ContextEntry) => {
    let plan = plans.get(entry)
    if (plan === undefined) {
      const segments = segmentPlan(entry.layers)
      plan = { segments, mappings: segments.names.map((name) => entry.mappings.get(name)!) }
      plans.set(entry, plan)
    }
    return plan
  }

  const copyParts = (entry: ContextEntry, chunkBlocks: ReadonlyArray<number>, skipTokens = 0): Array<CopyPart> => {
    const { segments, mappings } = planOf(entry)
    const ranges = chunkRanges(entry.geometry, entry.layers, chunk, chunkBlocks, skipTokens, segments)
    const parts: Array<CopyPart> = new Array(ranges.length)
    for (let i = 0; i < ranges.length; i++) parts[i] = { mapping: mappings[i]!, ranges: ranges[i]! }
    return parts
  }

  const blocksFor = (entry: ContextEntry, blockIds: ReadonlyArray<ReadonlyArray<number>>, count: number) => {
    const perChunk = chunk / entry.geometry.blockSizeTokens
    const list = blockIds[0] ?? []
    if (list.length < count * perChunk) {
      return { error: `block_ids[0] has ${list.length} ids; ${count} chunk(s) of ${perChunk} blocks need ${count * perChunk}` }
    }
    for (let i = 0; i < count * perChunk; i++) {
      if (list[i]! >= entry.geometry.numBlocks) {
        return { error: `block_ids[0][${i}] = ${list[i]} is outside the registered ${entry.geometry.numBlocks} blocks` }
      }
    }
    return { perChunk, list }
  }

  return { claimTokens, memoryIdentities, memfdOrigin, mapContext, unlinkReapedNames, blocksFor, copyParts }
}
