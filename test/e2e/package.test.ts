/**
 * mpcache as a library (DESIGN §7): `npm pack` emits and packs the package,
 * an empty project installs the tarball (its own install script builds the
 * addon; dependencies come from the npm cache that `npm ci` filled), and
 * the examples run there under plain Node against a real `mpcache serve`
 * started from this checkout, with their exact output. Also: the examples
 * type-check against the published declarations, and importing
 * `mpcache/client` loads no module of services/server or services/liveness
 * (a resolve hook records every URL Node resolves).
 *
 * Slow by nature (tsc emit, an addon build, an npm install: about a minute
 * on a quiet machine), so the set-up runs once for the file with generous
 * timeouts; the temporary directories go in afterAll.
 */
import { execFile } from "node:child_process"
import { randomUUID } from "node:crypto"
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { delimiter, dirname, join } from "node:path"
import { fileURLToPath } from "node:url"
import { afterAll, assert, beforeAll, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { startCli, startScript } from "../support/Cli.ts"

const ROOT = fileURLToPath(new URL("../../", import.meta.url))
const EXAMPLES = join(ROOT, "examples")
const TSC = join(ROOT, "node_modules", "typescript", "bin", "tsc")

interface Run {
  readonly code: number | null
  readonly stdout: string
  readonly stderr: string
}

/**
 * The environment for a nested npm: this one minus what the outer `npm test`
 * exported about itself (its lifecycle, its package, its local prefix), so
 * the inner npm works on its own cwd; npm's configuration (cache, registry,
 * nodedir …) stays as the user has it.
 */
const npmEnv = (): NodeJS.ProcessEnv =>
  Object.fromEntries(
    Object.entries(process.env).filter(([k]) =>
      !/^npm_(lifecycle_|package_|command$|config_local_prefix$|config_loglevel$)/.test(k)
    )
  )

/** Runs `file args` in `cwd` to completion (killed after `timeoutMs`); never rejects. */
const run = (file: string, args: ReadonlyArray<string>, cwd: string, timeoutMs: number, env = process.env): Promise<Run> =>
  new Promise((resolve) => {
    execFile(file, args, { cwd, env, timeout: timeoutMs, killSignal: "SIGKILL", maxBuffer: 64 * 1024 * 1024 }, (error, stdout, stderr) => {
      const code = error === null ? 0 : typeof error.code === "number" ? error.code : null
      resolve({ code, stdout, stderr })
    })
  })

const explain = (what: string, r: Run): string => `${what} exited ${r.code}\n--- stdout\n${r.stdout}\n--- stderr\n${r.stderr}`

let work = ""
let project = ""
let tarball = ""
let installOutput = ""
const timings: Record<string, number> = {}

beforeAll(async () => {
  work = mkdtempSync(join(tmpdir(), "mpcache-package-"))
  const packDir = join(work, "pack")
  project = join(work, "consumer")
  for (const dir of [packDir, project]) mkdirSync(dir)

  // prepack runs the library build (tsc -p tsconfig.build.json) before packing.
  let t = Date.now()
  const pack = await run("npm", ["pack", "--pack-destination", packDir, "--no-audit", "--no-fund"], ROOT, 240_000, npmEnv())
  timings["npm pack"] = Date.now() - t
  assert.strictEqual(pack.code, 0, explain("npm pack", pack))
  const tarballs = readdirSync(packDir).filter((f) => f.endsWith(".tgz"))
  assert.strictEqual(tarballs.length, 1, `one tarball expected in ${packDir}: ${tarballs.join(", ")}`)

  // An empty ESM project, as a consumer starts. Its install resolves mpcache's
  // dependencies from the cache `npm ci` filled (--prefer-offline: no
  // revalidation) and runs mpcache's install script, which builds the addon
  // against local headers only. devDependencies (the Node 24 binary among
  // them) are not installed for a dependency: the examples run on this Node.
  // allowScripts as the README says (npm 11 runs install scripts either way, but warns about every one the
  // project has not decided on): mpcache's builds the addon; zeromq's and msgpackr-extract's only try to
  // rebuild what ships prebuilt. A tarball's key is its resolved spec, `file:<absolute path>`.
  tarball = join(packDir, tarballs[0]!)
  writeFileSync(
    join(project, "package.json"),
    `${JSON.stringify({
      name: "consumer",
      private: true,
      type: "module",
      allowScripts: { [`file:${tarball}`]: true, zeromq: false, "msgpackr-extract": false }
    }, null, 2)}\n`
  )
  t = Date.now()
  const install = await run(
    "npm",
    ["install", "--prefer-offline", "--no-audit", "--no-fund", "--foreground-scripts", tarball],
    project,
    420_000,
    npmEnv()
  )
  timings["npm install <tarball>"] = Date.now() - t
  assert.strictEqual(install.code, 0, explain("npm install", install))
  installOutput = install.stdout + install.stderr
  // A consumer's programs live in its own tree (Node would refuse to strip types under node_modules; these are .mjs anyway).
  for (const example of ["ping.mjs", "worker.mjs", "embed.mjs"]) copyFileSync(join(EXAMPLES, example), join(project, example))
}, 700_000)

afterAll(() => {
  if (work !== "") rmSync(work, { recursive: true, force: true })
  process.stderr.write(`package.test timings (ms): ${JSON.stringify(timings)}\n`)
})

/**
 * The consumer's environment for `npx`: this Node (24) first on PATH, as a user's shell would have it, and
 * none of the outer npm's own variables.
 */
const consumerEnv = (): NodeJS.ProcessEnv => ({ ...npmEnv(), PATH: `${dirname(process.execPath)}${delimiter}${process.env["PATH"] ?? ""}` })

/** `npx mpcache …args` in the consumer project, as its user types it. */
const npxMpcache = (args: ReadonlyArray<string>) => Effect.promise(() => run("npx", ["mpcache", ...args], project, 60_000, consumerEnv()))

/** Runs a script of the consumer project under this Node (24), outside any npm. */
const node = (args: ReadonlyArray<string>, timeoutMs = 60_000) => Effect.promise(() => run(process.execPath, args, project, timeoutMs))

/** The URLs Node resolves while importing `specifier` from the consumer project (module.registerHooks). */
const resolvedBy = (specifier: string) =>
  Effect.gen(function*() {
    const probe = join(project, `resolve-probe-${randomUUID()}.mjs`)
    writeFileSync(
      probe,
      [
        `import { registerHooks } from "node:module"`,
        `const urls = []`,
        `registerHooks({ resolve(specifier, context, next) { const r = next(specifier, context); urls.push(r.url); return r } })`,
        `await import(${JSON.stringify(specifier)})`,
        `process.stdout.write(JSON.stringify(urls))`
      ].join("\n")
    )
    const r = yield* node([probe])
    rmSync(probe, { force: true })
    assert.strictEqual(r.code, 0, explain(`import ${specifier}`, r))
    return (JSON.parse(r.stdout) as Array<string>).map((u) => u.replace(/^file:\/\/.*\/node_modules\//, ""))
  })

describe("mpcache as an installed package", () => {
  it("the tarball holds the emitted entries, the addon sources and build script; the install built the addon", () => {
    const pkg = join(project, "node_modules", "mpcache")
    for (
      const file of [
        "dist/src/schema/index.js",
        "dist/src/schema/index.d.ts",
        "dist/src/client.js",
        "dist/src/client.d.ts",
        "dist/src/server.js",
        "dist/src/server.d.ts",
        "src/native/addon/binding.gyp",
        "src/native/addon/addon.cc",
        "scripts/build-native.mjs",
        "README.md",
        "src/native/addon/build/Release/mpcache_native.node"
      ]
    ) assert.isTrue(existsSync(join(pkg, file)), `${file} missing from the installed package`)
    for (const absent of ["test", "bench", "tsconfig.json", "src/services/client/MqClient.ts", "node_modules/node"]) {
      assert.isFalse(existsSync(join(pkg, absent)), `${absent} should not be in the installed package`)
    }
    assert.isFalse(existsSync(join(project, "node_modules", "node")), "the node devDependency was installed into the consumer")
  })

  it.live("the tarball holds exactly the package's files: no build debris (__pycache__, .pyc, build/), no sources but the addon's", () =>
    Effect.gen(function*() {
      const list = yield* Effect.promise(() => run("tar", ["-tzf", tarball], work, 60_000))
      assert.strictEqual(list.code, 0, explain("tar", list))
      const files = list.stdout.trim().split("\n").map((f) => f.replace(/^package\//, "")).sort()
      assert.deepStrictEqual(files.filter((f) => /__pycache__|\.pyc$|(^|\/)build\/|\.tgz$|\.ts$/.test(f) && !f.endsWith(".d.ts")), [])
      assert.deepStrictEqual(files.filter((f) => !f.startsWith("dist/") && !f.startsWith("src/native/addon/")), [
        "README.md",
        "bin/mpcache.mjs",
        "data/mooncake-traces/LICENSE-APACHE",
        "data/mooncake-traces/README.md",
        "data/mooncake-traces/conversation_trace.jsonl",
        "examples/README.md",
        "examples/embed.mjs",
        "examples/kv_events_subscriber.py",
        "examples/memfd_worker.py",
        "examples/ping.mjs",
        "examples/worker.mjs",
        "package.json",
        "scripts/build-native.mjs"
      ])
      // The command's emitted entries, and the replay's worker it forks.
      for (const f of ["dist/src/cli/main.js", "dist/src/replay/WorkerProcess.js"]) assert.include(files, f)
    }))

  it("the install, with allowScripts as the README says, warns about no install script, and effect came as a peer", () => {
    assert.notInclude(installOutput, "install-scripts", installOutput)
    assert.isTrue(existsSync(join(project, "node_modules", "effect", "package.json")), "effect (a peer dependency) was not installed")
    const manifest = JSON.parse(readFileSync(join(project, "node_modules", "mpcache", "package.json"), "utf8")) as {
      readonly peerDependencies?: Record<string, string>
      readonly dependencies?: Record<string, string>
    }
    assert.deepStrictEqual(manifest.peerDependencies, { effect: "^4.1.0" })
    assert.notProperty(manifest.dependencies ?? {}, "effect")
  })

  it.live("the installed command: npx mpcache --version, keygen, serve + ping, status, and SIGTERM", () =>
    Effect.scoped(Effect.gen(function*() {
      const version = yield* npxMpcache(["--version"])
      assert.strictEqual(version.code, 0, explain("npx mpcache --version", version))
      assert.strictEqual(version.stdout, "mpcache v0.1.0\n")

      const keygen = yield* npxMpcache(["keygen", join(work, "server")])
      assert.strictEqual(keygen.code, 0, explain("npx mpcache keygen", keygen))
      assert.strictEqual((statSync(join(work, "server.key")).mode & 0o777).toString(8), "600")
      assert.match(readFileSync(join(work, "server.pub"), "utf8"), /^\S{40}\n$/)

      // serve through the installed link itself (what npx runs), so that SIGTERM reaches the server.
      const endpoint = `ipc://${join(tmpdir(), `mpcache-package-${randomUUID()}.sock`)}`
      const server = yield* startScript(join(project, "node_modules", ".bin", "mpcache"), [
        "serve", "--endpoint", endpoint, "--http-port", "0", "--l1-size-gb", "0.25", "--no-l1-prefault"
      ])
      const [, httpPort] = yield* server.waitForStderr(/HTTP frontend listening on http:\/\/127\.0\.0\.1:(\d+)/, 30_000)
      const ping = yield* npxMpcache(["ping", "--endpoint", endpoint])
      assert.deepStrictEqual([ping.code, ping.stdout], [0, "true\n"], explain("npx mpcache ping", ping))
      const status = yield* npxMpcache(["status", "--http-port", httpPort!])
      assert.strictEqual(status.code, 0, explain("npx mpcache status", status))
      assert.strictEqual(status.stdout.split("\n")[0], `mpcache 0.1.0 (protocol 1) · ${endpoint} · up ${/ up (\S+) /.exec(status.stdout)![1]} · 0 peers`)
      assert.include(status.stdout, "readiness ready")
      const exit = yield* server.stop("SIGTERM")
      assert.deepStrictEqual(exit, { code: 0, signal: null })
      assert.match(server.stderr().trimEnd().split("\n").at(-1)!, /stopped: in-flight requests drained and every resource released in \d+ ms$/)
    })), 180_000)

  it.live("examples/embed.mjs: a server embedded from mpcache/server answers its own PING and stops; --serve drains on SIGTERM", () =>
    Effect.scoped(Effect.gen(function*() {
      const endpoint = `ipc://${join(tmpdir(), `mpcache-embed-${randomUUID()}.sock`)}`
      const once = yield* node(["embed.mjs", endpoint])
      assert.strictEqual(once.code, 0, explain("embed.mjs", once))
      assert.strictEqual(once.stdout, `listening on ${endpoint}\nping: true\nstopped\n`)
      assert.include(once.stderr, `MQ server listening on ${endpoint}`)

      const served = yield* startScript(join(project, "embed.mjs"), [endpoint, "--serve"])
      yield* served.waitForStderr(/HTTP frontend listening on/, 30_000)
      const ping = yield* npxMpcache(["ping", "--endpoint", endpoint])
      assert.deepStrictEqual([ping.code, ping.stdout], [0, "true\n"], explain("npx mpcache ping", ping))
      const exit = yield* served.stop("SIGTERM")
      assert.deepStrictEqual(exit, { code: 0, signal: null })
      assert.match(served.stderr().trimEnd().split("\n").at(-1)!, /stopped: in-flight requests drained and every resource released in \d+ ms$/)
    })), 120_000)

  it.live("examples/ping.mjs and examples/worker.mjs against a real server: exact output", () =>
    Effect.scoped(Effect.gen(function*() {
      const endpoint = `ipc://${join(tmpdir(), `mpcache-package-${randomUUID()}.sock`)}`
      const server = yield* startCli(["serve", "--endpoint", endpoint, "--http-port", "0", "--chunk-size", "64", "--l1-size-gb", "0.25"])
      yield* server.waitForStderr(/MQ server listening on/, 30_000)

      const ping = yield* node(["ping.mjs", endpoint])
      assert.strictEqual(ping.code, 0, explain("ping.mjs", ping))
      assert.strictEqual(ping.stdout, "ping: true\nchunk size: 64 tokens\n")

      const worker = yield* node(["worker.mjs", endpoint])
      assert.strictEqual(worker.code, 0, explain("worker.mjs", worker))
      assert.strictEqual(
        worker.stdout,
        [
          "chunk size: 64 tokens",
          "registered a paged KV cache: 2 layers, 16 blocks of 16 tokens, bfloat16",
          "stored 128 tokens from blocks 0-7: true",
          "lookup: 128 of 128 tokens hit",
          "retrieved 128 tokens into blocks 8-15: true",
          "verified 32768 bytes: all equal",
          ""
        ].join("\n")
      )
      // The worker said goodbye (UNREGISTER), then closed its socket: a departure in the server's log, not a suspect.
      yield* server.waitForStderr(/instance \d+ departed: it unregistered, then closed its connection/, 30_000)
      assert.notInclude(server.stderr(), "suspect")
    })), 120_000)

  it.live("importing mpcache/client loads no module of services/server or services/liveness", () =>
    Effect.gen(function*() {
      const client = yield* resolvedBy("mpcache/client")
      // The probe sees the package's own modules and its dependencies …
      assert.include(client, "mpcache/dist/src/client.js")
      assert.include(client, "mpcache/dist/src/services/client/WorkerAdapter.js")
      assert.isTrue(client.some((u) => u.startsWith("zeromq/")), "zeromq was not loaded")
      // … and none of the server's.
      assert.deepStrictEqual(client.filter((u) => /\/services\/(server|liveness)\//.test(u)), [])

      // The same probe on the server entry does see them, so the assertion above can fail.
      const server = yield* resolvedBy("mpcache/server")
      assert.isTrue(server.some((u) => u.includes("/services/server/MqServer.js")))
      assert.isTrue(server.some((u) => u.includes("/services/liveness/")))

      // The schema entry: codecs only, no services, no native code, no sockets.
      const schema = yield* resolvedBy("mpcache/schema")
      assert.include(schema, "mpcache/dist/src/schema/index.js")
      assert.deepStrictEqual(schema.filter((u) => /\/(services|native|layers)\/|^zeromq\//.test(u)), [])
    }), 60_000)

  it.live("the examples type-check (// @ts-check) against the published declarations", () =>
    Effect.gen(function*() {
      writeFileSync(
        join(project, "tsconfig.json"),
        JSON.stringify({
          compilerOptions: {
            target: "ES2023",
            lib: ["ES2024"],
            module: "NodeNext",
            moduleResolution: "NodeNext",
            types: ["node"],
            // @types/node comes with mpcache's dependencies (zeromq's types need it); this repo's as a fallback.
            typeRoots: [join(project, "node_modules", "@types"), join(ROOT, "node_modules", "@types")],
            strict: true,
            exactOptionalPropertyTypes: true,
            allowJs: true,
            checkJs: true,
            noEmit: true,
            // effect's own declarations name DOM types (JsonWebKey); mpcache's are checked through the examples' use.
            skipLibCheck: true
          },
          files: ["ping.mjs", "worker.mjs", "embed.mjs"]
        })
      )
      const t = Date.now()
      const tsc = yield* node([TSC, "-p", "tsconfig.json"], 180_000)
      timings["tsc (examples)"] = Date.now() - t
      assert.strictEqual(tsc.code, 0, explain("tsc", tsc))
    }), 200_000)
})
