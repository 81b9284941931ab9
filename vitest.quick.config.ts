/**
 * `npm run test:quick` (issue 26 item 3): the unit and in-process integration
 * tests, the loop to run while editing. No child process, no Redis, no
 * browser; `npm test` (vitest.config.ts) stays the whole suite and is what
 * .ci/run runs.
 *
 * The rule: every test file except test/e2e (each of those starts `mpcache
 * serve`, Redis, a browser or a worker process) and except the files named in
 * {@link PROCESS_FILES}, the ones outside test/e2e that start a process.
 * test/QuickSet.test.ts holds the list to the code: a file in the quick set
 * whose imports reach a process (node:child_process, effect/process,
 * playwright …, through test/support and src) fails it, and so does a listed
 * file that no longer reaches one.
 */
import { availableParallelism } from "node:os"
import { configDefaults, defineConfig } from "vitest/config"
import full from "./vitest.config.ts"

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

export default defineConfig({
  test: {
    ...full.test,
    include: [...QUICK_INCLUDE],
    exclude: [...configDefaults.exclude, ...QUICK_EXCLUDE],
    // The bundled `mpcache serve` is for the child processes this set does not start.
    globalSetup: [],
    // One file per core: vitest's default (cores - 1) is one worker on a 2-core machine, and these
    // files spend much of their time waiting on sockets, so the cores stay busy either way.
    maxWorkers: availableParallelism(),
    // A worker runs file after file without re-importing effect, zeromq and src for each (a third of
    // this set's time was imports). No test here keeps global state past its file; `npm test` keeps
    // isolating every file, so whatever this shares is still checked apart there.
    isolate: false
  }
})
