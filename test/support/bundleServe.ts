/**
 * vitest's global setup: (re)builds the bundled `mpcache serve` entry
 * (scripts/bundle-serve.mjs) when a source is newer, so the tests that start
 * `mpcache serve` (test/support/Cli.ts) run what src/ says, through the same
 * entry as `npm start`.
 */
import { bundleServe } from "../../scripts/bundle-serve.mjs"

export default async function setup(): Promise<void> {
  await bundleServe()
}
