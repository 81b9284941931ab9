/** The benchmark report, docs/benchmarks.md: each bench owns one "## " section of it. */
import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs"
import path from "node:path"

/** Where the report lives. */
export const DOC = path.join(path.resolve(import.meta.dirname, ".."), "docs", "benchmarks.md")

const HEADER =
  "# mpcache benchmarks\n\n" +
  "These machines are shared, so absolute figures vary from run to run: read the ratios against\n" +
  "a reference measured in the same run.\n"

/**
 * Replaces the section that starts with the line `heading` (up to the next
 * "## " heading) with `body`, or adds it: at the end, or with `first` right
 * after the header (the suite's summary); every other section is kept.
 */
export const writeDocSection = (heading: string, body: string, options: { readonly first?: boolean } = {}): void => {
  const current = existsSync(DOC) ? readFileSync(DOC, "utf8") : HEADER
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
  mkdirSync(path.dirname(DOC), { recursive: true })
  writeFileSync(DOC, next.endsWith("\n") ? next : `${next}\n`)
}
