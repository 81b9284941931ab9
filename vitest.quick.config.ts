/**
 * `npm run test:quick` (issue 26 item 3): the unit and in-process integration
 * tests, the loop to run while editing. No child process, no Redis, no
 * browser; `npm test` (vitest.config.ts) stays the whole suite and is what
 * .ci/run runs.
 *
 * The rule: every test file except test/e2e (each of those starts `mpcache
 * serve`, Redis, a browser or a worker process) and except the files named in
 * {@link PROCESS_FILES}, the ones outside test/e2e that start a process.
 * test/QuickSet.test.ts holds the list to the code: a file in the quick set
 * whose imports reach a process (node:child_process, effect/process,
 * playwright …, through test/support and src) fails it, and so does a listed
 * file that no longer reaches one.
 */
import { availableParallelism } from "node:os"
import { configDefaults, defineConfig } from "vitest/config"
import full from "./vitest.config.ts"
import { QUICK_EXCLUDE, QUICK_INCLUDE } from "./vitest.sets.ts"

export { PROCESS_FILES, QUICK_EXCLUDE, QUICK_INCLUDE } from "./vitest.sets.ts"

export default defineConfig({
  test: {
    // The whole suite's settings without its two projects: this set is one list of files.
    ...Object.fromEntries(Object.entries(full.test ?? {}).filter(([k]) => k !== "projects")),
    include: [...QUICK_INCLUDE],
    exclude: [...configDefaults.exclude, ...QUICK_EXCLUDE],
    // The bundled `mpcache serve` is for the child processes this set does not start.
    globalSetup: [],
    // One file per core: vitest's default (cores - 1) is one worker on a 2-core machine, and these
    // files spend much of their time waiting on sockets, so the cores stay busy either way.
    maxWorkers: availableParallelism(),
    // A worker runs file after file without re-importing effect, zeromq and src for each (a third of
    // this set's time was imports). No test here keeps global state past its file; `npm test` shares
    // workers the same way for these files (vitest.config.ts), and `npx vitest run FILE` runs one alone.
    isolate: false
  }
})
