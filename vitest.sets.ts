/**
 * Which test files start a process (issue 26 item 3): the two sets both configs run. The quick set
 * (vitest.quick.config.ts, `npm run test:quick`) is every file but test/e2e and {@link PROCESS_FILES};
 * `npm test` (vitest.config.ts) runs it as one project whose workers are shared between files, and the rest
 * as a project that isolates every file. test/QuickSet.test.ts holds {@link PROCESS_FILES} to the code.
 */
/** The test files outside test/e2e that start a process, each with what it starts. */
export const PROCESS_FILES: Readonly<Record<string, string>> = {
  "test/integration/CudaIpc.test.ts": "cc, building the fake libcudart (test/support/FakeCudart.ts)",
  "test/integration/L2EngineDriven.test.ts": "a Redis and a Redis Cluster (test/support/RedisSuite.ts)",
  "test/integration/RoutingIdGuard.test.ts": "node, the colliding peers' script (test/support/Cli.ts)",
  "test/integration/l2/redisFleet.test.ts": "redis-server (test/support/RedisFleet.ts)",
  "test/native/CudaFault.test.ts": "cc, building the fake libcudart (test/support/FakeCudart.ts)",
  "test/native/CudaIpc.test.ts": "node, the CUDA probe, and cc (test/support/FakeCudart.ts)",
  "test/native/FaultGuard.test.ts": "node, the processes that fault outside the guard",
  "test/native/FdListener.test.ts": "mkfifo",
  "test/native/Native.test.ts": "node --expose-gc, the finalizer test",
  "test/services/server/l2/L2Config.test.ts": "mpcache serve, for its exit code (test/support/Cli.ts)",
  "test/services/server/l2/L2Mac.test.ts": "mkfifo"
}

/** Globs of the quick set, relative to the repository root: vitest's `include`/`exclude`. */
export const QUICK_INCLUDE: ReadonlyArray<string> = ["test/**/*.test.ts"]
export const QUICK_EXCLUDE: ReadonlyArray<string> = ["test/e2e/**", ...Object.keys(PROCESS_FILES)]

/** The files that start a process: test/e2e and {@link PROCESS_FILES}. */
export const PROCESS_INCLUDE: ReadonlyArray<string> = ["test/e2e/**/*.test.ts", ...Object.keys(PROCESS_FILES)]
