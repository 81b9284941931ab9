/**
 * The layering of DESIGN §2, checked on the import statements of every file
 * under src: dependencies point one way (cli/replay → layers → services →
 * schema, native); services never import src/layers; nothing a client
 * program loads imports the server's modules.
 */
import { readdirSync, readFileSync } from "node:fs"
import path from "node:path"
import { fileURLToPath } from "node:url"
import { assert, describe, it } from "@effect/vitest"

const SRC = fileURLToPath(new URL("../src", import.meta.url))

/** Every .ts file under src, as a path relative to src with forward slashes. */
const files = (dir: string): ReadonlyArray<string> =>
  readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    const full = path.join(dir, e.name)
    if (e.isDirectory()) return e.name === "addon" ? [] : files(full)
    return e.name.endsWith(".ts") ? [path.relative(SRC, full).split(path.sep).join("/")] : []
  })

/** `from "…"`, `import "…"` and `import("…")` specifiers that are relative. */
const IMPORT = /(?:\bfrom\s+|\bimport\s*\(\s*|^\s*import\s+)["'](\.{1,2}\/[^"']+)["']/gm

/** Each file's relative imports, resolved to paths relative to src ("../x" outside src stays as it resolves). */
const edges: ReadonlyArray<{ readonly from: string; readonly to: string }> = files(SRC).flatMap((from) => {
  const text = readFileSync(path.join(SRC, from), "utf8")
  return [...text.matchAll(IMPORT)].map((m) => ({
    from,
    to: path.posix.normalize(path.posix.join(path.posix.dirname(from), m[1]!))
  }))
})

const under = (p: string, ...dirs: ReadonlyArray<string>) => dirs.some((d) => p.startsWith(`${d}/`))

/** The imports from files under `fromDirs` into files under `toDirs`, as "from → to" lines. */
const crossing = (fromDirs: ReadonlyArray<string>, toDirs: ReadonlyArray<string>) =>
  edges.filter((e) => under(e.from, ...fromDirs) && under(e.to, ...toDirs)).map((e) => `${e.from} → ${e.to}`)

describe("layout (DESIGN §2)", () => {
  it("reads the imports of every room", () => {
    for (const room of ["schema", "native", "services/liveness", "services/server", "services/client", "layers", "cli", "replay"]) {
      assert.isTrue(edges.some((e) => under(e.from, room)), `no import found under src/${room}: the scanner is broken`)
    }
  })

  it("no file under src/services imports src/layers, src/cli or src/replay", () => {
    assert.deepStrictEqual(crossing(["services"], ["layers", "cli", "replay"]), [])
  })

  it("nothing under src/services/client, src/services/kv, src/services/zmq or src/schema imports the server's or liveness' modules", () => {
    assert.deepStrictEqual(
      crossing(["services/client", "services/kv", "services/zmq", "schema"], ["services/server", "services/liveness"]),
      []
    )
  })

  it("src/schema imports only src/schema; src/native only src/native and src/schema", () => {
    assert.deepStrictEqual(edges.filter((e) => under(e.from, "schema") && !under(e.to, "schema")).map((e) => e.to), [])
    assert.deepStrictEqual(
      edges.filter((e) => under(e.from, "native") && !under(e.to, "native", "schema")).map((e) => e.to),
      []
    )
  })

  it("src/layers never imports src/cli or src/replay", () => {
    assert.deepStrictEqual(crossing(["layers"], ["cli", "replay"]), [])
  })

  it("src/services/metrics imports no other module of src (liveness, the server and auth all declare their series there)", () => {
    assert.isTrue(edges.some((e) => under(e.to, "services/metrics")), "nothing imports src/services/metrics: the scanner is broken")
    assert.deepStrictEqual(edges.filter((e) => under(e.from, "services/metrics")).map((e) => `${e.from} → ${e.to}`), [])
  })

  it("liveness does not import the server's modules", () => {
    assert.deepStrictEqual(crossing(["services/liveness"], ["services/server"]), [])
  })
})
