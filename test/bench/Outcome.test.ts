/**
 * How a bench ends (bench/lib/outcome.ts, issue 29 item 6): the report is
 * rewritten only with `--write-docs`, never for a partial run, and `--check`
 * turns a missed target into exit status 1. The report's path is the test's
 * own (`doc`), so docs/benchmarks.md is never touched here.
 */
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import path from "node:path"
import { afterEach, assert, beforeEach, describe, it } from "@effect/vitest"
import { finishBench, missedLines, missedTargets, verdict } from "../../bench/lib/outcome.ts"
import type { SummaryRow } from "../../bench/lib/summary.ts"

const row = (figure: string, met: boolean | null, ratio: number | null = null): SummaryRow => ({
  bench: "b",
  figure,
  measured: "3 ms",
  reference: ratio === null ? "—" : "10 ms",
  ratio,
  target: "≤ 0.25×",
  met
})
const MET = row("met", true, 0.1)
const MISSED = row("missed", false, 0.3)
const REPORTED = row("reported", null)

let dir = ""
beforeEach(() => {
  dir = mkdtempSync(path.join(tmpdir(), "mpcache-outcome-"))
})
afterEach(() => rmSync(dir, { recursive: true, force: true }))

const run = (flags: Parameters<typeof finishBench>[0], outcome: Parameters<typeof finishBench>[1]) => {
  const lines: Array<string> = []
  const code = finishBench(flags, outcome, (line) => void lines.push(line))
  return { code, lines }
}

describe("a bench's end (issue 29 item 6)", () => {
  it("a row is missed only when its target was not met; a reported row never is", () => {
    assert.deepStrictEqual(missedTargets([MET, MISSED, REPORTED]), [MISSED])
    assert.deepStrictEqual(missedLines([MET, MISSED, REPORTED]), [
      "target missed: b: missed: 3 ms against 10 ms = 0.30× (target ≤ 0.25×)"
    ])
    assert.deepStrictEqual(missedLines([row("absolute", false)]), ["target missed: b: absolute: 3 ms (target ≤ 0.25×)"])
  })

  it("without --check a missed target is printed and exits 0; with it, 1; all met or nothing to meet, 0", () => {
    const out: Array<string> = []
    assert.strictEqual(verdict({}, [MET, MISSED], (l) => void out.push(l)), 0)
    assert.strictEqual(verdict({ check: true }, [MET, MISSED], (l) => void out.push(l)), 1)
    assert.strictEqual(verdict({ check: true }, [MET, REPORTED], (l) => void out.push(l)), 0)
    assert.strictEqual(verdict({ check: true }, [], (l) => void out.push(l)), 0)
    assert.deepStrictEqual(out, [
      "target missed: b: missed: 3 ms against 10 ms = 0.30× (target ≤ 0.25×)",
      "target missed: b: missed: 3 ms against 10 ms = 0.30× (target ≤ 0.25×)",
      "--check: 1 target(s) missed: exit status 1",
      "--check: every target met (1 rows)",
      "--check: every target met (0 rows)"
    ])
  })

  it("without --write-docs the report is left as it was; the summary rows are written all the same", () => {
    const doc = path.join(dir, "benchmarks.md")
    writeFileSync(doc, "# mine\n")
    const summary = path.join(dir, "rows.json")
    const { code, lines } = run({ doc, summary }, { heading: "## X (bench:x)", body: "## X (bench:x)\n\nfigures\n", rows: [MET] })
    assert.strictEqual(code, 0)
    assert.strictEqual(readFileSync(doc, "utf8"), "# mine\n")
    assert.deepStrictEqual(JSON.parse(readFileSync(summary, "utf8")), [MET])
    assert.deepStrictEqual(lines, ["\n## X (bench:x)\n\nfigures\n", `${doc} left as it was (--write-docs rewrites its section "X (bench:x)")`])
  })

  it("--write-docs adds the section, then replaces it in place and keeps every other one", () => {
    const doc = path.join(dir, "benchmarks.md")
    const first = run({ "write-docs": true, doc }, { heading: "## A", body: "## A\n\none\n", rows: [] })
    run({ "write-docs": true, doc }, { heading: "## B", body: "## B\n\ntwo\n", rows: [] })
    run({ "write-docs": true, doc }, { heading: "## A", body: "## A\n\nthree\n", rows: [] })
    assert.deepStrictEqual(first.lines.slice(1), [`wrote ${doc}`])
    assert.strictEqual(
      readFileSync(doc, "utf8"),
      "# mpcache benchmarks\n\nThese machines are shared, so absolute figures vary from run to run: read the ratios against\n" +
        "a reference measured in the same run.\n\n## A\n\nthree\n\n## B\n\ntwo\n"
    )
  })

  it("a partial run writes nothing even with --write-docs, and --check still judges its rows", () => {
    const doc = path.join(dir, "benchmarks.md")
    const { code, lines } = run(
      { "write-docs": true, check: true, doc },
      { heading: "## L", body: "## L\n", rows: [MISSED], partial: "only part(s) 2 ran" }
    )
    assert.strictEqual(code, 1)
    assert.isFalse(existsSync(doc))
    assert.deepStrictEqual(lines.slice(1), [
      `${doc} left as it was: only part(s) 2 ran`,
      "target missed: b: missed: 3 ms against 10 ms = 0.30× (target ≤ 0.25×)",
      "--check: 1 target(s) missed: exit status 1"
    ])
  })
})
