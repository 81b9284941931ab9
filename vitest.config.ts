import { availableParallelism } from "node:os"
import { defineConfig } from "vitest/config"

export default defineConfig({
  test: {
    include: ["test/**/*.test.ts"],
    testTimeout: 30_000,
    hookTimeout: 30_000,
    // `mpcache serve` runs from its bundled entry, rebuilt here when stale (scripts/bundle-serve.mjs).
    globalSetup: ["test/support/bundleServe.ts"],
    // Server logs of passing tests are noise; a failing test keeps its output.
    silent: "passed-only",
    // Files side by side: cores + 1 workers (up to 8) brought the suite from 387 s to 182 s on 2 cores (docs/testing.md).
    // A test that binds a port it rebinds or keeps closed takes it below the ephemeral range (test/support/QuietPort.ts),
    // and no assertion reads a machine-wide figure, so files do not disturb each other.
    maxWorkers: Math.min(availableParallelism() + 1, 8)
  }
})
