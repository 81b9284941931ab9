/**
 * A vitest reporter that writes how long each test file took (issue 26 item 4:
 * "CI says where the time goes"), for scripts/test-times/print.ts to print.
 * Prints nothing itself, so the reporter beside it (`default`) keeps the
 * output people read.
 *
 * Use: `vitest run --reporter=default --reporter=./scripts/test-times/reporter.ts`
 * (what .ci/run does). Writes {@link TimesFile} as JSON to the path in
 * `MPCACHE_TEST_TIMES` when set, else to build/test-times.json.
 *
 * A file's figures are vitest's own (`TestModule.diagnostic()`), in ms:
 * `runMs` its tests and hooks (a `beforeAll` that starts a server counts
 * here), `importMs` importing it (its module graph and suite callbacks),
 * `setupMs` the worker's environment, harness and setup files; `totalMs` is
 * their sum, the time the file held a worker.
 */
import { mkdirSync, writeFileSync } from "node:fs"
import { loadavg } from "node:os"
import path from "node:path"
import type { Reporter, TestModule, Vitest } from "vitest/node"
import { timesFilePath, type FileTimes, type TimesFile } from "./TimesFile.ts"

const fileTimes = (module: TestModule, root: string): FileTimes => {
  const d = module.diagnostic()
  const setupMs = d.environmentSetupDuration + d.prepareDuration + d.setupDuration
  const tests = Array.from(module.children.allTests())
  return {
    file: path.relative(root, module.moduleId),
    totalMs: Math.round(setupMs + d.collectDuration + d.duration),
    runMs: Math.round(d.duration),
    importMs: Math.round(d.collectDuration),
    setupMs: Math.round(setupMs),
    tests: tests.length,
    failed: tests.filter((t) => t.result().state === "failed").length,
    state: module.state()
  }
}

export default class TestTimesReporter implements Reporter {
  private startedAt = 0
  private root = process.cwd()

  onInit(vitest: Vitest): void {
    this.startedAt = Date.now()
    this.root = vitest.config.root
  }

  onTestRunEnd(testModules: ReadonlyArray<TestModule>): void {
    const times: TimesFile = {
      startedAt: new Date(this.startedAt).toISOString(),
      wallMs: Date.now() - this.startedAt,
      // The 1/5/15-minute load averages at the end: figures from a busy machine say so.
      loadAverage: loadavg().map((l) => Math.round(l * 100) / 100),
      files: testModules.map((m) => fileTimes(m, this.root))
    }
    const out = timesFilePath(this.root)
    mkdirSync(path.dirname(out), { recursive: true })
    writeFileSync(out, `${JSON.stringify(times, null, 1)}\n`)
  }
}
