/**
 * What a process maps and holds, read from /proc: the e2e tests' view of the
 * server's memory from outside (its maps, its resident pages, its open
 * descriptors), by the name of the file mapped.
 */
import { readdirSync, readFileSync, readlinkSync, statSync } from "node:fs"

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

/**
 * KiB the kernel has allocated to the memfds named `prefix…` that process `pid` holds descriptors on: each
 * distinct file's `st_blocks` × 512 B (fstat through `/proc/<pid>/fd/N`, so the file's own pages, whoever
 * touched them; unlike /proc/meminfo's Shmem, no other process's memory moves it).
 */
export const memfdAllocatedKiB = (pid: number, prefix: string) => {
  const blocksByInode = new Map<number, number>()
  for (const fd of readdirSync(`/proc/${pid}/fd`)) {
    try {
      if (!readlinkSync(`/proc/${pid}/fd/${fd}`).startsWith(`/memfd:${prefix}`)) continue
      const st = statSync(`/proc/${pid}/fd/${fd}`)
      blocksByInode.set(st.ino, st.blocks)
    } catch {
      // closed meanwhile
    }
  }
  return [...blocksByInode.values()].reduce((kib, blocks) => kib + blocks / 2, 0)
}

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
