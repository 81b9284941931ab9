/**
 * Reads V8 profiles as Node writes them (`--cpu-prof` → `.cpuprofile`,
 * `--heap-prof` / `HeapProfiler.getSamplingProfile` → `.heapprofile`) and
 * returns their top entries: self time per function (ms and share of the
 * non-idle samples) and bytes allocated per call site (V8's sampled sizes,
 * which it scales to the expected total), and the longest stretches the JS
 * thread was busy without a break. For bench/ping/profile.ts and by hand:
 * `node bench/ping/profileTop.ts FILE [N]`.
 */
import { readFileSync } from "node:fs"
import path from "node:path"

interface CallFrame {
  readonly functionName: string
  readonly url: string
  readonly lineNumber: number
}

interface CpuNode {
  readonly id: number
  readonly callFrame: CallFrame
  readonly children?: ReadonlyArray<number>
}

interface CpuProfile {
  readonly nodes: ReadonlyArray<CpuNode>
  readonly startTime: number
  readonly endTime: number
  readonly samples: ReadonlyArray<number>
  readonly timeDeltas: ReadonlyArray<number>
}

interface HeapNode {
  readonly callFrame: CallFrame
  readonly selfSize: number
  readonly children: ReadonlyArray<HeapNode>
}

/** A sampled heap profile (the inspector's `SamplingHeapProfile`). */
export interface HeapProfile {
  readonly head: HeapNode
}

/** One row of a top list. */
export interface TopEntry {
  /** `function (file:line)`, the file relative to the repository or node_modules. */
  readonly site: string
  /** ms of self time (CPU) or bytes (heap). */
  readonly amount: number
  /** Share of the total (CPU: of the non-idle time). */
  readonly share: number
}

const shortUrl = (url: string): string => {
  const file = url.replace(/^file:\/\//, "")
  const nm = file.lastIndexOf("node_modules/")
  if (nm >= 0) return file.slice(nm + "node_modules/".length)
  return file === "" ? "" : path.relative(process.cwd(), file)
}

const site = (f: CallFrame): string => {
  const where = shortUrl(f.url)
  return `${f.functionName === "" ? "(anonymous)" : f.functionName}${where === "" ? "" : ` (${where}:${f.lineNumber + 1})`}`
}

const top = (by: Map<string, number>, total: number, n: number): Array<TopEntry> =>
  [...by.entries()].sort((a, b) => b[1] - a[1]).slice(0, n).map(([s, amount]) => ({ site: s, amount, share: amount / total }))

/** A span of the monotonic clock, µs (`process.hrtime.bigint() / 1000n`: V8's profiles use the same clock on Linux). */
export interface WindowUs {
  readonly fromUs: number
  readonly toUs: number
}

/**
 * Self time per function of a `.cpuprofile`, top `n`; `busyMs`: the non-idle time, `totalMs`: the span
 * looked at — the whole profile, or only its samples inside `window` (the load, not the start-up).
 */
export const cpuTop = (
  profile: CpuProfile,
  n: number,
  window?: WindowUs
): { readonly busyMs: number; readonly totalMs: number; readonly top: Array<TopEntry> } => {
  const byId = new Map(profile.nodes.map((node) => [node.id, node]))
  const selfUs = new Map<string, number>()
  let busyUs = 0
  let at = profile.startTime
  for (let i = 0; i < profile.samples.length; i++) {
    const node = byId.get(profile.samples[i]!)!
    const dt = profile.timeDeltas[i] ?? 0
    at += dt
    if (window !== undefined && (at < window.fromUs || at > window.toUs)) continue
    if (node.callFrame.functionName === "(idle)") continue
    busyUs += dt
    const key = site(node.callFrame)
    selfUs.set(key, (selfUs.get(key) ?? 0) + dt)
  }
  const ms = new Map([...selfUs].map(([k, us]) => [k, us / 1000]))
  const spanUs = window === undefined ? profile.endTime - profile.startTime : window.toUs - window.fromUs
  return { busyMs: busyUs / 1000, totalMs: spanUs / 1000, top: top(ms, busyUs / 1000, n) }
}

/** One stretch of consecutive non-idle samples: when (ms after the profile's start), how long, and its top self time. */
export interface BusyStretch {
  readonly atMs: number
  readonly ms: number
  readonly top: Array<TopEntry>
}

/**
 * The `n` longest stretches of consecutive non-idle samples of a `.cpuprofile` (what blocked the JS thread
 * longest: a PING arriving then waits for the whole stretch), each with its top 4 self-time functions.
 */
export const busyStretches = (profile: CpuProfile, n: number): Array<BusyStretch> => {
  const byId = new Map(profile.nodes.map((node) => [node.id, node]))
  const stretches: Array<{ atUs: number; us: number; self: Map<string, number> }> = []
  let current: { atUs: number; us: number; self: Map<string, number> } | undefined
  let at = 0
  for (let i = 0; i < profile.samples.length; i++) {
    const node = byId.get(profile.samples[i]!)!
    const dt = profile.timeDeltas[i] ?? 0
    at += dt
    if (node.callFrame.functionName === "(idle)") {
      if (current !== undefined) stretches.push(current)
      current = undefined
      continue
    }
    current ??= { atUs: at, us: 0, self: new Map() }
    current.us += dt
    const key = site(node.callFrame)
    current.self.set(key, (current.self.get(key) ?? 0) + dt / 1000)
  }
  if (current !== undefined) stretches.push(current)
  return stretches.sort((a, b) => b.us - a.us).slice(0, n).map((s) => ({
    atMs: s.atUs / 1000,
    ms: s.us / 1000,
    top: top(s.self, s.us / 1000, 4)
  }))
}

/** Bytes per allocation site of a sampled heap profile, top `n`, and their total. */
export const heapTop = (profile: HeapProfile, n: number): { readonly totalBytes: number; readonly top: Array<TopEntry> } => {
  const bytes = new Map<string, number>()
  let total = 0
  const walk = (node: HeapNode): void => {
    if (node.selfSize > 0) {
      const key = site(node.callFrame)
      bytes.set(key, (bytes.get(key) ?? 0) + node.selfSize)
      total += node.selfSize
    }
    for (const child of node.children) walk(child)
  }
  walk(profile.head)
  return { totalBytes: total, top: top(bytes, total, n) }
}

/** The top list as text lines, `amount` formatted by `unit`. */
export const formatTop = (entries: ReadonlyArray<TopEntry>, unit: (amount: number) => string): string =>
  entries.map((e) => `${(e.share * 100).toFixed(1).padStart(5)} %  ${unit(e.amount).padStart(10)}  ${e.site}`).join("\n")

if (process.argv[1] === import.meta.filename) {
  const file = process.argv[2]
  if (file === undefined) {
    process.stderr.write("usage: node bench/ping/profileTop.ts FILE.cpuprofile|FILE.heapprofile [N]\n")
    process.exit(2)
  }
  const n = Number(process.argv[3] ?? 25)
  const json: unknown = JSON.parse(readFileSync(file, "utf8"))
  if (file.endsWith(".cpuprofile")) {
    const r = cpuTop(json as CpuProfile, n)
    process.stdout.write(`busy ${r.busyMs.toFixed(0)} ms of ${r.totalMs.toFixed(0)} ms\n${formatTop(r.top, (ms) => `${ms.toFixed(1)} ms`)}\n`)
    process.stdout.write("\nlongest busy stretches:\n")
    for (const b of busyStretches(json as CpuProfile, 8)) {
      process.stdout.write(`  at ${b.atMs.toFixed(0)} ms, ${b.ms.toFixed(1)} ms: ${b.top.map((t) => `${t.site} ${t.amount.toFixed(1)}`).join("; ")}\n`)
    }
  } else {
    const r = heapTop(json as HeapProfile, n)
    process.stdout.write(`sampled ${(r.totalBytes / 1e6).toFixed(1)} MB\n${formatTop(r.top, (b) => `${(b / 1024).toFixed(0)} KB`)}\n`)
  }
}
