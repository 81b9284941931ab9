import { defineConfig } from "vitest/config"

export default defineConfig({
  test: {
    include: ["test/**/*.test.ts"],
    testTimeout: 30_000,
    hookTimeout: 30_000,
    // Server logs of passing tests are noise; a failing test keeps its output.
    silent: "passed-only"
  }
})
