/**
 * Child program of bench:liveness (part 1, reaper scan time):
 *
 *   node bench/liveness/scan-child.ts --sizes 1000,10000,100000 --repeats 7
 *
 * For each size N: an InstanceRegistry with N fresh tracked contexts (a
 * small dummy resource owning its own Scope), then, each the median of
 * `--repeats` timed runs after one untimed warm-up run:
 *
 * - `registry.popStale(rule)` popping nothing (every entry fresh), and
 *   popping 1 % (re-aged before each run, outside the timing);
 *
 *   Re-aging is what production can reach by waiting: the entry is popped
 *   (as UNREGISTER does) and inserted again with a last-seen 2 h before now,
 *   i.e. registered 2 h ago and silent since. It never lowers the last-seen
 *   of an entry the registry holds, which production never does and which
 *   the registry's stale index (src/services/liveness/internal/StaleIndex.ts) relies on: a
 *   scan looks only at entries whose index key is due, and an insert keys
 *   the entry by the time it is given. So the fresh runs measure a scan
 *   with nothing due (the index makes it O(1)), the stale runs one with the
 *   1 % due. The plain Map reference lowers its records' last-seen in place:
 *   it has no index, and judges every record either way;
 * - the reference: the same records in a plain `Map<bigint, Tracked>`,
 *   judged with the same `judge` and deleted from the Map — the floor for
 *   one pass over N entries in this process;
 * - the whole reaper scan `Reaper.scan(judgeAtMs)` over a LivenessTarget
 *   around the registry (pop, close each popped Scope, one WARNING per
 *   reaped instance through the server's JSON logger on stderr, prune the
 *   connection tracker, update the gauges and the scan histogram).
 *
 * Prints one JSON line on stdout: `{"scan":[{n, …}]}`, times in ms.
 */
import { parseArgs } from "node:util"
import { Context, Effect, Exit, Layer, Scope } from "effect"
import { loggerLayer } from "../../src/layers/Logging.ts"
import type { InstanceId } from "../../src/schema/InstanceId.ts"
import { judge, type Reaped, type StaleRule, type Tracked } from "../../src/services/liveness/InstanceRegistry.ts"
import { Reaper } from "../../src/services/liveness/Reaper.ts"
import { fillRegistry, managementLayer, registryTarget, ruleAt, STALE_AGE_MS, timed, type DummyContext } from "./fixture.ts"
import { median } from "../lib/stats.ts"

const { values: args } = parseArgs({
  options: { sizes: { type: "string", default: "1000,10000,100000" }, repeats: { type: "string", default: "7" } }
})
const sizes = args.sizes.split(",").map(Number)
const repeats = Number(args.repeats)

export interface Timing {
  readonly median: number
  readonly min: number
  readonly max: number
}
export interface ScanRow {
  readonly n: number
  readonly stale: number
  readonly registryFresh: Timing
  readonly registryStale: Timing
  readonly plainFresh: Timing
  readonly plainStale: Timing
  readonly scanFresh: Timing
  readonly scanStale: Timing
}

const summary = (xs: ReadonlyArray<number>): Timing => ({ median: median(xs), min: Math.min(...xs), max: Math.max(...xs) })

/** The reference: one pass over a plain Map with the same judge, then the deletes. */
const plainPopStale = (map: Map<bigint, Tracked<DummyContext>>, rule: StaleRule): Array<Reaped<DummyContext>> => {
  const stale: Array<Reaped<DummyContext>> = []
  for (const t of map.values()) {
    const verdict = judge(t, rule)
    if (verdict !== undefined) stale.push(verdict)
  }
  for (const r of stale) map.delete(r.tracked.id)
  return stale
}

const WARMUP_ROUNDS = 3

const gc = (): void => (globalThis as { gc?: () => void }).gc?.()

const measureSize = (n: number) =>
  Effect.gen(function*() {
    const { registry, moduleScope, ids, reinsert } = yield* fillRegistry(n)
    const staleIds: ReadonlyArray<InstanceId> = ids.slice(0, Math.max(1, Math.round(n / 100)))
    const expect = (what: string, got: number, want: number) =>
      got === want ? Effect.void : Effect.die(new Error(`${what} at N=${n}: popped ${got}, expected ${want}`))

    /** Re-ages the 1 % in the registry (pop if held, close its Scope, insert again long silent). Untimed. */
    const age = Effect.gen(function*() {
      const now = Date.now()
      for (const id of staleIds) {
        const held = yield* registry.pop(id)
        if (held !== undefined) yield* Scope.close(held.resource.scope, Exit.void)
        yield* reinsert(id, now, STALE_AGE_MS)
      }
    })
    /** Puts the popped 1 % back, fresh, so that the next all-fresh run sees N entries. Untimed. */
    const refill = (popped: ReadonlyArray<Reaped<DummyContext>>) =>
      Effect.gen(function*() {
        for (const r of popped) {
          yield* Scope.close(r.tracked.resource.scope, Exit.void)
          yield* reinsert(r.tracked.id, Date.now(), 0)
        }
        yield* expect("refill", yield* registry.size(), n)
      })

    // The reference: the same records in a plain Map.
    const plain = new Map<bigint, Tracked<DummyContext>>()
    for (const t of yield* registry.snapshot()) plain.set(t.id, t)
    const staleRecords = staleIds.map((id) => plain.get(id)!)

    // The whole reaper scan, through the management module driving a target around the same registry.
    const layerScope = yield* Scope.make()
    const context = yield* Layer.build(managementLayer([registryTarget(registry)])).pipe(Scope.provide(layerScope))
    const reaper = Context.get(context, Reaper)

    const times = {
      registryFresh: [] as Array<number>,
      registryStale: [] as Array<number>,
      plainFresh: [] as Array<number>,
      plainStale: [] as Array<number>,
      scanFresh: [] as Array<number>,
      scanStale: [] as Array<number>
    }
    // Rounds interleave the six measurements, so a drift in machine load hits them alike;
    // the first WARMUP_ROUNDS rounds are not timed (JIT).
    for (let round = 0; round < WARMUP_ROUNDS + repeats; round++) {
      const keep = round >= WARMUP_ROUNDS
      const record = (into: Array<number>, ms: number) => void (keep && into.push(ms))

      const [a, registryFresh] = yield* timed(registry.popStale(ruleAt(Date.now())))
      yield* expect("popStale, all fresh", a.length, 0)
      record(times.registryFresh, registryFresh)

      let t0 = performance.now()
      const b = plainPopStale(plain, ruleAt(Date.now()))
      record(times.plainFresh, performance.now() - t0)
      yield* expect("plain Map, all fresh", b.length, 0)

      const [c, scanFresh] = yield* timed(reaper.scan(Date.now()))
      yield* expect("Reaper.scan, all fresh", c.length, 0)
      record(times.scanFresh, scanFresh)

      yield* age
      const [d, registryStale] = yield* timed(registry.popStale(ruleAt(Date.now())))
      yield* expect("popStale, 1 % stale", d.length, staleIds.length)
      record(times.registryStale, registryStale)
      yield* refill(d)

      const now = Date.now()
      for (const t of staleRecords) plain.set(t.id, { ...t, lastSeenMs: now - STALE_AGE_MS })
      t0 = performance.now()
      const e = plainPopStale(plain, ruleAt(now))
      record(times.plainStale, performance.now() - t0)
      yield* expect("plain Map, 1 % stale", e.length, staleIds.length)
      for (const t of staleRecords) plain.set(t.id, t)

      yield* age
      const [f, scanStale] = yield* timed(reaper.scan(Date.now()))
      yield* expect("Reaper.scan, 1 % stale", f.length, staleIds.length)
      record(times.scanStale, scanStale)
      for (const id of staleIds) yield* reinsert(id, Date.now(), 0)
    }
    plain.clear()
    yield* Scope.close(layerScope, Exit.void)
    yield* Scope.close(moduleScope, Exit.void)

    const row: ScanRow = {
      n,
      stale: staleIds.length,
      registryFresh: summary(times.registryFresh),
      registryStale: summary(times.registryStale),
      plainFresh: summary(times.plainFresh),
      plainStale: summary(times.plainStale),
      scanFresh: summary(times.scanFresh),
      scanStale: summary(times.scanStale)
    }
    process.stderr.write(
      `scan N=${n}: popStale ${row.registryFresh.median.toFixed(2)} ms (plain Map ${row.plainFresh.median.toFixed(2)} ms), ` +
        `Reaper.scan ${row.scanFresh.median.toFixed(2)} ms; 1 % stale: ${row.registryStale.median.toFixed(2)} / ` +
        `${row.plainStale.median.toFixed(2)} / ${row.scanStale.median.toFixed(2)} ms\n`
    )
    return row
  })

const program = Effect.gen(function*() {
  const rows: Array<ScanRow> = []
  for (const n of sizes) {
    rows.push(yield* measureSize(n))
    gc()
  }
  process.stdout.write(`${JSON.stringify({ scan: rows })}\n`)
})

await Effect.runPromise(program.pipe(Effect.provide(loggerLayer("json"))))
