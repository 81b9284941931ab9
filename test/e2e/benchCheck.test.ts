/**
 * A real bench, run as a child process, leaves the tracked report alone
 * unless asked and exits by its verdict with `--check` (issue 29 item 6):
 * bench:hmac, the cheapest (one MAC of 2 MiB per round). Its target is
 * judged on the figures of the run, so the test does not predict it: it
 * holds the exit status to the verdict the bench printed and wrote.
 */
import { createHash } from "node:crypto"
import { mkdtempSync, readFileSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import path from "node:path"
import { fileURLToPath } from "node:url"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import type { SummaryRow } from "../../bench/lib/summary.ts"
import { runNodeArgv } from "../support/Cli.ts"

const ROOT = fileURLToPath(new URL("../..", import.meta.url))
const HMAC = path.join(ROOT, "bench", "hmac", "hmac.ts")
const TRACKED = ["README.md", path.join("docs", "benchmarks.md")]
const HEADING = "## L2 MAC off the event loop (bench:hmac)"
const QUICK = ["--quick", "--values", "1", "--mib", "2"]

const hashes = (): Array<string> => TRACKED.map((f) => createHash("sha256").update(readFileSync(path.join(ROOT, f))).digest("hex"))

describe("bench:hmac as a child process (issue 29 item 6)", () => {
  it.effect("without --write-docs no tracked file changes; with --check the exit status is the verdict; --write-docs writes the named report", () =>
    Effect.gen(function*() {
      const dir = mkdtempSync(path.join(tmpdir(), "mpcache-benchcheck-"))
      yield* Effect.addFinalizer(() => Effect.sync(() => rmSync(dir, { recursive: true, force: true })))
      const before = hashes()
      const summary = path.join(dir, "rows.json")
      const checked = yield* runNodeArgv([HMAC, ...QUICK, "--check", "--summary", summary], 120_000)
      assert.deepStrictEqual(hashes(), before)
      const rows = JSON.parse(readFileSync(summary, "utf8")) as Array<SummaryRow>
      assert.strictEqual(rows.length, 1)
      const missed = rows[0]!.met === false
      assert.strictEqual(checked.code, missed ? 1 : 0, checked.stdout + checked.stderr)
      assert.include(checked.stdout, `docs/benchmarks.md left as it was (--write-docs rewrites its section "L2 MAC off the event loop (bench:hmac)")`)
      assert.include(checked.stdout, missed ? "--check: 1 target(s) missed: exit status 1" : "--check: every target met (1 rows)")
      assert.strictEqual(checked.stdout.includes("target missed: hmac: "), missed)

      const doc = path.join(dir, "benchmarks.md")
      const written = yield* runNodeArgv([HMAC, ...QUICK, "--write-docs", "--doc", doc], 120_000)
      assert.strictEqual(written.code, 0, written.stdout + written.stderr)
      assert.deepStrictEqual(hashes(), before)
      assert.include(written.stdout, `wrote ${doc}`)
      const report = readFileSync(doc, "utf8")
      assert.match(report, /^# mpcache benchmarks\n/)
      assert.include(report, `\n${HEADING}\n\n\`npm run bench:hmac\`: 1 MAC of 2 MiB started at once, 3 rounds`)
      assert.match(report, /\nnative {7}max event-loop delay: median \d+\.\d ms/)
    }).pipe(Effect.scoped), 240_000)
})
