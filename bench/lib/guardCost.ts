/**
 * What the fault guard costs (issue 13 item 1, target under 5 %), measured
 * on the real copy code: the server's copy job of one chunk (the addon's
 * `copyBatch` over every layer's mapping, with the ranges the server's own
 * copy plan gives for that chunk, src/services/server/internal/CopyPlan.ts)
 * against the very same job through `copyBatchUnguarded`, which runs the same
 * loop outside the guard (`sigsetjmp` and the guard frame's TLS stores per
 * mapping are what it skips).
 *
 * In the calling process, on the libuv pool, one job at a time (one copy
 * thread, as one chunk is in the server). Each round times `jobsPerRound`
 * jobs of each variant back to back, the order alternating between rounds
 * so that neither always runs first on a warm cache; gather (mappings →
 * buffer) first, then scatter of the gathered bytes back into the same
 * blocks (the mappings' contents are left as they were). The figure is the
 * median over rounds of guarded time ÷ unguarded time (a shared machine's
 * noise hits both sides of a round alike), and GB/s of each variant over
 * all its rounds.
 */
import type { AddonMapping, NativeAddon } from "../../src/native/Native.ts"
import { median } from "./stats.ts"

/** One direction's result. */
export interface GuardCostDirection {
  /** GB/s (10^9 bytes) over all rounds, with the guard and without it. */
  readonly guardedGbps: number
  readonly unguardedGbps: number
  /** The median over rounds of guarded seconds ÷ unguarded seconds: 1.03 means the guard costs 3 %. */
  readonly timeRatio: number
}

export interface GuardCost {
  readonly gather: GuardCostDirection
  readonly scatter: GuardCostDirection
  readonly rounds: number
  readonly jobsPerRound: number
  /** Bytes one job moves (one chunk). */
  readonly jobBytes: number
  /** Mappings (layers' segments) and ranges per job. */
  readonly mappings: number
  readonly ranges: number
}

/** One chunk's copy job: the mappings and, for each, its (mappingOffset, bufferOffset, length) triples. */
export interface ChunkJob {
  readonly mappings: ReadonlyArray<AddonMapping>
  readonly ranges: ReadonlyArray<Float64Array>
  /** The L1 side: one object of the chunk's bytes. */
  readonly buffer: Uint8Array
}

const seconds = (t0: bigint) => Number(process.hrtime.bigint() - t0) / 1e9

/** Measures `job` guarded and unguarded, `rounds` × `jobsPerRound` jobs each, per direction (after one warm-up round). */
export const measureGuardCost = async (
  addon: NativeAddon,
  job: ChunkJob,
  rounds: number,
  jobsPerRound: number
): Promise<GuardCost> => {
  const run = async (direction: "gather" | "scatter", guarded: boolean): Promise<number> => {
    const copy = guarded ? addon.copyBatch : addon.copyBatchUnguarded
    const t0 = process.hrtime.bigint()
    for (let i = 0; i < jobsPerRound; i++) await copy(direction, job.mappings, job.ranges, job.buffer)
    return seconds(t0)
  }
  const direction = async (d: "gather" | "scatter"): Promise<GuardCostDirection> => {
    await run(d, true)
    await run(d, false)
    const ratios: Array<number> = []
    let guardedTotal = 0
    let unguardedTotal = 0
    for (let r = 0; r < rounds; r++) {
      const guardedFirst = r % 2 === 0
      const first = await run(d, guardedFirst)
      const second = await run(d, !guardedFirst)
      const [guarded, unguarded] = guardedFirst ? [first, second] : [second, first]
      guardedTotal += guarded
      unguardedTotal += unguarded
      ratios.push(guarded / unguarded)
    }
    const bytes = rounds * jobsPerRound * job.buffer.byteLength
    return { guardedGbps: bytes / guardedTotal / 1e9, unguardedGbps: bytes / unguardedTotal / 1e9, timeRatio: median(ratios) }
  }
  const gather = await direction("gather")
  const scatter = await direction("scatter")
  return {
    gather,
    scatter,
    rounds,
    jobsPerRound,
    jobBytes: job.buffer.byteLength,
    mappings: job.mappings.length,
    ranges: job.ranges.reduce((n, r) => n + r.length / 3, 0)
  }
}
