/**
 * Command-line flags every bench shares: `--quick` / `--full` (which
 * exclude each other), `--summary FILE` (bench/lib/summary.ts),
 * `--write-docs [--doc FILE]` and `--check` (bench/lib/outcome.ts), beside
 * the bench's own options. A bad flag prints why to stderr and exits 2.
 */
import { parseArgs, type ParseArgsOptionsConfig } from "node:util"

const COMMON = {
  quick: { type: "boolean", default: false },
  full: { type: "boolean", default: false },
  summary: { type: "string" },
  /** Rewrite the bench's section of docs/benchmarks.md (and the suite: the README's table); off, a run changes no tracked file. */
  "write-docs": { type: "boolean", default: false },
  /** The report `--write-docs` rewrites, instead of docs/benchmarks.md (tests). */
  doc: { type: "string" },
  /** Exit 1 when a target is missed (bench/lib/outcome.ts). */
  check: { type: "boolean", default: false }
} as const satisfies ParseArgsOptionsConfig

/** Prints `message` to stderr and exits 2 (a usage error, as the benches report them). */
export const usageError = (message: string): never => {
  process.stderr.write(`${message}\n`)
  process.exit(2)
}

/**
 * Parses `process.argv` with the common flags and `options` (strict: an
 * unknown flag throws). Exits 2 when both `--quick` and `--full` are given.
 */
export const parseBenchArgs = <const O extends ParseArgsOptionsConfig>(options: O) => {
  const { values } = parseArgs({ options: { ...COMMON, ...options } })
  // The generic result does not resolve here; the common flags are there whatever `options` holds.
  const common = values as { readonly quick?: boolean; readonly full?: boolean }
  if (common.quick === true && common.full === true) usageError("--quick and --full exclude each other")
  return values
}

/** `text` as a positive number of seconds; exits 2 naming `flag` when it is not one. */
export const positiveSeconds = (flag: string, text: string): number => {
  const n = Number(text)
  return Number.isFinite(n) && n > 0 ? n : usageError(`${flag} must be a positive number of seconds, got ${text}`)
}
