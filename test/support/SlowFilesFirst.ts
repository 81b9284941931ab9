/**
 * vitest's sequencer for `npm test` (vitest.config.ts): the files known to take longest start first, then vitest's
 * own order. vitest orders by the durations it cached in an earlier run and, on a fresh clone (CI's case), by
 * file size, so the longest file (package.test: an npm pack and install, over a minute) could start last and
 * run alone at the end while the other workers idle. Longest first keeps the workers busy to the end. The list
 * comes from `.ci/run`'s table of the slowest files (docs/testing.md); a file missing from it only starts later.
 */
import { BaseSequencer, type TestSpecification } from "vitest/node"

/** Repository-relative paths, longest first. */
export const SLOWEST_FILES: ReadonlyArray<string> = [
  "test/e2e/package.test.ts",
  "test/e2e/replayRouter.test.ts",
  "test/e2e/replay.test.ts",
  "test/e2e/liveness.test.ts",
  "test/e2e/replayGuard.test.ts",
  "test/e2e/l2.test.ts",
  "test/e2e/memfd.test.ts",
  "test/integration/l2/redisFleet.test.ts"
]

/** Where `moduleId` stands in {@link SLOWEST_FILES} (past its end when not listed). */
const rankOf = (moduleId: string): number => {
  const i = SLOWEST_FILES.findIndex((f) => moduleId.endsWith(`/${f}`))
  return i === -1 ? SLOWEST_FILES.length : i
}

export default class SlowFilesFirst extends BaseSequencer {
  override async sort(files: Array<TestSpecification>): Promise<Array<TestSpecification>> {
    const sorted = await super.sort(files)
    // Array.prototype.sort is stable: the unlisted files keep vitest's order.
    return sorted.sort((a, b) => rankOf(a.moduleId) - rankOf(b.moduleId))
  }
}
