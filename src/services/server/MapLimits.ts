/**
 * How many memory maps and bytes of worker memory the server may hold
 * (issue 24 items 4 and 12): the kernel's per-process cap on memory maps,
 * read at start, and the rules that derive the defaults of `--max-mappings`,
 * `--max-segments-per-register` and `--max-mapped-bytes` from it and from
 * the machine's RAM. Pure rules plus one synchronous read of /proc; the
 * budget that enforces them is `MappingBudget.ts`.
 *
 * Threat: one REGISTER naming 64,645 segments made the server mmap each of
 * them, until `vm.max_map_count` was reached and V8 itself could not map a
 * page ("Zone Allocation failed"): the process died with every worker's
 * state. Every map the server's own machinery needs (V8's heap pages, thread
 * stacks, shared libraries, libzmq, the L1 pool) comes out of the same
 * per-process cap, so worker memory gets only part of it.
 */
import { readFileSync } from "node:fs"
import { totalmem } from "node:os"

/** Where Linux publishes the per-process cap on memory maps (VMAs). */
export const KERNEL_MAX_MAP_COUNT_PATH = "/proc/sys/vm/max_map_count"

/**
 * Linux's own default of `vm.max_map_count` (`DEFAULT_MAX_MAP_COUNT`,
 * include/linux/mm.h: 65536 − 6): assumed, with a warning at start, when the
 * file cannot be read.
 */
export const FALLBACK_MAX_MAP_COUNT = 65530

/**
 * Maps the server always keeps for itself, below any `--max-mappings`: an
 * idle server holds about 230 (/proc/PID/maps of `mpcache serve --l1-size-gb
 * 1`, measured on Node 24); V8 maps its heap in 256 KiB pages, so a
 * multi-GiB heap under load can take thousands more, and each libuv pool or
 * V8 thread two (stack and guard). 16,384 leaves several times that.
 */
export const RESERVED_MAPS = 16384

/**
 * `--max-segments-per-register` default: distinct segments one REGISTER (or
 * CB_REGISTER_ROPE) may ask the server to map. A paged KV cache has at most
 * one segment per layer (DESIGN §3.2: several layers may share one); the
 * deepest models served today have about 130 layers, so 1024 leaves room
 * for hybrid layouts without letting one request take the process's maps.
 */
export const DEFAULT_MAX_SEGMENTS_PER_REGISTER = 1024

/** The kernel's cap as read at start, or the fallback and why. */
export interface KernelMapCount {
  /** Memory maps one process may hold. */
  readonly value: number
  /** `kernel`: read from {@link KERNEL_MAX_MAP_COUNT_PATH}; `fallback`: {@link FALLBACK_MAX_MAP_COUNT}, see `reason`. */
  readonly source: "kernel" | "fallback"
  /** Why the file was not used (fallback only). */
  readonly reason?: string
}

/**
 * Reads `vm.max_map_count` from `path` (default {@link KERNEL_MAX_MAP_COUNT_PATH}).
 * A file that is missing, unreadable or not a positive integer gives
 * {@link FALLBACK_MAX_MAP_COUNT} with the reason; never throws.
 */
export const readKernelMaxMapCount = (path: string = KERNEL_MAX_MAP_COUNT_PATH): KernelMapCount => {
  let text: string
  try {
    text = readFileSync(path, "utf8").trim()
  } catch (e) {
    const code = (e as { readonly code?: unknown }).code
    return { value: FALLBACK_MAX_MAP_COUNT, source: "fallback", reason: `cannot read ${path} (${typeof code === "string" ? code : String(e)})` }
  }
  const value = /^\d+$/.test(text) ? Number(text) : Number.NaN
  return Number.isSafeInteger(value) && value >= 1
    ? { value, source: "kernel" }
    : { value: FALLBACK_MAX_MAP_COUNT, source: "fallback", reason: `${path} holds "${text.slice(0, 32)}", not a positive integer` }
}

/**
 * The largest `--max-mappings` a kernel cap of `kernelMaxMapCount` allows:
 * the cap less {@link RESERVED_MAPS} (49,146 under Linux's default 65,530);
 * half of a cap below twice that.
 */
export const maxMappingsAllowed = (kernelMaxMapCount: number): number =>
  Math.max(Math.floor(kernelMaxMapCount / 2), kernelMaxMapCount - RESERVED_MAPS)

/** `--max-mappings` default: half the kernel's cap (32,765 under Linux's default 65,530). */
export const defaultMaxMappings = (kernelMaxMapCount: number): number => Math.floor(kernelMaxMapCount / 2)

/**
 * `--max-mapped-bytes` default: half the machine's RAM (`os.totalmem()`).
 * Registered host memory is the workers' own RAM, so all of it together
 * cannot sensibly exceed what the machine has beside L1 and the engines; the
 * bound is what a worker can make the server's copies populate (a copy of a
 * page the worker never touched allocates it, charged to the server).
 */
export const defaultMaxMappedBytes = (totalBytes: number = totalmem()): number => Math.floor(totalBytes / 2)
