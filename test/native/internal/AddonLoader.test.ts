/**
 * The addon's loader (src/native/internal/AddonLoader.ts): where the built
 * addon is, found from the package's root whichever form the code runs in,
 * and one load per process.
 */
import { assert, describe, it } from "@effect/vitest"
import { existsSync } from "node:fs"
import path from "node:path"
import { fileURLToPath } from "node:url"
import { addonPath, loadNativeAddon } from "../../../src/native/internal/AddonLoader.ts"

const ROOT = fileURLToPath(new URL("../../../", import.meta.url))

describe("addonPath", () => {
  it("is node-gyp's Release build under the package root, and it is built", () => {
    assert.strictEqual(addonPath, path.join(ROOT, "src", "native", "addon", "build", "Release", "mpcache_native.node"))
    assert.isTrue(existsSync(addonPath))
  })
})

describe("loadNativeAddon", () => {
  it("loads the addon once: every call returns the same exports", () => {
    const addon = loadNativeAddon()
    assert.strictEqual(loadNativeAddon(), addon)
    assert.strictEqual(typeof addon.openMapping, "function")
    assert.strictEqual(typeof addon.copyBatch, "function")
  })
})
