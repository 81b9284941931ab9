#!/usr/bin/env node
/**
 * Builds the bundled entries of the `mpcache` command (issue 16: spawn →
 * first reply fast; issue 26: the test suite's children start in 0.2 s, not
 * 1.3 s): src/cli/main.ts and the replay's worker process
 * (src/replay/WorkerProcess.ts), with every JavaScript module they load,
 * effect and @effect/platform-node included, as minified ES modules in
 * build/cli/bin/ (by rolldown: no type stripping and no module resolution at
 * start; what both load is one shared chunk). Beside them this script writes
 * the launchers, which turn on Node's compile cache first:
 *
 * - build/cli/bin/serve.mjs: `node serve.mjs [flags]` is `mpcache serve [flags]` (`npm start`);
 * - build/cli/bin/mpcache.mjs: `node mpcache.mjs …` is `mpcache …`, every command;
 * - build/cli/bin/replay-worker.mjs: the replay's engine worker, which a bundled replay forks
 *   (src/PackageFiles.ts picks the entries of the form that runs).
 *
 * What serve loads only after its ROUTER is bound (the HTTP frontend, the
 * redis client) is split into chunks beside main.mjs, loaded by their dynamic
 * imports. zeromq and @node-rs/xxhash stay external (native addons with their
 * own loaders: each picks its platform's binary at run time), and so does
 * mpcache's addon, which src/native/internal/AddonLoader.ts finds from the
 * package's root, from the bundle as from the sources and dist/.
 *
 * Only rebuilds when a source is newer than the bundle (src/**, package.json,
 * package-lock.json, this script); `--force` always. Used by `npm start`
 * (prestart) and by the tests (vitest's global setup), so both run what
 * src/ says. {@link bundleEntries} is the same build for other entries (the
 * test suite's child scripts: test/support/bundleServe.ts). Prints one line;
 * exits 1 when rolldown is missing or fails.
 */
import { existsSync, mkdirSync, readdirSync, rmSync, statSync, writeFileSync } from "node:fs"
import path from "node:path"
import { fileURLToPath } from "node:url"

export const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..")
export const OUT_DIR = path.join(ROOT, "build", "cli", "bin")
export const BUNDLE = path.join(OUT_DIR, "main.mjs")
export const LAUNCHER = path.join(OUT_DIR, "serve.mjs")

/** The text of a launcher that runs `./<target>` with `prepend` put before its own arguments. */
const launcherText = (file, target, prepend) => `// Written by scripts/bundle-serve.mjs: \`node ${file} …\` runs the bundle ./${target}${prepend.length > 0 ? ` as \`${prepend.join(" ")} …\`` : ""}.
import { enableCompileCache } from "node:module"
// V8's code cache (in the OS's tmp dir): a later start skips compiling the bundle.
enableCompileCache()
${prepend.length > 0 ? `process.argv.splice(2, 0, ${prepend.map((a) => JSON.stringify(a)).join(", ")})\n` : ""}await import("./${target}")
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

/**
 * Builds `entries` (name → source file, relative to the root) into `outDir` as `<name>.mjs`, with
 * `launchers` (file name → { target: entry name, prepend: argv put first }) beside them, when a file
 * under `sourceDirs` (or package.json, package-lock.json, this script) is newer than the build, or
 * `force`. Resolves with what it did ("up to date" or "built in N ms").
 */
export const bundleEntries = async ({ entries, launchers, outDir, sourceDirs, force = false }) => {
  const outputs = [...Object.keys(entries).map((n) => `${n}.mjs`), ...Object.keys(launchers)].map((f) => path.join(outDir, f))
  const stale = () => {
    if (!outputs.every((f) => existsSync(f))) return true
    const built = Math.min(...outputs.map((f) => statSync(f).mtimeMs))
    const sources = Math.max(
      ...sourceDirs.map((d) => newestMtime(path.join(ROOT, d))),
      ...["package.json", "package-lock.json", "scripts/bundle-serve.mjs"].map((f) => statSync(path.join(ROOT, f)).mtimeMs)
    )
    return sources > built
  }
  if (!force && !stale()) return "up to date"
  const { build } = await import("rolldown")
  // The chunks of an older build go first (their names carry a hash).
  rmSync(outDir, { recursive: true, force: true })
  mkdirSync(outDir, { recursive: true })
  const started = Date.now()
  await build({
    input: Object.fromEntries(Object.entries(entries).map(([name, file]) => [name, path.join(ROOT, file)])),
    platform: "node",
    external: ["zeromq", "@node-rs/xxhash"],
    logLevel: "warn",
    // Dynamic imports (the HTTP frontend, the redis client) become chunks of their own, so the first
    // reply loads only the MQ side's code; the chunks sit beside the entries (the addon path holds).
    output: { dir: outDir, entryFileNames: "[name].mjs", chunkFileNames: "[name]-[hash].mjs", format: "esm", minify: true }
  })
  for (const [file, { target, prepend }] of Object.entries(launchers)) {
    writeFileSync(path.join(outDir, file), launcherText(path.relative(ROOT, path.join(outDir, file)), `${target}.mjs`, prepend))
  }
  return `built in ${Date.now() - started} ms`
}

/** Builds the `mpcache` command's bundle and launchers (above) when stale, or `force`. */
export const bundleServe = (force = false) =>
  bundleEntries({
    entries: { main: "src/cli/main.ts", "replay-worker-main": "src/replay/WorkerProcess.ts" },
    launchers: {
      "serve.mjs": { target: "main", prepend: ["serve"] },
      "mpcache.mjs": { target: "main", prepend: [] },
      "replay-worker.mjs": { target: "replay-worker-main", prepend: [] }
    },
    outDir: OUT_DIR,
    sourceDirs: ["src"],
    force
  })

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  bundleServe(process.argv.includes("--force")).then(
    (what) => process.stderr.write(`bundle-serve: ${path.relative(ROOT, OUT_DIR)} ${what}\n`),
    (error) => {
      process.stderr.write(`bundle-serve: cannot build ${path.relative(ROOT, BUNDLE)}: ${error instanceof Error ? error.message : String(error)}\n`)
      process.exit(1)
    }
  )
}
