#!/usr/bin/env node
// Builds the native memory addon (src/native/addon) with node-gyp, against
// header files that exist on this machine: it never downloads anything
// (shared/setup-notes.md §2). Run by the root "install" script, so `npm ci`
// and `npm rebuild` build it; plain ESM JavaScript so that any Node runs it.
//
// Headers, first that exists wins:
//   1. the `node-api-headers` package: a nodedir is synthesized under
//      src/native/addon/build-nodedir/ (include/node/*.h + a minimal
//      common.gypi and config.gypi). A Node-API addon needs nothing else.
//   2. npm's `nodedir` setting (npm_config_nodedir) holding include/node/node_api.h.
//   3. the system's Node headers (/usr or /usr/local: include/node/node_api.h).
// napi.h comes from the `node-addon-api` dependency.
//
// No CUDA is needed to build: the addon dlopen's libcudart at run time (src/native/addon/cudart.h).
//
// Output: src/native/addon/build/Release/mpcache_native.node. Exits non-zero,
// loudly, when no headers are found, node-gyp fails, or the result does not load.
import { spawnSync } from "node:child_process"
import { copyFileSync, existsSync, mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import { createRequire } from "node:module"
import path from "node:path"
import { fileURLToPath } from "node:url"

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..")
const addonDir = path.join(root, "src", "native", "addon")
const nodedirOut = path.join(addonDir, "build-nodedir")
const output = path.join(addonDir, "build", "Release", "mpcache_native.node")
const require = createRequire(path.join(root, "package.json"))

const log = (line) => console.log(`build-native: ${line}`)
const fail = (line) => {
  console.error(`build-native: ERROR: ${line}`)
  process.exit(1)
}

/** The directory of an installed package, or undefined. */
const packageDir = (name) => {
  try {
    return path.dirname(require.resolve(`${name}/package.json`))
  } catch {
    return undefined
  }
}

const packageVersion = (dir) => JSON.parse(readFileSync(path.join(dir, "package.json"), "utf8")).version

// Node's own common.gypi sets compiler defaults for addons; a Node-API addon
// needs only these. binding.gyp adds -O3, C++17 and exceptions.
const COMMON_GYPI = `# Synthesized by scripts/build-native.mjs: minimal defaults for a Node-API addon.
{
  'variables': {
    'node_shared%': 'false',
  },
  'target_defaults': {
    'default_configuration': 'Release',
    'configurations': {
      'Debug': {
        'defines': ['DEBUG', '_DEBUG'],
        'cflags': ['-g', '-O0'],
        'xcode_settings': { 'GCC_OPTIMIZATION_LEVEL': '0' },
      },
      'Release': {
        'cflags': ['-O3'],
        'xcode_settings': { 'GCC_OPTIMIZATION_LEVEL': '3' },
      },
    },
    'conditions': [
      ['OS != "win" and OS != "mac"', {
        'cflags': ['-fPIC', '-pthread', '-fvisibility=hidden'],
        'ldflags': ['-pthread'],
      }],
    ],
  },
}
`

// node-gyp seeds build/config.gypi from <nodedir>/include/node/config.gypi.
const CONFIG_GYPI = `# Synthesized by scripts/build-native.mjs.
{ 'target_defaults': {}, 'variables': {} }
`

/** Candidate 1: a nodedir made of node-api-headers' include/*.h. */
const fromNodeApiHeaders = () => {
  const dir = packageDir("node-api-headers")
  if (dir === undefined) return undefined
  const include = path.join(dir, "include")
  if (!existsSync(path.join(include, "node_api.h"))) return undefined
  rmSync(nodedirOut, { recursive: true, force: true })
  const target = path.join(nodedirOut, "include", "node")
  mkdirSync(target, { recursive: true })
  for (const file of readdirSync(include)) {
    if (file.endsWith(".h")) copyFileSync(path.join(include, file), path.join(target, file))
  }
  writeFileSync(path.join(target, "common.gypi"), COMMON_GYPI)
  writeFileSync(path.join(target, "config.gypi"), CONFIG_GYPI)
  return { nodedir: nodedirOut, source: `node-api-headers ${packageVersion(dir)} (${include})` }
}

const hasHeaders = (dir) =>
  dir !== undefined && dir !== "" && existsSync(path.join(dir, "include", "node", "node_api.h"))

/** Candidate 2: npm's nodedir setting, when it really holds headers. */
const fromNpmConfig = () => {
  const dir = process.env.npm_config_nodedir
  return hasHeaders(dir) ? { nodedir: dir, source: `npm config nodedir (${dir})` } : undefined
}

/** Candidate 3: the system's Node headers. */
const fromSystem = () => {
  for (const dir of ["/usr", "/usr/local"]) {
    if (hasHeaders(dir)) return { nodedir: dir, source: `system headers (${dir}/include/node)` }
  }
  return undefined
}

const headers = fromNodeApiHeaders() ?? fromNpmConfig() ?? fromSystem()
if (headers === undefined) {
  fail(
    "no Node-API headers found: install the node-api-headers devDependency (npm ci), " +
      "or set npm's nodedir to a directory holding include/node/node_api.h. Nothing is downloaded."
  )
}

const addonApiDir = packageDir("node-addon-api")
if (addonApiDir === undefined || !existsSync(path.join(addonApiDir, "napi.h"))) {
  fail("node-addon-api (napi.h) is not installed: run npm ci")
}

// node-gyp: the devDependency, else the copy npm bundles (npm_config_node_gyp in npm scripts).
const gypDir = packageDir("node-gyp")
const nodeGyp = gypDir !== undefined ? path.join(gypDir, "bin", "node-gyp.js") : process.env.npm_config_node_gyp
if (nodeGyp === undefined || !existsSync(nodeGyp)) fail("node-gyp is not installed: run npm ci")

log(`headers: ${headers.source}`)
log(`nodedir: ${headers.nodedir}`)
log(`napi.h: ${addonApiDir} (node-addon-api ${packageVersion(addonApiDir)})`)
log(`node-gyp: ${nodeGyp}`)

const started = Date.now()
const gyp = spawnSync(
  process.execPath,
  [
    nodeGyp,
    "rebuild",
    "--directory",
    addonDir,
    `--nodedir=${headers.nodedir}`,
    `--napi_include_dir=${addonApiDir}`,
    "--jobs=max",
    "--loglevel=warn"
  ],
  {
    stdio: "inherit",
    env: {
      ...process.env,
      // The nodedir above is the one to use, whatever npm's config says.
      npm_config_nodedir: headers.nodedir
    }
  }
)
if (gyp.error !== undefined) fail(`could not run node-gyp: ${gyp.error.message}`)
if (gyp.status !== 0) fail(`node-gyp rebuild failed (exit ${gyp.status ?? gyp.signal}); see the compiler output above`)
if (!existsSync(output)) fail(`node-gyp succeeded but ${output} is missing`)

// Undefined symbols only show when the addon is loaded: load it once.
const probe = spawnSync(
  process.execPath,
  [
    "-e",
    `const a = require(${JSON.stringify(output)}); if (typeof a.openMapping !== "function" || typeof a.openCudaIpcMapping !== "function") process.exit(3)`
  ],
  { stdio: "inherit" }
)
if (probe.status !== 0) fail(`the built addon ${output} does not load (exit ${probe.status ?? probe.signal})`)

log(`built ${path.relative(root, output)} in ${((Date.now() - started) / 1000).toFixed(1)} s`)
