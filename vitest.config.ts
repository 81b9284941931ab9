import { availableParallelism } from "node:os"
import { configDefaults, defineConfig } from "vitest/config"
import SlowFilesFirst from "./test/support/SlowFilesFirst.ts"
import { PROCESS_INCLUDE, QUICK_EXCLUDE, QUICK_INCLUDE } from "./vitest.sets.ts"

export default defineConfig({
  test: {
    // Which files: the two projects below (a project's include is added to the root's, so the root names none).
    testTimeout: 30_000,
    hookTimeout: 30_000,
    // `mpcache serve` runs from its bundled entry, rebuilt here when stale (scripts/bundle-serve.mjs).
    globalSetup: ["test/support/bundleServe.ts"],
    // Server logs of passing tests are noise; a failing test keeps its output.
    silent: "passed-only",
    // Files side by side: cores + 1 workers (up to 8) brought the suite from 387 s to 182 s on 2 cores (docs/testing.md).
    // A test that binds a port it rebinds or keeps closed takes it below the ephemeral range (test/support/QuietPort.ts),
    // and no assertion reads a machine-wide figure, so files do not disturb each other.
    maxWorkers: Math.min(availableParallelism() + 1, 8),
    // The longest files start first, on a fresh clone too (test/support/SlowFilesFirst.ts).
    sequence: { sequencer: SlowFilesFirst },
    // Two projects in one pool: the quick set (no child process) runs with workers shared between files, as
    // `npm run test:quick` does — a worker imports effect, zeromq and src once, not once a file (imports were
    // 15 % of the suite's time, spawning 164 workers another 55 s); the files that start processes stay
    // isolated, one worker each (docs/testing.md).
    projects: [
      {
        extends: true,
        test: { name: "in-process", include: [...QUICK_INCLUDE], exclude: [...configDefaults.exclude, ...QUICK_EXCLUDE], isolate: false }
      },
      { extends: true, test: { name: "processes", include: [...PROCESS_INCLUDE] } }
    ]
  }
})
