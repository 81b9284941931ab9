/**
 * The table scripts/test-times/print.ts prints (issue 26 item 4): the `top`
 * slowest files by `totalMs`, then the totals. Seconds with one decimal.
 */
import type { FileTimes, TimesFile } from "./TimesFile.ts"

const seconds = (ms: number): string => (ms / 1000).toFixed(1)

const row = (cells: ReadonlyArray<string>, widths: ReadonlyArray<number>): string =>
  cells.map((c, i) => (i === cells.length - 1 ? c : c.padStart(widths[i] ?? 0))).join("  ")

/** The slowest `top` files of `times` (ties by path, so the order is stable), as lines of text. */
export const formatTimes = (times: TimesFile, top: number): string => {
  const files = [...times.files].sort((a, b) => b.totalMs - a.totalMs || a.file.localeCompare(b.file))
  const slowest: ReadonlyArray<FileTimes> = files.slice(0, top)
  const header = ["#", "total s", "run s", "import s", "tests", "file"]
  const body = slowest.map((f, i) => [
    String(i + 1),
    seconds(f.totalMs),
    seconds(f.runMs),
    seconds(f.importMs),
    String(f.tests),
    f.state === "failed" ? `${f.file}  (FAILED: ${f.failed} test${f.failed === 1 ? "" : "s"})` : f.file
  ])
  const widths = header.map((h, i) => Math.max(h.length, ...body.map((r) => (r[i] ?? "").length)))
  const tests = files.reduce((n, f) => n + f.tests, 0)
  const sumMs = files.reduce((n, f) => n + f.totalMs, 0)
  const load = times.loadAverage.length === 0 ? "" : `, load average at the end ${times.loadAverage.join(" ")}`
  return [
    `The ${slowest.length} slowest of ${files.length} test files (${tests} test${tests === 1 ? "" : "s"}):`,
    row(header, widths),
    ...body.map((r) => row(r, widths)),
    `Total: vitest ran ${seconds(times.wallMs)} s wall (type check not included); the files' own times sum to ${seconds(sumMs)} s (they run side by side)${load}.`
  ].join("\n")
}
