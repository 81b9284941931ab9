/**
 * The file scripts/test-times/reporter.ts writes and scripts/test-times/print.ts
 * reads (issue 26 item 4): one run's wall time and each test file's times, in ms.
 */
import path from "node:path"

/** One test file's times (ms, rounded) and outcome, from vitest's `TestModule.diagnostic()`. */
export interface FileTimes {
  /** Path relative to the repository root, e.g. `test/e2e/curve.test.ts`. */
  readonly file: string
  /** `setupMs + importMs + runMs`: how long the file held a worker. */
  readonly totalMs: number
  /** Its tests and hooks (`beforeAll`/`afterAll` included). */
  readonly runMs: number
  /** Importing it: its module graph and its suite callbacks. */
  readonly importMs: number
  /** The worker's environment, vitest's harness and the setup files. */
  readonly setupMs: number
  readonly tests: number
  readonly failed: number
  /** vitest's `TestModule.state()`: `passed`, `failed`, `skipped`, `pending`, `queued`. */
  readonly state: string
}

export interface TimesFile {
  /** ISO time the run started (the reporter's `onInit`). */
  readonly startedAt: string
  /** From `onInit` to `onTestRunEnd`: vitest's wall time, the type check not included. */
  readonly wallMs: number
  /** `os.loadavg()` at the end of the run (1, 5, 15 minutes). */
  readonly loadAverage: ReadonlyArray<number>
  readonly files: ReadonlyArray<FileTimes>
}

/** Where the times go: `$MPCACHE_TEST_TIMES` when set, else `<root>/build/test-times.json` (build/ is ignored by git). */
export const timesFilePath = (root: string): string =>
  process.env["MPCACHE_TEST_TIMES"] ?? path.join(root, "build", "test-times.json")
