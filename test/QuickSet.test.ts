/**
 * `npm run test:quick` starts no process (issue 26 item 3): the files
 * vitest.quick.config.ts selects never load, through any chain of relative
 * imports, a module that starts one; and each file it leaves out by name
 * (PROCESS_FILES) does load one, so the list holds what the code says, both
 * ways. The scanner (test/support/ImportClosure.ts) is checked first on files
 * written here, so a scanner that sees nothing cannot pass the rest.
 */
import { globSync, mkdtempSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import path from "node:path"
import { fileURLToPath } from "node:url"
import { assert, describe, it } from "@effect/vitest"
import quick, { PROCESS_FILES, QUICK_EXCLUDE, QUICK_INCLUDE } from "../vitest.quick.config.ts"
import { loadsOf, processLoads, type ProcessLoad } from "./support/ImportClosure.ts"

const ROOT = fileURLToPath(new URL("..", import.meta.url))

/** The quick set, as vitest.quick.config.ts's globs give it (repository-relative, sorted). */
const quickSet = (): ReadonlyArray<string> =>
  globSync([...QUICK_INCLUDE], { cwd: ROOT })
    .map((f) => f.split(path.sep).join("/"))
    .filter((f) => !QUICK_EXCLUDE.some((g) => path.matchesGlob(f, g)))
    .sort()

const describeLoad = (file: string, l: ProcessLoad): string =>
  `${file}: ${[...l.via.slice(1), l.specifier].join(" → ")} (${l.reason})`

describe("the quick set (issue 26 item 3)", () => {
  it("the scanner reads run-time imports and only those", () => {
    const dir = mkdtempSync(path.join(tmpdir(), "mpcache-quickset-"))
    try {
      writeFileSync(
        path.join(dir, "a.ts"),
        [
          `import type { ChildProcess } from "node:child_process"`,
          `// import { spawn } from "node:child_process"`,
          `const s = 'import { fork } from "node:cluster"'`,
          `import { type ChildProcess as C, readFileSync } from "node:fs"`,
          `export { b } from "./b.ts"`,
          `const late = () => import("playwright-core")`
        ].join("\n")
      )
      writeFileSync(path.join(dir, "b.ts"), `import { NodeChildProcessSpawner } from "@effect/platform-node"\nexport const b = 1\n`)
      assert.deepStrictEqual(loadsOf(path.join(dir, "a.ts")), [
        { specifier: "node:fs", names: ["readFileSync"] },
        { specifier: "./b.ts", names: [] },
        { specifier: "playwright-core", names: [] }
      ])
      assert.deepStrictEqual(processLoads(dir, "a.ts"), [
        { via: ["a.ts"], specifier: "playwright-core", reason: "playwright starts a browser" },
        {
          via: ["a.ts", "b.ts"],
          specifier: "@effect/platform-node",
          reason: "NodeChildProcessSpawner (from @effect/platform-node) starts child processes"
        }
      ])
      writeFileSync(path.join(dir, "c.ts"), `import "./missing.ts"\n`)
      assert.throws(() => processLoads(dir, "c.ts"), /c\.ts imports \.\/missing\.ts, which names no file/)
    } finally {
      rmSync(dir, { recursive: true, force: true })
    }
  })

  it("the scanner finds the process a child-process test starts, through test/support", () => {
    assert.deepStrictEqual(
      processLoads(ROOT, "test/e2e/cli.test.ts").map((l) => [l.via.at(-1), l.specifier]),
      [["test/support/Cli.ts", "node:child_process"]]
    )
  })

  it("vitest.quick.config.ts runs these globs, without the bundling global setup", () => {
    assert.deepStrictEqual(quick.test?.include, [...QUICK_INCLUDE])
    assert.includeMembers([...(quick.test?.exclude ?? [])], [...QUICK_EXCLUDE])
    assert.deepStrictEqual(quick.test?.globalSetup, [])
    assert.includeMembers([...quickSet()], ["test/QuickSet.test.ts", "test/Layout.test.ts", "test/schema/Frame.test.ts"])
    assert.deepStrictEqual(quickSet().filter((f) => f.startsWith("test/e2e/")), [])
  })

  it("no file in the quick set loads a module that starts a process", () => {
    const offenders = quickSet().flatMap((f) => processLoads(ROOT, f).map((l) => describeLoad(f, l)))
    assert.deepStrictEqual(
      offenders,
      [],
      "these start a process: add each file to PROCESS_FILES in vitest.quick.config.ts (saying what it starts), or start nothing"
    )
  })

  it("each file PROCESS_FILES names exists and does start a process (else it belongs in the quick loop)", () => {
    const idle = Object.keys(PROCESS_FILES).filter((f) => processLoads(ROOT, f).length === 0)
    assert.deepStrictEqual(idle, [], "these start no process: remove them from PROCESS_FILES")
  })
})
