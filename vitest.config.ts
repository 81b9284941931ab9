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
    // Files side by side (cores + 1 workers) brought the suite from 387 s to 182 s here, but two checks do not
    // hold beside other files yet (docs/testing.md "Open"): memfd.test's machine-wide Shmem figure and
    // MqServer.test's restart on the same TCP port (another file took the freed port). Until they do, the suite
    // keeps vitest's default (cores - 1 workers); `npx vitest run --maxWorkers=3` runs it side by side.
    maxWorkers: Math.max(availableParallelism() - 1, 1)
  }
})
