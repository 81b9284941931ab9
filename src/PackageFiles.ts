/**
 * Where the package's own files are, whichever form of it runs: the sources
 * (`node src/cli/main.ts`, the tests), the emitted JavaScript of the library
 * build (dist/src/…) or the bundled command (build/cli/bin/*.mjs,
 * scripts/bundle-serve.mjs). The child processes mpcache starts itself (the
 * replay's `mpcache serve` and engine workers) run the same form as their
 * parent: a bundled replay starts bundled children (0.2 s to start, not the
 * 1.3 s of type-stripping the sources: issue 26), a replay from source starts
 * them from source, so what runs is always what that form was built from.
 *
 * @internal
 */
import { createRequire } from "node:module"
import path from "node:path"

/**
 * The package's root: where it resolves its own `mpcache/package.json` (Node's self-reference through the
 * `exports` of package.json, which lists "./package.json"), the same directory from every form.
 */
export const packageRoot: string = path.dirname(createRequire(import.meta.url).resolve("mpcache/package.json"))

/** The form this module runs as, read from its own file name: `.ts` source, `.js` dist, `.mjs` bundle. */
export type PackageForm = "source" | "dist" | "bundle"

export const packageForm: PackageForm = import.meta.url.endsWith(".mjs")
  ? "bundle"
  : import.meta.url.endsWith(".js")
  ? "dist"
  : "source"

/** The programs the package starts as child processes, by form (paths relative to {@link packageRoot}). */
const ENTRIES = {
  /** The `mpcache` command: `node <entry> serve …`. */
  cli: { source: "src/cli/main.ts", dist: "dist/src/cli/main.js", bundle: "build/cli/bin/mpcache.mjs" },
  /** The replay's engine worker (src/replay/WorkerProcess.ts), forked with an IPC channel. */
  replayWorker: { source: "src/replay/WorkerProcess.ts", dist: "dist/src/replay/WorkerProcess.js", bundle: "build/cli/bin/replay-worker.mjs" }
} as const

/** The absolute path of `entry` in the form that runs (one file per form; see {@link ENTRIES}). */
export const entryPath = (entry: keyof typeof ENTRIES): string => path.join(packageRoot, ENTRIES[entry][packageForm])
