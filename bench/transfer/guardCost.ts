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
 * thread, as one chunk is in the server). Each round times one job of each
 * variant, back to back, the order alternating between rounds so that
 * neither always runs first on a warm cache; gather (mappings → buffer)
 * first, then scatter of the gathered bytes back into the same blocks (the
 * mappings' contents are left as they were). The figure is the median over
 * rounds of guarded time ÷ unguarded time (a shared machine's noise hits
 * both jobs of a round alike), and GB/s of each variant's median job.
 */
import type { AddonMapping, NativeAddon } from "../../src/native/Native.ts"
import { median } from "../lib/stats.ts"

/** One direction's result. */
export interface GuardCostDirection {
  /** GB/s (10^9 bytes) of the median job, with the guard and without it. */
  readonly guardedGbps: number
  readonly unguardedGbps: number
  /** The median over rounds of guarded seconds ÷ unguarded seconds: 1.03 means the guard costs 3 %. */
  readonly timeRatio: number
}

export interface GuardCost {
  readonly gather: GuardCostDirection
  readonly scatter: GuardCostDirection
  readonly rounds: number
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

/**
 * Measures `job` guarded and unguarded, per direction: after one warm-up job of each, `rounds` rounds of
 * one job of each, the order alternating. Medians, not totals: on a shared machine a job that lost its
 * CPU to another process says nothing about the guard.
 */
export const measureGuardCost = async (addon: NativeAddon, job: ChunkJob, rounds: number): Promise<GuardCost> => {
  const once = async (direction: "gather" | "scatter", guarded: boolean): Promise<number> => {
    const t0 = process.hrtime.bigint()
    await (guarded ? addon.copyBatch : addon.copyBatchUnguarded)(direction, job.mappings, job.ranges, job.buffer)
    return seconds(t0)
  }
  const direction = async (d: "gather" | "scatter"): Promise<GuardCostDirection> => {
    await once(d, true)
    await once(d, false)
    const guarded: Array<number> = []
    const unguarded: Array<number> = []
    const ratios: Array<number> = []
    for (let r = 0; r < rounds; r++) {
      const guardedFirst = r % 2 === 0
      const first = await once(d, guardedFirst)
      const second = await once(d, !guardedFirst)
      const [g, u] = guardedFirst ? [first, second] : [second, first]
      guarded.push(g)
      unguarded.push(u)
      ratios.push(g / u)
    }
    const bytes = job.buffer.byteLength
    return { guardedGbps: bytes / median(guarded) / 1e9, unguardedGbps: bytes / median(unguarded) / 1e9, timeRatio: median(ratios) }
  }
  const gather = await direction("gather")
  const scatter = await direction("scatter")
  return {
    gather,
    scatter,
    rounds,
    jobBytes: job.buffer.byteLength,
    mappings: job.mappings.length,
    ranges: job.ranges.reduce((n, r) => n + r.length / 3, 0)
  }
}
