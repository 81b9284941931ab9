/**
 * Process-wide limits and state the server sets once at start (issue 24 items 1 and 11), through the addon
 * (src/native/addon/limits.cc): Node has no setrlimit, and libzmq's rand() is seeded only from native code.
 */
import { loadNativeAddon } from "./Native.ts"

/** RLIMIT_NOFILE after the raise (descriptors): the soft limit, the hard one, and the soft limit before. */
export interface DescriptorLimit {
  readonly soft: number
  readonly hard: number
  readonly before: number
}

/**
 * Raises RLIMIT_NOFILE's soft limit to the hard limit (an unlimited hard limit: /proc/sys/fs/nr_open) and returns
 * both; a raise the system refuses keeps the soft limit. Throws (a JS Error with `code`) only when getrlimit fails.
 * Idempotent.
 */
export const raiseDescriptorLimit = (): DescriptorLimit => loadNativeAddon().raiseDescriptorLimit()

/**
 * Seeds libc's rand() from getrandom(2). libzmq 4.3's ROUTER takes the first routing id it generates from rand()
 * and never seeds it, so without this every server generates the same, predictable ids (issue 24 item 1). Call it
 * before the ROUTER is created. Returns nothing a caller needs: the seed stays in the process.
 */
export const seedLibzmqRandom = (): void => {
  loadNativeAddon().seedLibzmqRandom()
}
