/**
 * The blend module (CacheBlend, "CB"; DESIGN §3.1 ops 25–27, §4 "Blend", §5;
 * reference §5 and §6.2): per-instance RoPE state, and the retrieve that
 * places cached chunks at new positions of a request, re-rotating K.
 *
 * **RoPE state.** CB_REGISTER_ROPE (SYNC) attaches cos/sin tables to an
 * instance that holds an LMCache-driven kv_cache context (else
 * `not_registered`). Tables are `cpu_shm` descriptors of vLLM's
 * `cos_sin_cache`: float32 `[max_position, rotary_dim]`, contiguous, row p =
 * `cos(p·θ)` (first rotary_dim/2 columns) then `sin(p·θ)` (the rest); the
 * full rules are `validateRope` in `Rope.ts` (a violation is
 * `invalid_argument` naming the field; `cuda_ipc` is "CUDA IPC backend not
 * available on this host"). `head_size` must equal the registered KV cache's
 * head size, whose dtype must be float16, bfloat16 or float32. The tables'
 * segments are mapped into a Scope owned by the state (a child of this
 * module's scope, like a transfer context's), and rows are read from them
 * at retrieve time: the server keeps no copy.
 *
 * - Re-registering an id with identical arguments (same descriptors,
 *   head size, style and group maps) is a no-op: nothing is remapped. With
 *   different arguments it **replaces** the state (upstream assigns
 *   `_cb_rope_state[id]`): the new tables are validated and mapped first —
 *   a failure leaves the old state in place — then swapped in, then the old
 *   state is released.
 * - CB_UNREGISTER_ROPE drops only the RoPE state; the KV context stays. An
 *   id without state logs a WARNING and succeeds (like UNREGISTER_KV_CACHE).
 * - Liveness: this module is a state mirror (upstream BlendModule; the
 *   mirror kind of the per-instance core, `InstanceModule.ts`). It
 *   answers `cb_rope` in PING_REGISTERED (`holdsInstance` = has RoPE state),
 *   tracks no liveness of its own (`touchInstance` no-op,
 *   `reapStaleInstances` → [], `trackedInstanceCount` 0 — the KV context it
 *   mirrors is what is tracked), and `dropInstanceState(id)` drops the state
 *   of a reaped instance ("dropped CB rope state for reaped instance <id>").
 * - Release: a state's one finalizer is closing its Scope (unmapping its
 *   tables, waiting for row reads in flight); unregister, replace, reap and
 *   shutdown each pop the state first, so the tables are unmapped exactly
 *   once.
 * - A REGISTER racing a reap: the state is inserted, then the KV context is
 *   checked again; if the reap popped it meanwhile the new state is popped
 *   and released and the request fails `not_registered`. (A reap after that
 *   check reaches `dropInstanceState`, which drops it.) A clean
 *   UNREGISTER_KV_CACHE does not drop RoPE state (upstream: only a reap
 *   does); the worker sends CB_UNREGISTER_ROPE, or shutdown releases it.
 *
 * **CB_RETRIEVE_PRE_COMPUTED** (AFFINITY) `[key, matches, block_ids,
 * instance_id, event_handle] → [event_handle, ok]`. Token mapping, per match
 * `{old_st, old_ed, cur_st, cur_ed, hash}`:
 * - The L1 object is looked up by ObjectKey `{hash, key.model_name, kv rank
 *   = key.worker_id, key.cache_salt}` (the 32-byte chunk hash of
 *   `TokenHasher.ts`). It holds one chunk `[2, num_layers, chunk_size,
 *   num_heads·head_size]` (K = 0, V = 1): tokens `[c·chunk, (c+1)·chunk)` of
 *   the request it was stored from.
 * - `old_st`/`old_ed` are positions in that original request, and
 *   `[old_st, old_ed)` must lie inside one chunk: c = ⌊old_st / chunk⌋ and
 *   `old_ed ≤ (c+1)·chunk`. Token `old_st + t` is token
 *   `(old_st mod chunk) + t` of the object.
 * - `cur_st`/`cur_ed` are positions in the current request; position p
 *   lives in block `block_ids[0][⌊p / block_size⌋]` at slot `p mod
 *   block_size` (block_ids covers the request from position 0, like vLLM's
 *   block table; only KV group 0 is used).
 * - `old_ed − old_st = cur_ed − cur_st`; an empty match is a no-op. Ranges of
 *   different matches must not overlap at the current positions.
 * - Every layer's V is copied byte for byte. K is rotated by
 *   Δ = cur_st − old_st with the state's table row |Δ| (group 0's table and
 *   rotary slice; see `Rope.ts`); Δ = 0 copies K byte for byte too.
 *   |Δ| must be below the table's max_position.
 * - A violation of these rules (or a key with worker_id nil, a block id
 *   outside the registered blocks, a cached object of another size) is
 *   `invalid_argument`; nothing is written. A chunk not in L1 answers
 *   `ok = false` and nothing is written for the request (fail closed).
 *   Everything is checked, looked up and computed before the first byte is
 *   scattered. The checks of a match plan, the rotation into a staging
 *   buffer and the copy plan are `internal/BlendPlan.ts`; this module holds
 *   the locks, reads the cos/sin rows and scatters.
 * - Like RETRIEVE it takes the read locks of `key.request_id`'s prefetch
 *   session when it holds them (else fresh locks) and releases them.
 * - The CB retrieve counts as transfer activity of the KV context (DESIGN
 *   §5): it refreshes last_seen and latches the flag.
 *
 * Cost: the rotation runs in TypeScript on the JS thread, ~25–35 ns per
 * pair of K elements once warm: a full 256-token chunk of 32 layers × 8
 * heads × 128 dims is ~4 M pairs, ~0.1 s of CPU (V is a native copy). It
 * yields to the event loop every 2¹⁸ pairs (~8 ms), so PING and the other
 * lanes keep being served while a CB retrieve computes; a native kernel (or
 * a worker thread) is the next step if blend traffic grows.
 */
import { Context, Effect, Layer, Metric, Scope } from "effect"
import { ServerConfig, type ServerConfigInput } from "./ServerConfig.ts"
import { isSegmentFault, type NativeError, NativeMemory, type ShmMapping, type WorkerMemoryFault } from "../../native/Native.ts"
import type { CacheKey } from "../../schema/CacheKey.ts"
import type { CbMatch } from "../../schema/CbMatch.ts"
import { formatInstanceId, type InstanceId } from "../../schema/InstanceId.ts"
import { CbRegisterRope, CbRetrievePreComputed, CbUnregisterRope } from "../../schema/Op.ts"
import type { GroupRot } from "../../schema/Registration.ts"
import type { TensorDescriptor } from "../../schema/TensorDescriptor.ts"
import { type Forbidden, InvalidArgument, NotRegistered, type Overloaded, type WireError } from "../../schema/WireError.ts"
import { row, type ServerModule } from "./Handler.ts"
import { sameDescriptors, type SegmentDemand } from "../kv/KvCacheLayout.ts"
import { MappingBudget } from "./MappingBudget.ts"
import type { ReadHandle } from "./L1Store.ts"
import type { InstanceOwner } from "../liveness/InstanceOwner.ts"
import type { LivenessTarget } from "../liveness/LivenessTarget.ts"
import { makeMirroredInstances } from "./InstanceModule.ts"
import { type ContextEntry, LmcacheDrivenTransfer, namedSegmentsDenied } from "./LmcacheDrivenTransfer.ts"
import { Lookup } from "./Lookup.ts"
import { validateRope, type ValidatedRope } from "./internal/Rope.ts"
import { kvCompatibility, planCopies, planMatches } from "./internal/BlendPlan.ts"
import { fromStart } from "../metrics/Series.ts"

// ---------------------------------------------------------------------------
// models
// ---------------------------------------------------------------------------

/** One instance's RoPE state (upstream `_CBRopeState`). */
interface RopeState {
  readonly descriptors: ReadonlyArray<TensorDescriptor>
  readonly headSize: number
  readonly isNeoxStyle: boolean
  readonly groupToCache: ReadonlyArray<number>
  readonly groupRot: ReadonlyArray<GroupRot>
  readonly rope: ValidatedRope
  /** Segment name → mapping, owned by `scope`. */
  readonly mappings: ReadonlyMap<string, ShmMapping>
  /** Owns the table mappings; closed exactly once. */
  readonly scope: Scope.Closeable
}

const sameList = <A>(a: ReadonlyArray<A>, b: ReadonlyArray<A>) => JSON.stringify(a) === JSON.stringify(b)

const cbMatchesTotal = fromStart(Metric.counter("mpcache_cb_retrieved_matches_total", {
  description: "CBMatch ranges written by CB_RETRIEVE_PRE_COMPUTED",
  incremental: true
}))
const cbTokensTotal = fromStart(Metric.counter("mpcache_cb_retrieved_tokens_total", {
  description: "Tokens (all layers, K and V) written by CB_RETRIEVE_PRE_COMPUTED",
  incremental: true
}))

// ---------------------------------------------------------------------------
// service
// ---------------------------------------------------------------------------

export class Blend extends Context.Service<Blend, {
  /**
   * CB_REGISTER_ROPE. NotRegistered without a KV context; InvalidArgument
   * naming the bad field; Overloaded naming the flag when the tables' segments
   * are over the mapping budget (MappingBudget, issue 24 item 4), nothing mapped.
   * `owner`: who registers it (the tenant guard's, issue 25 item 1), inserted
   * with a new state; its mapped bytes are the tables'.
   */
  readonly registerRope: (
    id: InstanceId,
    cosSinCaches: ReadonlyArray<TensorDescriptor>,
    headSize: number,
    isNeoxStyle: boolean,
    groupToCache: ReadonlyArray<number>,
    groupRot: ReadonlyArray<GroupRot>,
    owner?: InstanceOwner
  ) => Effect.Effect<void, InvalidArgument | NotRegistered | Overloaded | Forbidden>
  /** CB_UNREGISTER_ROPE: drops the RoPE state only. An id without one logs a WARNING and succeeds. */
  readonly unregisterRope: (id: InstanceId) => Effect.Effect<void, Forbidden>
  /** CB_RETRIEVE_PRE_COMPUTED → ok. NotRegistered (no KV context or no RoPE state) / InvalidArgument. */
  readonly retrievePreComputed: (
    key: CacheKey,
    matches: ReadonlyArray<CbMatch>,
    blockIds: ReadonlyArray<ReadonlyArray<number>>,
    id: InstanceId
  ) => Effect.Effect<boolean, WireError>
  /** Whether `id` has RoPE state. */
  readonly hasRope: (id: InstanceId) => Effect.Effect<boolean>
  /** Ids holding RoPE state, ascending. */
  readonly ropeInstances: () => ReadonlyArray<InstanceId>
  /** The `blend` block of `/api/status`: `{rope_instances: [decimal id …]}`. */
  readonly status: () => Effect.Effect<Record<string, unknown>>
  /** This module as a liveness target: a state mirror of kind `cb_rope`. */
  readonly target: LivenessTarget
  /** Rows: CB_REGISTER_ROPE / CB_UNREGISTER_ROPE SYNC, CB_RETRIEVE_PRE_COMPUTED AFFINITY. */
  readonly module: ServerModule
}>()("mpcache/services/Blend") {
  /** Needs the LMCache-driven transfer module, lookup, native memory, the mapping budget and the config. */
  static readonly layer = Layer.effect(this, Effect.suspend(() => make))
  /**
   * For tests: blend over `LmcacheDrivenTransfer.layerTest(config)` (the
   * transfer module, its storage, lookup and the config, each an output
   * too). It needs only `NativeMemory`, the raw resource
   * (`NativeMemoryLive` of src/layers, or a test's probe over it).
   */
  static readonly layerTest = (config: Partial<ServerConfigInput> = {}) =>
    this.layer.pipe(Layer.provideMerge(LmcacheDrivenTransfer.layerTest(config)))
}

const make = Effect.gen(function*() {
  const config = yield* ServerConfig
  const native = yield* NativeMemory
  const budget = yield* MappingBudget
  const transfer = yield* LmcacheDrivenTransfer
  const lookup = yield* Lookup
  const chunk = config.chunkSizeTokens
  /** RoPE state by instance id: a state mirror of the kv_cache context (see the module header). */
  const states = yield* makeMirroredInstances<RopeState>({
    name: "blend",
    kind: "cb_rope",
    missing: "has no CB RoPE state",
    remedy: "send cb_register_rope",
    registerOp: CbRegisterRope.name,
    unregisterOp: CbUnregisterRope.name,
    dropped: (idText) => `dropped CB rope state for reaped instance ${idText}`
  })

  const noKvContext = (op: string, id: InstanceId) =>
    new NotRegistered({
      op,
      instance_id: formatInstanceId(id),
      message: `${op}: instance ${formatInstanceId(id)} holds no LMCache-driven kv_cache context (never registered, unregistered or reaped); register_kv_cache first`
    })

  /** Validates the tables against the KV context `entry`, asks the budget for `demand` and maps them into `scope`. */
  const acquireRope = (
    scope: Scope.Closeable,
    id: InstanceId,
    entry: ContextEntry,
    demand: SegmentDemand,
    request: Omit<RopeState, "rope" | "mappings" | "scope">
  ) =>
    Effect.gen(function*() {
      const op = "cb_register_rope"
      // A replaced state's tables are still mapped until the new ones are: counted too (fail closed).
      yield* budget.admit(op, id, demand)
      const { descriptors: caches, headSize } = request
      const rope = validateRope(caches, headSize, request.groupToCache, request.groupRot)
      if ("error" in rope) return yield* new InvalidArgument({ message: `${op}: ${rope.error}` })
      const compatible = kvCompatibility(headSize, entry.geometry)
      if ("error" in compatible) return yield* new InvalidArgument({ message: `${op}: ${compatible.error}` })
      const mappings = new Map<string, ShmMapping>()
      for (const [name, nbytes] of rope.segments) {
        const field = `cos_sin_caches[${caches.findIndex((d) => d.shm_name === name)}]`
        mappings.set(
          name,
          yield* native.map(name, nbytes).pipe(
            Scope.provide(scope),
            Effect.mapError((e) =>
              new InvalidArgument({
                message: e._tag === "InvalidArgument"
                  ? `${op}: ${field}: ${e.message}`
                  : `${op}: ${field}: mapping the cos/sin table failed: ${e.message}`
              })
            )
          )
        )
      }
      return { ...request, rope, mappings, scope } satisfies RopeState
    })

  const registerRope = (
    id: InstanceId,
    caches: ReadonlyArray<TensorDescriptor>,
    headSize: number,
    isNeoxStyle: boolean,
    groupToCache: ReadonlyArray<number>,
    groupRot: ReadonlyArray<GroupRot>,
    owner?: InstanceOwner
  ) =>
    Effect.gen(function*() {
      const op = "cb_register_rope"
      const entry = yield* transfer.contextOf(id)
      if (entry === undefined) return yield* noKvContext(op, id)
      // --named-segments deny (issue 13 item 3): the cos/sin tables are named segments too.
      const named = caches.findIndex((d) => d.kind === "cpu_shm")
      if (config.namedSegments === "deny" && named >= 0) return yield* namedSegmentsDenied(op, id, `cos_sin_caches[${named}]`)
      const demand = yield* budget.demandOf(op, id, "cos_sin_caches", caches)
      const registered = yield* states.register(id, {
        owner,
        same: (held) =>
          sameDescriptors(held.descriptors, caches) && held.headSize === headSize && held.isNeoxStyle === isNeoxStyle &&
          sameList(held.groupToCache, groupToCache) && sameList(held.groupRot, groupRot),
        acquire: (scope) => acquireRope(scope, id, entry, demand, { descriptors: caches, headSize, isNeoxStyle, groupToCache, groupRot })
      })
      if (registered._tag === "Unchanged") {
        return yield* Effect.logInfo(`instance ${formatInstanceId(id)} already has this CB RoPE state; unchanged`)
      }
      // A reap may have popped the KV context while the tables were mapped: see the module header.
      if ((yield* transfer.contextOf(id)) === undefined) {
        yield* states.withdraw(id, registered.entry, "unregister")
        return yield* noKvContext(op, id)
      }
      const { rope } = registered.entry
      const shapes = rope.tables.map((t) => `[${t.maxPosition}, ${t.rotaryDim}]`).join(", ")
      yield* Effect.logInfo(
        `${registered.replaced === undefined ? "registered" : "replaced"} CB RoPE state for instance ${formatInstanceId(id)}: ` +
          `cos/sin table(s) ${shapes} float32, head size ${headSize}, ${isNeoxStyle ? "neox" : "GPT-J"} style, ${rope.groups.length} KV group(s)`
      )
    })

  const unregisterRope = (id: InstanceId) =>
    Effect.flatMap(states.unregister(id), (released) =>
      released === undefined
        ? Effect.logWarning(`cb_unregister_rope: no CB RoPE state found for instance ${formatInstanceId(id)}`)
        : Effect.logInfo(`unregistered CB RoPE state of instance ${formatInstanceId(id)}`))

  /** cos/sin rows |Δ| of `state`'s table `cacheIndex`, read from its mapping: |Δ| → `rotary_dim` float32 values. */
  const readRows = (state: RopeState, cacheIndex: number, shifts: ReadonlyArray<number>) =>
    Effect.gen(function*() {
      const table = state.rope.tables[cacheIndex]!
      const rowBytes = table.rotaryDim * 4
      const ranges = new Float64Array(3 * shifts.length)
      shifts.forEach((s, k) => ranges.set([table.baseOffsetBytes + s * rowBytes, k * rowBytes, rowBytes], 3 * k))
      const dest = new Uint8Array(shifts.length * rowBytes)
      yield* native.gather(state.mappings.get(table.shmName)!, ranges, dest)
      const all = new Float32Array(dest.buffer)
      return new Map(shifts.map((s, k) => [s, all.subarray(k * table.rotaryDim, (k + 1) * table.rotaryDim)]))
    })

  /**
   * A copy of the retrieve hit a vanished page (issue 13 item 1): a cos/sin table's segment (read) or a KV
   * segment (scatter) shrank; or a CUDA call failed scattering into a cuda_ipc KV cache (item 4). Both halves of the instance go: the RoPE state through the mirror's finalizer
   * (withdraw) and the KV context through the transfer module's (releaseFaulted, which answers the reply).
   */
  const released = (op: string, id: InstanceId, entry: ContextEntry, state: RopeState, fault: WorkerMemoryFault) =>
    Effect.andThen(
      states.withdraw(id, state, "fault"),
      transfer.releaseFaulted(op, id, entry, fault, state.mappings.get(fault.segment)?.sizeBytes)
    )

  const retrievePreComputed = (
    key: CacheKey,
    matches: ReadonlyArray<CbMatch>,
    blockIds: ReadonlyArray<ReadonlyArray<number>>,
    id: InstanceId
  ) =>
    Effect.gen(function*() {
      const op = "cb_retrieve_pre_computed"
      const entry = yield* transfer.resolveContext(op, id)
      const state = yield* states.resolveForTransfer(op, id)
      const rank = key.worker_id
      if (rank === null) return yield* new InvalidArgument({ message: `${op}: key.worker_id is nil; a ${op} names the kv rank it moves` })
      const g = entry.geometry
      // The KV context may have been re-registered with another layout since the RoPE state was.
      const compatible = kvCompatibility(state.headSize, g)
      if ("error" in compatible) return yield* new InvalidArgument({ message: `${op}: ${compatible.error}` })
      const group = state.rope.groups[0]!
      const table = state.rope.tables[group.cacheIndex]!
      const planned = planMatches(matches, blockIds[0] ?? [], {
        chunkSizeTokens: chunk,
        blockSizeTokens: g.blockSizeTokens,
        numBlocks: g.numBlocks,
        maxPosition: table.maxPosition
      })
      if ("error" in planned) return yield* new InvalidArgument({ message: `${op}: ${planned.error}` })
      const plan = planned.matches
      if (plan.length === 0) return true
      const blockList = blockIds[0]!
      const tokenBytes = g.hiddenDim * g.elementBytes
      const objectBytes = 2 * g.numLayers * chunk * tokenBytes
      const handles = new Map<string, ReadHandle>()
      // The read locks are held by this scope (L1Handles, issue 25 item 2): released by whatever ends it.
      return yield* Effect.scoped(Effect.gen(function*() {
        // 1. The cached chunks: all of them, or nothing is written.
        for (const m of plan) {
          if (handles.has(m.hashHex)) continue
          const h = yield* lookup.acquireForRetrieve(key.request_id, {
            hash: m.hash,
            modelName: key.model_name,
            kvRank: rank,
            cacheSalt: key.cache_salt
          })
          if (h === undefined) {
            yield* Effect.logWarning(
              `${op}: chunk ${m.hashHex} (matches[${m.index}]) of request ${key.request_id} is not in L1; nothing written`
            )
            return false
          }
          handles.set(m.hashHex, h)
          if (h.bytes.length !== objectBytes) {
            return yield* new InvalidArgument({
              message: `${op}: cached chunk ${m.hashHex} (matches[${m.index}]) is ${h.bytes.length} bytes, but one chunk of the instance's KV layout is ${objectBytes}`
            })
          }
        }
        // 2. The cos/sin rows of every non-zero shift.
        const shifts = [...new Set(plan.filter((m) => m.delta !== 0).map((m) => Math.abs(m.delta)))]
        const read: Effect.Effect<ReadonlyMap<number, Float32Array>, InvalidArgument | NativeError> = shifts.length === 0
          ? Effect.succeed(new Map())
          : readRows(state, group.cacheIndex, shifts)
        const rows = yield* read.pipe(
          // The table's mapping closes when the state is unregistered, replaced or dropped on another lane meanwhile.
          Effect.catch((e) =>
            isSegmentFault(e) ? Effect.flatMap(released(op, id, entry, state, e), Effect.fail) : Effect.flatMap(states.get(id), (current): Effect.Effect<undefined, WireError> =>
              current === undefined
                ? Effect.fail(new NotRegistered({ op, instance_id: formatInstanceId(id), message: `${op}: the CB RoPE state of instance ${formatInstanceId(id)} was released during the retrieve` }))
                : current !== state
                ? Effect.as(Effect.logWarning(`${op}: the CB RoPE state was replaced during the retrieve; nothing written`), undefined)
                : Effect.fail(new InvalidArgument({ message: `${op}: reading cos_sin_caches[${group.cacheIndex}] failed: ${e.message}` })))
          )
        )
        if (rows === undefined) return false
        // 3. Rotate K into a staging buffer and plan the copies: segment → source buffer → ranges.
        const jobs = yield* planCopies({
          plan,
          objects: handles,
          rows,
          geometry: g,
          layers: entry.layers,
          spec: {
            dtype: compatible.dtype,
            numHeads: g.numHeads,
            headSize: g.headSize,
            rotaryOffset: group.rotaryOffset,
            rotaryDim: group.rotaryDim,
            isNeoxStyle: state.isNeoxStyle
          },
          chunkSizeTokens: chunk,
          blockList
        })
        // 4. Scatter into the worker's blocks.
        yield* Effect.forEach(jobs, (j) => native.scatter(entry.mappings.get(j.segment)!, j.ranges, j.src), {
          concurrency: "unbounded",
          discard: true
        }).pipe(
          Effect.catch((e) =>
            transfer.copyFailed(op, id, entry, e, Effect.fail(new InvalidArgument({ message: `${op}: ${e.message}` })), {
              missing: noKvContext(op, id),
              release: (fault) => released(op, id, entry, state, fault)
            })
          )
        )
        yield* Metric.update(cbMatchesTotal, plan.length)
        yield* Metric.update(cbTokensTotal, plan.reduce((n, m) => n + m.numTokens, 0))
        return true
      }))
    })

  const ropeInstances = () => [...states.ids()].sort((a, b) => (a < b ? -1 : a > b ? 1 : 0))
  const target = states.target

  const status = () => Effect.sync(() => ({ blend: { rope_instances: ropeInstances().map(formatInstanceId) } }))
  const module: ServerModule = {
    name: "blend",
    target,
    status,
    rows: [
      row(CbRegisterRope, "SYNC", ([id, caches, headSize, isNeoxStyle, groupToCache, groupRot], ctx) =>
        registerRope(id, caches, headSize, isNeoxStyle, groupToCache, groupRot, ctx.owner)),
      row(CbUnregisterRope, "SYNC", ([id]) => unregisterRope(id)),
      row(CbRetrievePreComputed, "AFFINITY", ([key, matches, blockIds, id, eventHandle]) =>
        retrievePreComputed(key, matches, blockIds, id).pipe(Effect.map((ok) => [eventHandle, ok] as const)))
    ]
  }

  return {
    registerRope,
    unregisterRope,
    retrievePreComputed,
    hasRope: states.isRegistered,
    ropeInstances,
    status,
    target,
    module
  }
})
