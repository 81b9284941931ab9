/**
 * src/PackageFiles.ts: the package root and the child entries of the form that runs. From the sources (as here)
 * the entries are the TypeScript files themselves; the bundled form's are exercised by every e2e replay (the CLI
 * the tests start is build/cli/bin/mpcache.mjs, whose replay forks build/cli/bin/replay-worker.mjs).
 */
import { existsSync } from "node:fs"
import path from "node:path"
import { fileURLToPath } from "node:url"
import { assert, describe, it } from "@effect/vitest"
import { entryPath, packageForm, packageRoot } from "../src/PackageFiles.ts"

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..")

describe("PackageFiles", () => {
  it("from the sources: the root is the checkout, the entries are the .ts files, and they exist", () => {
    assert.strictEqual(packageForm, "source")
    assert.strictEqual(packageRoot, ROOT)
    assert.strictEqual(entryPath("cli"), path.join(ROOT, "src", "cli", "main.ts"))
    assert.strictEqual(entryPath("replayWorker"), path.join(ROOT, "src", "replay", "WorkerProcess.ts"))
    assert.isTrue(existsSync(entryPath("cli")) && existsSync(entryPath("replayWorker")))
  })
})
