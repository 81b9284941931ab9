/**
 * Command-line flags every bench shares: `--quick` / `--full` (which
 * exclude each other) and `--summary FILE` (bench/lib/summary.ts), beside
 * the bench's own options. A bad flag prints why to stderr and exits 2.
 */
import { parseArgs, type ParseArgsOptionsConfig } from "node:util"

const COMMON = {
  quick: { type: "boolean", default: false },
  full: { type: "boolean", default: false },
  summary: { type: "string" }
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
