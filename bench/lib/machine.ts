/**
 * The machine a bench ran on, as its report line gives it (date, Node, CPU,
 * load), and the Linux /proc readings bench:transfer puts beside each window
 * (CPU seconds per thread, the whole machine's busy time, memory), so that a
 * slow figure can be told from a busy box.
 */
import { existsSync, readdirSync, readFileSync, statfsSync } from "node:fs"
import os from "node:os"

/** Today's date, `YYYY-MM-DD` (UTC), as the sections' "Measured …" lines start. */
export const measuredDate = (): string => new Date().toISOString().slice(0, 10)

/** `Node vX · <CPU model> (N cores)`: the middle of every bench section's "Measured …" line. */
export const nodeAndCpu = (): string => {
  const cpus = os.cpus()
  return `Node ${process.version} · ${cpus[0]?.model.trim() ?? "unknown CPU"} (${cpus.length} cores)`
}

/** A load average triple (`os.loadavg()`) as `1.50 / 2.02 / 2.14`. */
export const loadText = (load: ReadonlyArray<number>): string => load.map((x) => x.toFixed(2)).join(" / ")

/**
 * The suite's one line on the machine: time (UTC, minutes), the `command`
 * run, its length, CPU model × cores (and whether virtual), memory, kernel,
 * Node, and the load average before and after.
 */
export const machineLine = (
  command: string,
  loadBefore: ReadonlyArray<number>,
  loadAfter: ReadonlyArray<number>,
  seconds: number
): string => {
  const cpus = os.cpus()
  const cpuinfo = existsSync("/proc/cpuinfo") ? readFileSync("/proc/cpuinfo", "utf8") : ""
  const virtual = /^flags\s*:.*\bhypervisor\b/m.test(cpuinfo) ? ", virtual machine" : ""
  return `Measured ${new Date().toISOString().slice(0, 16).replace("T", " ")} UTC · \`${command}\` · ` +
    `${Math.round(seconds)} s · ${cpus[0]?.model.trim() ?? "unknown CPU"} × ${cpus.length} cores${virtual} · ` +
    `${(os.totalmem() / 2 ** 30).toFixed(0)} GiB · Linux ${os.release()} · Node ${process.version} · ` +
    `load average (1/5/15 min) ${loadText(loadBefore)} before, ${loadText(loadAfter)} after.`
}

/** Linux USER_HZ, the unit of /proc CPU times. */
const CLK_TCK = 100

/** CPU seconds of a process so far, main thread apart, and the main thread's run-queue wait. */
export interface ThreadCpu {
  /** The main (JS) thread: user + system seconds. */
  readonly js: number
  /** Every other thread together (libuv pool, V8, ZeroMQ): user + system seconds. */
  readonly other: number
  /** Seconds the main thread sat runnable on a run queue (schedstat); NaN without schedstat. */
  readonly jsRunqueueWait: number
}

/**
 * CPU seconds of `pid`'s threads so far (/proc/<pid>/task), and how long its
 * main thread has waited for a CPU, which tells CPU starvation from blocking.
 */
export const threadCpu = (pid: number): ThreadCpu => {
  let js = 0
  let other = 0
  let jsRunqueueWait = Number.NaN
  try {
    jsRunqueueWait = Number(readFileSync(`/proc/${pid}/task/${pid}/schedstat`, "utf8").split(" ")[1]) / 1e9
  } catch {
    // no schedstat in this kernel
  }
  for (const tid of readdirSync(`/proc/${pid}/task`)) {
    try {
      const stat = readFileSync(`/proc/${pid}/task/${tid}/stat`, "utf8")
      const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ")
      const seconds = (Number(fields[11]) + Number(fields[12])) / CLK_TCK // utime, stime
      if (Number(tid) === pid) js += seconds
      else other += seconds
    } catch {
      // the thread ended meanwhile
    }
  }
  return { js, other, jsRunqueueWait }
}

/** Busy and total jiffies of the whole machine so far (/proc/stat); busy excludes idle and iowait. */
export const machineJiffies = (): { busy: number; total: number } => {
  const cpu = readFileSync("/proc/stat", "utf8").split("\n")[0]!.trim().split(/\s+/).slice(1).map(Number)
  const total = cpu.reduce((a, b) => a + b, 0)
  return { busy: total - (cpu[3] ?? 0) - (cpu[4] ?? 0), total } // minus idle and iowait
}

/** Resident memory of `pid` now and at its peak, GiB (/proc/<pid>/status VmRSS, VmHWM). */
export const processMemoryGiB = (pid: number): { rss: number; peak: number } => {
  const status = readFileSync(`/proc/${pid}/status`, "utf8")
  const kib = (field: string): number => Number(new RegExp(`^${field}:\\s+(\\d+)`, "m").exec(status)?.[1] ?? Number.NaN)
  return { rss: kib("VmRSS") / 2 ** 20, peak: kib("VmHWM") / 2 ** 20 }
}

/** Memory available to new allocations, GiB (/proc/meminfo MemAvailable); NaN when unreadable. */
export const memAvailableGiB = (): number =>
  Number(/MemAvailable:\s+(\d+)/.exec(readFileSync("/proc/meminfo", "utf8"))?.[1] ?? Number.NaN) / 2 ** 20

/** Free space of the filesystem at `dir` (/dev/shm, say) for an unprivileged user, GiB. */
export const freeGiB = (dir: string): number => {
  const fs = statfsSync(dir)
  return (fs.bavail * fs.bsize) / 2 ** 30
}
