/**
 * vitest's global setup: (re)builds, when a source is newer, the bundled
 * `mpcache` command (scripts/bundle-serve.mjs: what `npm start` runs and
 * what test/support/Cli.ts starts) and the bundled child scripts of the
 * suite (test/support/ChildScripts.ts), so the children start fast and run
 * what src/ and test/support/ say.
 */
import path from "node:path"
import { bundleEntries, bundleServe } from "../../scripts/bundle-serve.mjs"
import { CHILD_SCRIPTS, TEST_BIN } from "./ChildScripts.ts"

export default async function setup(): Promise<void> {
  await bundleServe()
  await bundleEntries({
    entries: Object.fromEntries(CHILD_SCRIPTS.map((name) => [`${name}.bundle`, path.join("test", "support", `${name}.ts`)])),
    launchers: Object.fromEntries(CHILD_SCRIPTS.map((name) => [`${name}.mjs`, { target: `${name}.bundle`, prepend: [] }])),
    outDir: TEST_BIN,
    sourceDirs: ["src", "test/support"]
  })
}
