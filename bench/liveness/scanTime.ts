/**
 * bench:liveness part 1, reaper scan time with 1k, 10k and 100k tracked
 * contexts: runs bench/liveness/scan-child.ts (its own process, `--expose-gc`) and
 * reports `InstanceRegistry.popStale` popping nothing and popping 1 %, the
 * whole `Reaper.scan`, and the reference — one pass of the same `judge`
 * over the same records in a plain Map. Medians of interleaved timed runs,
 * ms. Target: popStale under 50 ms at 100k.
 */
import type { ScanRow } from "./scan-child.ts"
import { int, times } from "../lib/format.ts"
import { runJson } from "../lib/children.ts"
import type { Resources } from "../lib/resources.ts"
import { ms, type TargetRow } from "./report.ts"

const SCAN_SIZES = [1_000, 10_000, 100_000] as const
const TARGET_MS = 50

/** Runs the scan child over every size, `repeats` timed rounds each (after its untimed warm-up rounds). */
export const measureScans = async (resources: Resources, repeats: number): Promise<ReadonlyArray<ScanRow>> => {
  process.stderr.write(`[1/4] reaper scan time: ${SCAN_SIZES.join(", ")} contexts, median of ${repeats}\n`)
  const result = await runJson<{ scan: ReadonlyArray<ScanRow> }>("scan", [
    "--expose-gc",
    "bench/liveness/scan-child.ts",
    "--sizes",
    SCAN_SIZES.join(","),
    "--repeats",
    String(repeats)
  ], resources.children)
  return result.scan
}

/** The two popStale targets at 100k (none when that size did not run). */
export const scanTargets = (rows: ReadonlyArray<ScanRow>): ReadonlyArray<TargetRow> => {
  const big = rows.find((s) => s.n === 100_000)
  if (big === undefined) return []
  return [
    {
      check: "popStale over 100k, none stale (median)",
      measured: `${ms(big.registryFresh.median)} ms`,
      reference: `plain Map ${ms(big.plainFresh.median)} ms`,
      ratio: times(big.registryFresh.median / big.plainFresh.median),
      target: `< ${TARGET_MS} ms`,
      ok: big.registryFresh.median < TARGET_MS
    },
    {
      check: "popStale over 100k, 1 % stale (median)",
      measured: `${ms(big.registryStale.median)} ms`,
      reference: `plain Map ${ms(big.plainStale.median)} ms`,
      ratio: times(big.registryStale.median / big.plainStale.median),
      target: `< ${TARGET_MS} ms`,
      ok: big.registryStale.median < TARGET_MS
    }
  ]
}

const scanTable = (rows: ReadonlyArray<ScanRow>): string =>
  [
    "| tracked | popStale, none stale | plain Map | ratio | popStale, 1 % stale | plain Map | ratio | Reaper.scan, none stale | Reaper.scan, 1 % stale |",
    "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ...rows.map((s) =>
      `| ${int(s.n)} | ${ms(s.registryFresh.median)} | ${ms(s.plainFresh.median)} | ${times(s.registryFresh.median / s.plainFresh.median)} | ` +
      `${ms(s.registryStale.median)} | ${ms(s.plainStale.median)} | ${times(s.registryStale.median / s.plainStale.median)} | ` +
      `${ms(s.scanFresh.median)} | ${ms(s.scanStale.median)} |`
    )
  ].join("\n")

/** The part's subsection of the report, as lines (the last one empty). */
export const scanSection = (rows: ReadonlyArray<ScanRow>, repeats: number): ReadonlyArray<string> => [
  "### Reaper scan time (ms, median)",
  "",
  `In one process (\`bench/liveness/scan-child.ts\`), per size: an \`InstanceRegistry\` of N fresh contexts (random 63-bit ids,`,
  "each holding a small resource with its own Scope). *popStale* is `InstanceRegistry.popStale(rule)`, one transaction;",
  "*plain Map* (the reference) is one pass of the same `judge` over the same records in a `Map<bigint, Tracked>`, then",
  "the deletes. *Reaper.scan* is the reaper's whole scan over a LivenessTarget built around the registry the way",
  "LmcacheDrivenTransfer builds its own: pop, close each popped Scope, one JSON WARNING per reaped instance on stderr,",
  "prune the connection tracker, update gauges. *1 % stale*: 1 % of the entries re-aged past their window before",
  `each run (untimed), all popped by it. ${repeats} timed rounds after 3 untimed ones, the six measurements`,
  "interleaved within each round.",
  "",
  scanTable(rows),
  ""
]
