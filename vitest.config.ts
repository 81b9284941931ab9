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
    // Files side by side: one more worker than cores (issue 26). Most e2e files spend much of their time
    // waiting on a child process (a grace, a reap timeout, a Redis failover), so one core more than
    // vitest's default (cores - 1: a single worker on 2 cores, every file one after the other) keeps the
    // cores busy; capped so a large machine does not start dozens of servers with their L1 pools at once.
    maxWorkers: Math.min(availableParallelism() + 1, 8)
  }
})
