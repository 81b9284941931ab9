#!/usr/bin/env node
/**
 * Prints where a test run's time went (issue 26 item 4): the N slowest test
 * files (default 10) and the totals, from the file scripts/test-times/reporter.ts
 * wrote. .ci/run calls it after `npm test`, so a regression shows in the next run.
 *
 * Use: `node scripts/test-times/print.ts [times.json] [--top N]`; the file
 * defaults to `$MPCACHE_TEST_TIMES` or build/test-times.json. Exits 1 (saying
 * why) when the file is missing or not a times file.
 */
import { readFileSync } from "node:fs"
import path from "node:path"
import { fileURLToPath } from "node:url"
import { formatTimes } from "./format.ts"
import { timesFilePath, type TimesFile } from "./TimesFile.ts"

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..", "..")

const args = process.argv.slice(2)
const topAt = args.indexOf("--top")
const top = topAt === -1 ? 10 : Number(args[topAt + 1])
const positional = topAt === -1 ? args : args.filter((_, i) => i !== topAt && i !== topAt + 1)
const file = positional[0] ?? timesFilePath(ROOT)

if (!Number.isInteger(top) || top < 1) {
  console.error(`test-times: --top takes a whole number of files ≥ 1, got ${String(args[topAt + 1])}`)
  process.exit(1)
}
let times: TimesFile
try {
  times = JSON.parse(readFileSync(file, "utf8")) as TimesFile
} catch (e) {
  console.error(`test-times: cannot read ${file} (${e instanceof Error ? e.message : String(e)}); it is written by --reporter=./scripts/test-times/reporter.ts`)
  process.exit(1)
}
if (!Array.isArray(times.files) || typeof times.wallMs !== "number") {
  console.error(`test-times: ${file} is not a times file (expected { wallMs, files: [...] })`)
  process.exit(1)
}
console.log(formatTimes(times, top))
