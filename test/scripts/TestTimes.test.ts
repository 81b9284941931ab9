/**
 * The table .ci/run prints after `npm test` (issue 26 item 4,
 * scripts/test-times/format.ts): the slowest files first, ties by path, a
 * failed file marked, then the run's wall time and the files' sum.
 */
import { assert, describe, it } from "@effect/vitest"
import { formatTimes } from "../../scripts/test-times/format.ts"
import type { FileTimes, TimesFile } from "../../scripts/test-times/TimesFile.ts"

const file = (name: string, totalMs: number, over: Partial<FileTimes> = {}): FileTimes => ({
  file: name,
  totalMs,
  runMs: totalMs - 300,
  importMs: 250,
  setupMs: 50,
  tests: 3,
  failed: 0,
  state: "passed",
  ...over
})

const times: TimesFile = {
  startedAt: "2026-12-02T02:00:00.000Z",
  wallMs: 61_250,
  loadAverage: [2.5, 2.1, 1.75],
  files: [
    file("test/a.test.ts", 1_000),
    file("test/e2e/slow.test.ts", 42_049),
    file("test/c.test.ts", 9_960, { tests: 12, state: "failed", failed: 2 }),
    file("test/b.test.ts", 1_000, { tests: 1 })
  ]
}

describe("formatTimes (scripts/test-times/format.ts)", () => {
  it("prints the slowest files first, ties by path, a failed one marked, then the totals", () => {
    assert.strictEqual(
      formatTimes(times, 3),
      [
        "The 3 slowest of 4 test files (19 tests):",
        "#  total s  run s  import s  tests  file",
        "1     42.0   41.7       0.3      3  test/e2e/slow.test.ts",
        "2     10.0    9.7       0.3     12  test/c.test.ts  (FAILED: 2 tests)",
        "3      1.0    0.7       0.3      3  test/a.test.ts",
        "Total: vitest ran 61.3 s wall (type check not included); the files' own times sum to 54.0 s (they run side by side), load average at the end 2.5 2.1 1.75."
      ].join("\n")
    )
  })

  it("prints every file when there are fewer than asked for, and no load average when none was read", () => {
    const lines = formatTimes({ ...times, loadAverage: [], files: [file("test/b.test.ts", 1_000, { tests: 1 })] }, 10).split("\n")
    assert.deepStrictEqual(lines, [
      "The 1 slowest of 1 test files (1 test):",
      "#  total s  run s  import s  tests  file",
      "1      1.0    0.7       0.3      1  test/b.test.ts",
      "Total: vitest ran 61.3 s wall (type check not included); the files' own times sum to 1.0 s (they run side by side)."
    ])
  })
})
