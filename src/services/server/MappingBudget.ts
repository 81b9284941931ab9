/**
 * The server-wide budget of worker-memory mappings (issue 24 items 4 and 12;
 * the rules and defaults are MapLimits.ts'): every registration that maps
 * worker memory (REGISTER_KV_CACHE, CB_REGISTER_ROPE) asks it first, with or
 * without CURVE, and is answered `overloaded` naming the flag it would break,
 * before anything is mapped:
 *
 * - `--max-segments-per-register`: the distinct segments one registration
 *   names (threat: one REGISTER of 64,645 one-page segments exhausted
 *   `vm.max_map_count` and V8 died). Counted by a walk that stops past the
 *   limit, before the per-layer validation builds anything.
 * - `--max-mappings`: mappings of worker memory held at once, over every
 *   instance (threat: the same exhaustion by many REGISTERs, each under the
 *   per-registration bound).
 * - `--max-mapped-bytes`: bytes of worker host memory mapped at once (threat:
 *   sparse memfds, only `ftruncate`d, whose pages the server's copies would
 *   populate, charged to the server). Device memory (cuda_ipc) is not RAM
 *   and counts toward `--max-mappings` only.
 *
 * What is held is not a ledger kept beside the mappings: it is read from the
 * native layer's set of open mappings (`NativeMemory.usage`), which a
 * mapping leaves when its one release has unmapped it (UNREGISTER, a reap, a
 * fault release, shutdown), so the count cannot drift from what is mapped.
 * The check-then-map is atomic because both registrations run on the SYNC
 * lane (DESIGN §3.1: one at a time); a release meanwhile only lowers it.
 */
import { readFile } from "node:fs/promises"
import { Context, Effect, Layer, Metric } from "effect"
import { type MappingUsage, NativeMemory } from "../../native/Native.ts"
import { formatInstanceId, type InstanceId } from "../../schema/InstanceId.ts"
import type { TensorDescriptor } from "../../schema/TensorDescriptor.ts"
import { Overloaded } from "../../schema/WireError.ts"
import { type SegmentDemand, segmentDemand } from "../kv/KvCacheLayout.ts"
import type { ServerModule } from "./Handler.ts"
import { ServerConfig, type ServerConfigInput } from "./ServerConfig.ts"
import { byLabel } from "../metrics/Series.ts"

/** The flags a registration can be refused by, as `Overloaded.field`. */
export const MAPPING_FLAGS = ["max-segments-per-register", "max-mappings", "max-mapped-bytes"] as const
export type MappingFlag = typeof MAPPING_FLAGS[number]

const refusalsBy = byLabel(
  Metric.counter("mpcache_mapping_refusals_total", {
    description: "Registrations refused (overloaded) before mapping anything, by the flag they would exceed",
    incremental: true
  }),
  "flag",
  MAPPING_FLAGS
)

/**
 * Lines of /proc/self/maps (the memory maps the kernel's cap counts); null when unreadable. Read on the
 * libuv pool: with tens of thousands of maps the kernel takes milliseconds to write the text.
 */
const processMaps: Effect.Effect<number | null> = Effect.promise(() =>
  readFile("/proc/self/maps", "latin1").then(
    (text) => {
      let n = 0
      for (let i = text.indexOf("\n"); i >= 0; i = text.indexOf("\n", i + 1)) n++
      return n
    },
    () => null
  )
)

/**
 * The budget. `demandOf`, then `admit` right before mapping, both in the
 * registration's handler on the SYNC lane.
 *
 * @category services
 */
export class MappingBudget extends Context.Service<MappingBudget, {
  /**
   * The distinct segments and bytes that `descriptors` (payload field
   * `field`: "kv_caches", "cos_sin_caches") of registration `op` of `id`
   * would map. Fails with Overloaded (field "max-segments-per-register")
   * when they name more than the flag allows, having looked at no more than
   * that many + 1 segments.
   */
  readonly demandOf: (
    op: string,
    id: InstanceId,
    field: string,
    descriptors: ReadonlyArray<TensorDescriptor>
  ) => Effect.Effect<SegmentDemand, Overloaded>
  /**
   * Succeeds when mapping `demand` now keeps the server within
   * `--max-mappings` and `--max-mapped-bytes`; fails with Overloaded naming
   * the flag (what is held now, what was asked). Maps and reserves nothing.
   */
  readonly admit: (op: string, id: InstanceId, demand: SegmentDemand) => Effect.Effect<void, Overloaded>
  /** The `mapping_limits` block of `/api/status`: the bounds, the kernel's cap, what is held and what was refused. */
  readonly module: ServerModule
}>()("mpcache/services/server/MappingBudget") {
  /** Needs the configuration and the native layer. */
  static readonly layer = Layer.effect(this, Effect.suspend(() => make))
  /**
   * For tests: the real budget over `ServerConfig.layerTest(overrides)` and
   * a native layer that answers only its counters, from `usage` (what
   * `usage()` returns now: the test moves it as mappings come and go;
   * nothing mapped by default); the budget reads nothing else of it, and
   * any other call dies "unimplemented" (`Layer.mock`).
   */
  static readonly layerTest = (overrides: Partial<ServerConfigInput> = {}, usage: () => MappingUsage = () => noUsage) =>
    this.layer.pipe(Layer.provide(Layer.mergeAll(
      ServerConfig.layerTest(overrides),
      Layer.mock(NativeMemory, {
        usage,
        stats: () => ({ openMappings: usage().mappings, mappedBytes: usage().hostBytes + usage().deviceBytes }),
        guardedFaults: () => 0,
        cudaFaults: () => 0
      })
    )))
}

const noUsage: MappingUsage = { mappings: 0, hostBytes: 0, deviceBytes: 0 }

const make = Effect.gen(function*() {
  const { mapLimits: limits } = yield* ServerConfig
  const native = yield* NativeMemory
  const refused: Record<MappingFlag, number> = { "max-segments-per-register": 0, "max-mappings": 0, "max-mapped-bytes": 0 }

  const refuse = (flag: MappingFlag, fields: { op: string; instance_id: string; expected: string; actual: string; message: string }) =>
    Effect.gen(function*() {
      refused[flag]++
      yield* Metric.update(refusalsBy[flag], 1)
      const error = new Overloaded({ ...fields, field: flag })
      yield* Effect.logWarning(error.message)
      return yield* error
    })

  const demandOf = (op: string, id: InstanceId, field: string, descriptors: ReadonlyArray<TensorDescriptor>) =>
    Effect.suspend(() => {
      const limit = limits.maxSegmentsPerRegister
      const demand = segmentDemand(descriptors, limit)
      if (!demand.over) return Effect.succeed<SegmentDemand>(demand)
      const idText = formatInstanceId(id)
      return refuse("max-segments-per-register", {
        op,
        instance_id: idText,
        expected: `at most ${limit} distinct segments per registration`,
        actual: `more than ${limit} (${descriptors.length} descriptors)`,
        message: `${op}: instance ${idText}: ${field} names more than ${limit} distinct segments, over --max-segments-per-register (${limit}); nothing was mapped: let layers share segments (one segment with offsets, DESIGN §3.2) or raise the limit`
      })
    })

  const admit = (op: string, id: InstanceId, demand: SegmentDemand) =>
    Effect.suspend(() => {
      const held = native.usage()
      const idText = formatInstanceId(id)
      if (held.mappings + demand.segments > limits.maxMappings) {
        return refuse("max-mappings", {
          op,
          instance_id: idText,
          expected: `at most ${limits.maxMappings} mappings of worker memory`,
          actual: `${held.mappings} held + ${demand.segments} asked`,
          message: `${op}: instance ${idText}: mapping its ${demand.segments} segment(s) would make ${held.mappings + demand.segments} mappings of worker memory, over --max-mappings (${limits.maxMappings}; ${held.mappings} held now); nothing was mapped: retry once other instances unregister, or raise the limit`
        })
      }
      if (held.hostBytes + demand.hostBytes > limits.maxMappedBytes) {
        return refuse("max-mapped-bytes", {
          op,
          instance_id: idText,
          expected: `at most ${limits.maxMappedBytes} bytes of worker host memory mapped`,
          actual: `${held.hostBytes} held + ${demand.hostBytes} asked`,
          message: `${op}: instance ${idText}: its host memory is ${demand.hostBytes} bytes; with the ${held.hostBytes} bytes of worker memory mapped now that is over --max-mapped-bytes (${limits.maxMappedBytes}); nothing was mapped: retry once other instances unregister, or raise the limit`
        })
      }
      return Effect.void
    })

  const module: ServerModule = {
    name: "mapping_budget",
    rows: [],
    status: () =>
      Effect.map(processMaps, (maps) => {
        const held = native.usage()
        return {
          mapping_limits: {
            kernel_max_map_count: limits.kernelMaxMapCount.value,
            kernel_max_map_count_source: limits.kernelMaxMapCount.source,
            process_maps: maps,
            max_mappings: limits.maxMappings,
            mappings: held.mappings,
            max_segments_per_register: limits.maxSegmentsPerRegister,
            max_mapped_bytes: limits.maxMappedBytes,
            host_mapped_bytes: held.hostBytes,
            device_mapped_bytes: held.deviceBytes,
            refused: {
              max_segments_per_register: refused["max-segments-per-register"],
              max_mappings: refused["max-mappings"],
              max_mapped_bytes: refused["max-mapped-bytes"]
            }
          }
        }
      })
  }

  return { demandOf, admit, module }
})
