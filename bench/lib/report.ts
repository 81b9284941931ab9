/**
 * The benchmark report: docs/benchmarks.md, where each bench owns one "## "
 * section, and the README's Performance table between its bench-summary
 * markers (written by the suite only).
 */
import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs"
import path from "node:path"
import { ROOT } from "./root.ts"

/** Where the report lives. */
export const DOC = path.join(ROOT, "docs", "benchmarks.md")

/** The report's path relative to the repository root, as the benches print it ("wrote docs/benchmarks.md"). */
export const DOC_NAME = path.relative(ROOT, DOC)

const README = path.join(ROOT, "README.md")
const README_BEGIN = "<!-- bench-summary:begin (written by npm run bench) -->"
const README_END = "<!-- bench-summary:end -->"

const HEADER =
  "# mpcache benchmarks\n\n" +
  "These machines are shared, so absolute figures vary from run to run: read the ratios against\n" +
  "a reference measured in the same run.\n"

/**
 * Replaces the section that starts with the line `heading` (up to the next
 * "## " heading) with `body`, or adds it: at the end, or with `first` right
 * after the header (the suite's summary); every other section is kept.
 * `doc` is the report's path (docs/benchmarks.md unless a test names its own).
 * Called only with `--write-docs` (bench/lib/outcome.ts).
 */
export const writeDocSection = (
  heading: string,
  body: string,
  options: { readonly first?: boolean; readonly doc?: string } = {}
): void => {
  const doc = options.doc ?? DOC
  const current = existsSync(doc) ? readFileSync(doc, "utf8") : HEADER
  const lines = current.split("\n")
  const start = lines.findIndex((line) => line.trim() === heading)
  let next: string
  if (start === -1 && options.first === true) {
    const firstSection = lines.findIndex((line) => line.startsWith("## "))
    next = firstSection === -1
      ? `${current.trimEnd()}\n\n${body}`
      : `${lines.slice(0, firstSection).join("\n").trimEnd()}\n\n${body.trimEnd()}\n\n${lines.slice(firstSection).join("\n")}`
  } else if (start === -1) {
    next = `${current.trimEnd()}\n\n${body}`
  } else {
    const after = lines.findIndex((line, i) => i > start && line.startsWith("## "))
    const before = lines.slice(0, start).join("\n").trimEnd()
    const rest = after === -1 ? "" : `\n${lines.slice(after).join("\n")}`
    next = `${before}\n\n${body}${rest}`
  }
  mkdirSync(path.dirname(doc), { recursive: true })
  writeFileSync(doc, next.endsWith("\n") ? next : `${next}\n`)
}

/**
 * Replaces what stands between the README's bench-summary markers with
 * `head`, a blank line and `body`. Returns false, writing nothing, when the
 * markers are missing or out of order. The suite calls it only with `--write-docs`.
 */
export const writeReadmeSummary = (head: string, body: string): boolean => {
  const text = readFileSync(README, "utf8")
  const begin = text.indexOf(README_BEGIN)
  const end = text.indexOf(README_END)
  if (begin === -1 || end < begin) return false
  writeFileSync(README, `${text.slice(0, begin + README_BEGIN.length)}\n${head}\n\n${body}\n${text.slice(end)}`)
  return true
}
