/**
 * What a process maps and holds, read from /proc: the e2e tests' view of the
 * server's memory from outside (its maps, its resident pages, its open
 * descriptors), by the name of the file mapped.
 */
import { readdirSync, readFileSync, readlinkSync } from "node:fs"

/** Lines of /proc/<pid>/maps mapping a file whose path contains `path` (e.g. `/memfd:<prefix>`, `/dev/shm/<prefix>`). */
export const mapsOf = (pid: number, path: string) => readFileSync(`/proc/${pid}/maps`, "utf8").split("\n").filter((l) => l.includes(path))

/** Lines of /proc/<pid>/maps mapping a memfd whose name starts with `prefix`. */
export const memfdMaps = (pid: number, prefix: string) => mapsOf(pid, `/memfd:${prefix}`)

/** Descriptors process `pid` holds open on memfds whose name starts with `prefix`. */
export const memfdFds = (pid: number, prefix: string) =>
  readdirSync(`/proc/${pid}/fd`).filter((fd) => {
    try {
      return readlinkSync(`/proc/${pid}/fd/${fd}`).startsWith(`/memfd:${prefix}`)
    } catch {
      return false
    }
  }).length

/** KiB of process `pid`'s mappings of memfds named `prefix…` that are resident (/proc/<pid>/smaps `Rss`). */
export const memfdRssKiB = (pid: number, prefix: string) => {
  let total = 0
  let inside = false
  for (const line of readFileSync(`/proc/${pid}/smaps`, "utf8").split("\n")) {
    if (/^[0-9a-f]+-[0-9a-f]+ /.test(line)) inside = line.includes(`/memfd:${prefix}`)
    else if (inside && line.startsWith("Rss:")) total += Number(/(\d+) kB/.exec(line)![1])
  }
  return total
}
