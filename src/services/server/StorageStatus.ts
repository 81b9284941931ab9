/**
 * The storage block of `/api/status` (DESIGN §5 status): what the native
 * memory backend and L1 report, as a module record without ops.
 *
 * - `native`: mappings of workers' memory (the server's own L1 pool is
 *   reported under `l1`, so it is taken out of the addon's totals);
 * - `fault_guard`: copies of worker memory a guarded SIGBUS/SIGSEGV ended
 *   (issue 13 item 1) and CUDA opens and copies that failed (item 4);
 * - `l1`: the pool, its sizes and the L1Store's counters.
 *
 * Split out of L1Store.ts (issue 25 item 5): the store holds objects, this
 * module only reads the counters of both.
 */
import { Effect } from "effect"
import { NativeMemory } from "../../native/Native.ts"
import type { ServerModule } from "./Handler.ts"
import { L1Store } from "./L1Store.ts"

/**
 * L1 and the native memory backend as the module record "storage": no ops, a
 * status of the `native`, `fault_guard` and `l1` blocks. Errors: none (it
 * reads counters). Needs L1Store and NativeMemory.
 */
export const storageModule: Effect.Effect<ServerModule, never, L1Store | NativeMemory> = Effect.gen(function*() {
  const native = yield* NativeMemory
  const l1 = yield* L1Store
  return {
    name: "storage",
    rows: [],
    status: () =>
      Effect.sync(() => {
        const n = native.stats()
        const s = l1.stats()
        return {
          native: {
            open_mappings: n.openMappings - (l1.pool === undefined ? 0 : 1),
            mapped_bytes: n.mappedBytes - (l1.pool?.sizeBytes ?? 0)
          },
          // Copies of worker memory a guarded SIGBUS/SIGSEGV ended (issue 13 item 1), and CUDA opens and copies that
          // failed (item 4): the sums of mpcache_guarded_faults_total by kind.
          fault_guard: { guarded_faults: native.guardedFaults(), cuda_faults: native.cudaFaults() },
          l1: {
            pool: l1.pool?.shmName ?? null,
            capacity_bytes: s.capacityBytes,
            prefaulted_bytes: l1.pool?.prefaultedBytes() ?? 0,
            used_bytes: s.usedBytes,
            objects: s.objects,
            reserved_objects: s.reservedObjects,
            locked_objects: s.lockedObjects,
            evictions: s.evictions,
            ...(s.groups === undefined ? {} : {
              tenants: s.groups.map((g) => ({
                salt_group: g.group,
                bytes: g.bytes,
                weight: g.weight,
                share_bytes: Math.round(g.shareBytes),
                evictions: g.evictions
              }))
            })
          }
        }
      })
  }
})
