#!/usr/bin/env node
/**
 * Builds the bundled entry of `mpcache serve` (issue 16: spawn → first reply
 * fast): src/cli/main.ts and every JavaScript module it loads, effect and
 * @effect/platform-node included, in one minified ES module
 * (build/cli/bin/main.mjs, by rolldown: no type stripping and no module
 * resolution at start), beside its launcher build/cli/bin/serve.mjs (this
 * script writes it), which turns on Node's compile cache and runs
 * `mpcache serve` with the launcher's own arguments. What serve loads only
 * after its ROUTER is bound (the HTTP frontend, the redis client) is split
 * into chunks beside main.mjs, loaded by their dynamic imports.
 *
 * zeromq and @node-rs/xxhash stay external (native addons with their own
 * loaders: each picks its platform's binary at run time), and so does
 * mpcache's addon, which src/native/internal/AddonLoader.ts finds from the
 * package's root (where `mpcache/package.json` resolves), from the bundle
 * as from the sources and dist/.
 *
 * Only rebuilds when a source is newer than the bundle (src/**, package.json,
 * package-lock.json, this script); `--force` always. Used by `npm start`
 * (prestart) and by the tests (vitest's global setup), so both run what
 * src/ says. Prints one line; exits 1 when rolldown is missing or fails.
 */
import { existsSync, mkdirSync, readdirSync, rmSync, statSync, writeFileSync } from "node:fs"
import path from "node:path"
import { fileURLToPath } from "node:url"

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..")
export const OUT_DIR = path.join(ROOT, "build", "cli", "bin")
export const BUNDLE = path.join(OUT_DIR, "main.mjs")
export const LAUNCHER = path.join(OUT_DIR, "serve.mjs")

const LAUNCHER_TEXT = `// Written by scripts/bundle-serve.mjs: \`node build/cli/bin/serve.mjs [flags]\` is \`mpcache serve [flags]\`.
import { enableCompileCache } from "node:module"
// V8's code cache (in the OS's tmp dir): a later start skips compiling the bundle.
enableCompileCache()
process.argv.splice(2, 0, "serve")
await import("./main.mjs")
`

const newestMtime = (dir) => {
  let newest = 0
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const p = path.join(dir, entry.name)
    if (entry.isDirectory()) {
      if (entry.name !== "build" && entry.name !== "node_modules") newest = Math.max(newest, newestMtime(p))
    } else if (/\.(ts|mts|js|mjs|json)$/.test(entry.name)) newest = Math.max(newest, statSync(p).mtimeMs)
  }
  return newest
}

/** Whether the bundle is missing or older than one of its sources. */
export const isStale = () => {
  if (!existsSync(BUNDLE) || !existsSync(LAUNCHER)) return true
  const built = Math.min(statSync(BUNDLE).mtimeMs, statSync(LAUNCHER).mtimeMs)
  const sources = Math.max(
    newestMtime(path.join(ROOT, "src")),
    ...["package.json", "package-lock.json", "scripts/bundle-serve.mjs"].map((f) => statSync(path.join(ROOT, f)).mtimeMs)
  )
  return sources > built
}

/** Builds the bundle and the launcher when stale (or `force`); resolves with what it did. */
export const bundleServe = async (force = false) => {
  if (!force && !isStale()) return "up to date"
  const { build } = await import("rolldown")
  // The chunks of an older build go first (their names carry a hash).
  rmSync(OUT_DIR, { recursive: true, force: true })
  mkdirSync(OUT_DIR, { recursive: true })
  const started = Date.now()
  await build({
    input: path.join(ROOT, "src", "cli", "main.ts"),
    platform: "node",
    external: ["zeromq", "@node-rs/xxhash"],
    logLevel: "warn",
    // Dynamic imports (the HTTP frontend, the redis client) become chunks of their own, so the first
    // reply loads only the MQ side's code; the chunks sit beside main.mjs (the addon path holds).
    output: { dir: OUT_DIR, entryFileNames: "main.mjs", chunkFileNames: "[name]-[hash].mjs", format: "esm", minify: true }
  })
  writeFileSync(LAUNCHER, LAUNCHER_TEXT)
  return `built in ${Date.now() - started} ms`
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  bundleServe(process.argv.includes("--force")).then(
    (what) => process.stderr.write(`bundle-serve: ${path.relative(ROOT, LAUNCHER)} ${what}\n`),
    (error) => {
      process.stderr.write(`bundle-serve: cannot build ${path.relative(ROOT, BUNDLE)}: ${error instanceof Error ? error.message : String(error)}\n`)
      process.exit(1)
    }
  )
}
