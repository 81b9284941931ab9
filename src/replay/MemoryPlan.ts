/**
 * What a replay will need before it starts anything (issue 18: a replay
 * sized for an 87k-token request filled `/dev/shm` and memory and took the
 * machine down). Each LMCache-driven worker keeps one KV cache sized for the
 * longest request of the slice in `/dev/shm`; an engine-driven worker builds
 * that request's chunk objects in its own heap; a CUDA worker keeps its KV
 * cache in device memory. Each of the replay's own servers holds its L1 pool in
 * `/dev/shm`. Every process (the replay, its servers, each worker) costs a
 * Node heap besides. Shared memory is RAM too, so the whole sum is compared
 * with `MemAvailable`, and the `/dev/shm` part with that file system's free
 * space.
 */
import { readFileSync, statfsSync } from "node:fs"

/** Resident memory assumed per Node process (the replay, its server, each worker): its heap, code and buffers. */
export const PROCESS_OVERHEAD_BYTES = 160 * 2 ** 20

/** Part of `MemAvailable` a replay may plan to use; the rest stays for the machine. */
export const MEMORY_HEADROOM = 0.9

/** What the replay is asked to run. */
export interface ReplayShape {
  /** Worker processes alive at once (a replacement overlaps its killed predecessor for a moment). */
  readonly workers: number
  readonly transferMode: "lmcache-driven" | "engine-driven"
  readonly device: "cpu" | "cuda"
  /** Bytes of KV for one token: 2 (K, V) × layers × heads × head size × dtype bytes. */
  readonly kvBytesPerToken: number
  /** Tokens of the longest request's complete chunks. */
  readonly maxTokens: number
  readonly blockSizeTokens: number
  /** The L1 pools of the replay's own servers, together; 0 with `--server`. */
  readonly l1Bytes: number
  /** Server processes (`--servers`; default 1, also counted with `--server`, as before). */
  readonly servers?: number
}

/** The plan's figures, bytes. */
export interface MemoryNeeds {
  /** One worker's KV memory (its cache, or its chunk objects), for the longest request. */
  readonly workerKvBytes: number
  /** Of the total, what lives in `/dev/shm`. */
  readonly shmBytes: number
  /** Everything: shared memory, heaps and process overhead. */
  readonly totalBytes: number
  readonly processes: number
}

/** What the machine has, bytes. */
export interface MachineMemory {
  readonly memAvailableBytes: number
  readonly shmFreeBytes: number
}

/** The needs of `shape` (see the module header for what counts where). */
export const planMemory = (shape: ReplayShape): MemoryNeeds => {
  // The worker's cache has one block more than the longest request needs (WorkerProcess's numBlocks).
  const blocks = Math.ceil(shape.maxTokens / shape.blockSizeTokens) + 1
  const cacheBytes = blocks * shape.blockSizeTokens * shape.kvBytesPerToken
  const workerKvBytes = shape.device === "cuda" ? 0 : shape.transferMode === "engine-driven" ? shape.maxTokens * shape.kvBytesPerToken : cacheBytes
  const workerShm = shape.transferMode === "lmcache-driven" && shape.device === "cpu" ? workerKvBytes : 0
  const processes = shape.workers + 1 + (shape.servers ?? 1)
  const shmBytes = shape.workers * workerShm + shape.l1Bytes
  return {
    workerKvBytes,
    shmBytes,
    totalBytes: shape.workers * workerKvBytes + shape.l1Bytes + processes * PROCESS_OVERHEAD_BYTES,
    processes
  }
}

const gib = (bytes: number): string => `${(bytes / 2 ** 30).toFixed(1)} GiB`

/**
 * Undefined when `needs` fit `machine`; otherwise the refusal: every figure
 * and the flags that change them.
 */
export const refusal = (shape: ReplayShape, needs: MemoryNeeds, machine: MachineMemory): string | undefined => {
  const usable = Math.floor(machine.memAvailableBytes * MEMORY_HEADROOM)
  if (needs.totalBytes <= usable && needs.shmBytes <= machine.shmFreeBytes) return undefined
  const where = shape.transferMode === "engine-driven" ? "of chunk objects" : "of KV cache"
  return (
    `this replay needs ${gib(needs.totalBytes)} of memory (${shape.workers} worker(s) × ${gib(needs.workerKvBytes)} ${where} ` +
    `for the longest request, ${shape.maxTokens} tokens; ${gib(shape.l1Bytes)} of L1; ${needs.processes} processes × ` +
    `${gib(PROCESS_OVERHEAD_BYTES)}), ${gib(needs.shmBytes)} of it in /dev/shm, but this machine has ` +
    `${gib(machine.memAvailableBytes)} available (MemAvailable; a replay plans at most ${MEMORY_HEADROOM * 100} % of it) ` +
    `and ${gib(machine.shmFreeBytes)} free in /dev/shm. ` +
    `Lower --workers, --max-input-tokens (skips longer requests), --requests or --l1-size-gb, or use --model small.`
  )
}

/**
 * `MemAvailable` from /proc/meminfo and the free space of /dev/shm. Where
 * either cannot be read (not Linux), `Infinity`: the check then cannot refuse.
 */
export const readMachineMemory = (): MachineMemory => {
  let memAvailableBytes = Number.POSITIVE_INFINITY
  try {
    const m = readFileSync("/proc/meminfo", "utf8").match(/^MemAvailable:\s+(\d+) kB$/m)
    if (m !== null) memAvailableBytes = Number(m[1]) * 1024
  } catch {
    // Not Linux: nothing to compare with.
  }
  let shmFreeBytes = Number.POSITIVE_INFINITY
  try {
    const s = statfsSync("/dev/shm")
    shmFreeBytes = s.bavail * s.bsize
  } catch {
    // No /dev/shm: nothing to compare with.
  }
  return { memAvailableBytes, shmFreeBytes }
}
