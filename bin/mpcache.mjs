#!/usr/bin/env node
/**
 * The `mpcache` command as package.json's "bin" links it: plain JavaScript, so
 * that it runs from `node_modules` (where Node never strips TypeScript types:
 * ERR_UNSUPPORTED_NODE_MODULES_TYPE_STRIPPING, issue 29 item 1).
 *
 * - Installed from the tarball: runs the emitted JavaScript, dist/src/cli/main.js
 *   (`npm run build`, which `npm pack` runs through prepack).
 * - In a checkout (src/cli/main.ts is there; the tarball does not ship it): runs
 *   the sources themselves, so that what runs is what src/ says and never a
 *   stale dist/ — on a Node that strips types (the Node 24 this repository pins
 *   runs `npx mpcache`); on one that does not, dist/ when built, else it says so.
 *
 * The child processes a command starts (the replay's server and engine workers)
 * run the same form as it does (src/PackageFiles.ts).
 */
import { existsSync } from "node:fs"
import module from "node:module"
import { fileURLToPath, pathToFileURL } from "node:url"

// V8's code cache (Node ≥ 22.1): a later start skips compiling the modules.
module.enableCompileCache?.()

const root = fileURLToPath(new URL("..", import.meta.url))
const source = `${root}src/cli/main.ts`
const dist = `${root}dist/src/cli/main.js`
// "strip" or "transform" where Node runs .ts files (22.18+, 24); undefined or false elsewhere.
const stripsTypes = Boolean(process.features.typescript)

if (existsSync(source) && stripsTypes) await import(pathToFileURL(source).href)
else if (existsSync(dist)) await import(pathToFileURL(dist).href)
else {
  process.stderr.write(
    `mpcache: ${existsSync(source) ? `this checkout runs its TypeScript sources, which Node ${process.version} cannot (it needs Node ≥ 22.18); run it as \`npx mpcache\` (the repository pins Node 24) or build dist/ with \`npm run build\`` : `neither ${dist} nor ${source} is there: the package is incomplete (reinstall it)`}\n`
  )
  process.exitCode = 1
}
