import { defineConfig } from "vitest/config"

export default defineConfig({
  test: {
    include: ["test/**/*.test.ts"],
    testTimeout: 30_000,
    hookTimeout: 30_000,
    // `mpcache serve` runs from its bundled entry, rebuilt here when stale (scripts/bundle-serve.mjs).
    globalSetup: ["test/support/bundleServe.ts"],
    // Server logs of passing tests are noise; a failing test keeps its output.
    silent: "passed-only"
  }
})
