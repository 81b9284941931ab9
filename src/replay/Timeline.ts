/**
 * What happened during a replay, over time (issue 17: the data of
 * `mpcache replay --report`): the driver records each completed request
 * (its latency, chunks looked up and hit, bytes moved), how many workers
 * were alive, and every kill, pause, resume, replacement and reap; `build`
 * turns that into per-second series and a list of events for ReportHtml.ts.
 *
 * Times are seconds since the replay's first request was sent (Clock
 * millis on both sides; the server's reaps use its own `reaped_at_ms`, the
 * same machine clock for a server the replay started).
 */
import { Samples } from "./Stats.ts"

/** One second of the run: `[t, t + 1)` seconds after the start. */
export interface TimelineSecond {
  /** Start of the second, seconds since the start. */
  readonly t: number
  /** Requests that completed in it. */
  readonly requests: number
  /** Median and 99th percentile (nearest rank) of their end-to-end latency, ms; null when none completed. */
  readonly latency_p50_ms: number | null
  readonly latency_p99_ms: number | null
  /** Hit chunks / looked-up chunks of every request completed by the end of it; null before the first. */
  readonly hit_ratio: number | null
  /**
   * The same for a perfect LRU of the L1's capacity (LruSim.ts) after as many
   * requests, in trace order; null before the first.
   */
  readonly perfect_lru_hit_ratio: number | null
  /** Bytes copied into L1 (STORE) and out of it (RETRIEVE) by the requests completed in it. */
  readonly bytes_stored: number
  readonly bytes_retrieved: number
}

/** A worker count sample: `alive` worker processes at `t` seconds (a paused worker is alive). */
export interface AliveSample {
  readonly t: number
  readonly alive: number
}

/** Something that happened to a worker; `reap` comes from the server's `recent_reaps`. */
export interface TimelineEvent {
  readonly t: number
  readonly kind: "kill" | "pause" | "resume" | "replace" | "reap"
  /** The replay's worker number (kill, pause, resume, replace). */
  readonly slot?: number
  /** The instance id, decimal (all kinds where known). */
  readonly instance_id?: string
  /** Why the server reaped it (reap only). */
  readonly reason?: string
}

/** The report's data (also embedded in the report as JSON). */
export interface ReplayTimeline {
  /** Clock millis of the start. */
  readonly started_at_ms: number
  /** Seconds the timeline covers: the run, then the wait for the last reaps. */
  readonly duration_seconds: number
  readonly seconds: ReadonlyArray<TimelineSecond>
  readonly workers_alive: ReadonlyArray<AliveSample>
  readonly events: ReadonlyArray<TimelineEvent>
}

interface Completion {
  readonly atMs: number
  readonly latencyMs: number | undefined
  readonly lookedUpChunks: number
  readonly hitChunks: number
  readonly bytesStored: number
  readonly bytesRetrieved: number
}

/** The driver's recorder; not concurrent-safe beyond one JS thread (the driver's fibers share one). */
export class TimelineRecorder {
  private readonly completions: Array<Completion> = []
  private readonly alive: Array<AliveSample> = []
  private readonly events: Array<TimelineEvent> = []
  private readonly reapKeys = new Set<string>()
  readonly startedAtMs: number
  /** `startedAtMs`: Clock millis of the replay's start (t = 0). */
  constructor(startedAtMs: number) {
    this.startedAtMs = startedAtMs
  }

  private secondsAt(atMs: number): number {
    return Math.max(0, (atMs - this.startedAtMs) / 1000)
  }

  /** A request completed at `atMs`; `latencyMs` undefined when it failed (counted for chunks only). */
  complete(c: Completion): void {
    this.completions.push(c)
  }

  /** `alive` workers at `atMs`; a sample equal to the previous one is dropped. */
  sampleAlive(atMs: number, alive: number): void {
    const last = this.alive[this.alive.length - 1]
    if (last !== undefined && last.alive === alive) return
    this.alive.push({ t: this.secondsAt(atMs), alive })
  }

  event(atMs: number, e: Omit<TimelineEvent, "t">): void {
    this.events.push({ t: this.secondsAt(atMs), ...e })
  }

  /** A reap from `recent_reaps`; one already recorded (same id and time) or from before the start is ignored. */
  reap(r: { readonly instance_id: string; readonly reason: string; readonly reaped_at_ms: number }): void {
    const key = `${r.instance_id}@${r.reaped_at_ms}`
    if (r.reaped_at_ms < this.startedAtMs || this.reapKeys.has(key)) return
    this.reapKeys.add(key)
    this.events.push({ t: this.secondsAt(r.reaped_at_ms), kind: "reap", instance_id: r.instance_id, reason: r.reason })
  }

  /**
   * The timeline up to `endMs`. `lruCumulative[i]` is the perfect LRU's
   * cumulative [looked up, hit] chunks after request i in trace order.
   */
  build(endMs: number, lruCumulative: ReadonlyArray<readonly [number, number]>): ReplayTimeline {
    const lastEvent = Math.max(0, ...this.events.map((e) => e.t))
    const duration = Math.max(this.secondsAt(endMs), lastEvent)
    const n = Math.max(1, Math.ceil(duration))
    const done = [...this.completions].sort((a, b) => a.atMs - b.atMs)
    const seconds: Array<TimelineSecond> = []
    let i = 0
    let completed = 0
    let lookedUp = 0
    let hit = 0
    for (let t = 0; t < n; t++) {
      const latency = new Samples()
      let requests = 0
      let stored = 0
      let retrieved = 0
      while (i < done.length && this.secondsAt(done[i]!.atMs) < t + 1) {
        const c = done[i++]!
        requests++
        completed++
        lookedUp += c.lookedUpChunks
        hit += c.hitChunks
        stored += c.bytesStored
        retrieved += c.bytesRetrieved
        if (c.latencyMs !== undefined) latency.add(c.latencyMs)
      }
      const lru = completed === 0 ? undefined : lruCumulative[Math.min(completed, lruCumulative.length) - 1]
      seconds.push({
        t,
        requests,
        latency_p50_ms: latency.count === 0 ? null : round(latency.quantile(0.5)),
        latency_p99_ms: latency.count === 0 ? null : round(latency.quantile(0.99)),
        hit_ratio: completed === 0 ? null : round(lookedUp === 0 ? 0 : hit / lookedUp, 4),
        perfect_lru_hit_ratio: lru === undefined ? null : round(lru[0] === 0 ? 0 : lru[1] / lru[0], 4),
        bytes_stored: stored,
        bytes_retrieved: retrieved
      })
    }
    const last = this.alive[this.alive.length - 1]
    const alive = last === undefined ? [] : [...this.alive, { t: duration, alive: last.alive }]
    return {
      started_at_ms: this.startedAtMs,
      duration_seconds: round(duration, 3),
      seconds,
      workers_alive: alive.map((s) => ({ t: round(s.t, 3), alive: s.alive })),
      events: [...this.events].sort((a, b) => a.t - b.t).map((e) => ({ ...e, t: round(e.t, 3) }))
    }
  }
}

const round = (x: number, digits = 3) => Math.round(x * 10 ** digits) / 10 ** digits
