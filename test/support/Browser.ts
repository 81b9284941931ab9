/**
 * Headless Chromium for the tests that look at a page (Debian's `chromium`,
 * driven by playwright-core; `MPCACHE_CHROMIUM` names another binary), and
 * the folder their screenshots go to: `test-output/screenshots/<name>/`
 * under the repository (ignored by git), emptied at the start of each run,
 * so the pictures of the last run are there to look at.
 */
import { existsSync, mkdirSync, mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import path from "node:path"
import { fileURLToPath } from "node:url"
import { Effect } from "effect"
import { chromium, type BrowserContext } from "playwright-core"

/** The browser binary. */
export const CHROMIUM = process.env["MPCACHE_CHROMIUM"] ?? "/usr/bin/chromium"
/** Whether it is installed: a test that needs it is skipped, loudly ({@link warnWithoutChromium}), when not. */
export const hasChromium = existsSync(CHROMIUM)
/** Why a browser test was skipped, and how to run it. */
export const NO_CHROMIUM =
  `SKIPPED: no Chromium at ${CHROMIUM}; install it with \`apt-get update && apt-get install -y chromium\` (.ci/run does) or set MPCACHE_CHROMIUM`

/** Says on the process's stderr (the config silences passing files' console) that `file`'s browser tests are skipped. */
export const warnWithoutChromium = (file: string): void => {
  if (hasChromium) return
  process.stderr.write(`\n*** ${file}: the browser tests are ${NO_CHROMIUM} ***\n\n`)
  console.warn(`${file}: the browser tests are ${NO_CHROMIUM}`)
}

const SCREENSHOTS = fileURLToPath(new URL("../../test-output/screenshots/", import.meta.url))

/** `test-output/screenshots/<name>/`, emptied and created: where one test file's screenshots go. */
export const screenshotDir = (name: string): string => {
  const dir = path.join(SCREENSHOTS, name)
  rmSync(dir, { recursive: true, force: true })
  mkdirSync(dir, { recursive: true })
  return dir
}

/**
 * Headless Chromium with a fresh profile in a temporary folder (`viewport` default 1280 × 900); the browser
 * is closed and the profile removed with the scope.
 */
export const browserIn = (viewport: { readonly width: number; readonly height: number } = { width: 1280, height: 900 }) =>
  Effect.acquireRelease(
    Effect.promise(async () => {
      const profile = mkdtempSync(path.join(tmpdir(), "mpcache-chromium-"))
      const context = await chromium.launchPersistentContext(profile, {
        executablePath: CHROMIUM,
        headless: true,
        args: [
          "--headless",
          "--no-sandbox",
          "--disable-gpu",
          "--disable-quic",
          "--no-first-run",
          "--disable-background-networking",
          "--disable-component-update",
          "--disable-sync"
        ],
        viewport
      })
      return { context, profile }
    }),
    ({ context, profile }) => Effect.promise(() => context.close().finally(() => rmSync(profile, { recursive: true, force: true })))
  ).pipe(Effect.map(({ context }): BrowserContext => context))
