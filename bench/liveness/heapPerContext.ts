/**
 * bench:liveness part 3, heap per tracked context: bench/liveness/heap-child.ts
 * under `--expose-gc`, one process per case, reports heapUsed growth / N in
 * bytes for N registry entries, beside the same records in a plain Map, and
 * for entries carrying a ContextEntry-shaped resource without mappings.
 * Target: ≤ 2 KB per registry entry (the worse of fresh and pinged).
 */
import { runJson } from "../lib/children.ts"
import { int, times } from "../lib/format.ts"
import type { Resources } from "../lib/resources.ts"
import type { TargetRow } from "./report.ts"

const HEAP_N = 100_000
/** The 32-layer ContextEntry case is ~14 KB a context: measured over fewer entries. */
const HEAP_N_LARGE = 10_000
const TARGET_BYTES = 2048

/** One case: its name (a `--case` of bench/liveness/heap-child.ts), N, and bytes of heap per entry. */
export interface HeapRow {
  readonly name: string
  readonly n: number
  readonly bytesPerEntry: number
}

const HEAP_CASES: ReadonlyArray<readonly [string, number]> = [
  ["registry", HEAP_N],
  ["registry, pinged", HEAP_N],
  ["plain Map", HEAP_N],
  ["registry + ContextEntry (2 layers)", HEAP_N],
  ["registry + ContextEntry (32 layers)", HEAP_N_LARGE]
]

/** Runs every case, one after the other, each in a fresh process. */
export const measureHeap = async (resources: Resources): Promise<ReadonlyArray<HeapRow>> => {
  process.stderr.write(`[3/4] heap per tracked context: ${HEAP_CASES.length} cases, one process each\n`)
  const rows: Array<HeapRow> = []
  for (const [name, n] of HEAP_CASES) {
    const { heap } = await runJson<{ heap: HeapRow }>(`heap ${name}`, [
      "--expose-gc",
      "bench/liveness/heap-child.ts",
      "--n",
      String(n),
      "--case",
      name
    ], resources.children)
    rows.push(heap)
  }
  return rows
}

/** The target: the worse of a fresh and a pinged registry entry, against a plain Map's. */
export const heapTargets = (rows: ReadonlyArray<HeapRow>): ReadonlyArray<TargetRow> => {
  const registryHeap = rows.find((h) => h.name === "registry")!
  const pingedHeap = rows.find((h) => h.name === "registry, pinged")!
  const plainHeap = rows.find((h) => h.name === "plain Map")!
  const worstHeap = Math.max(registryHeap.bytesPerEntry, pingedHeap.bytesPerEntry)
  return [{
    check: "heap per registry entry (worst of fresh / pinged)",
    measured: `${int(worstHeap)} B`,
    reference: `plain Map ${int(plainHeap.bytesPerEntry)} B`,
    ratio: times(worstHeap / plainHeap.bytesPerEntry),
    target: `≤ ${TARGET_BYTES} B`,
    ok: worstHeap <= TARGET_BYTES
  }]
}

const heapTable = (rows: ReadonlyArray<HeapRow>): string => {
  const plain = rows.find((h) => h.name === "plain Map")!.bytesPerEntry
  return [
    "| what is tracked | entries | heap per entry | vs plain Map |",
    "|---|---:|---:|---:|",
    ...rows.map((h) => `| ${h.name} | ${int(h.n)} | ${int(h.bytesPerEntry)} B | ${times(h.bytesPerEntry / plain)} |`)
  ].join("\n")
}

/** The part's subsection of the report, as lines (the last one empty). */
export const heapSection = (rows: ReadonlyArray<HeapRow>): ReadonlyArray<string> => [
  "### Heap per tracked context",
  "",
  "`bench/liveness/heap-child.ts` under `--expose-gc`, one process per case: (heapUsed after − before) / N, full",
  "collections before and after, ids created inside the span. *registry*: InstanceRegistry entries all holding one",
  "shared resource (the registry's own cost); *pinged*: after one PING each (touch replaces the record);",
  "*plain Map*: the same records in a `Map<bigint, Tracked>` (reference); *ContextEntry*: the entry plus a resource",
  "shaped like LmcacheDrivenTransfer's ContextEntry without mappings (decoded descriptors of the worker-daemon geometry,",
  "validated geometry and placements, an empty mappings Map, a Scope forked from a module scope with one finalizer).",
  "",
  heapTable(rows),
  ""
]
