/** Waiting in the benches' own (non-Effect) code. */

/** Resolves after `ms` milliseconds (a timer: at least `ms`, later when the event loop is busy). */
export const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms))

/** Seconds since `t0`, a `process.hrtime.bigint()` reading. */
export const secondsSince = (t0: bigint): number => Number(process.hrtime.bigint() - t0) / 1e9
