/**
 * What a broken rule of `mpcache serve`'s configuration is (DESIGN §5, §7):
 * one {@link ConfigIssue} per rule, naming its flag; {@link ConfigInvalid}
 * when there are any (the CLI exits 2 printing each with
 * {@link formatIssue}); and the rules several features share. Each feature's
 * module under `config/` pushes its issues with {@link issueCheck}.
 */
import { Schema } from "effect"

/** One broken rule: the flag and what it must be. */
export interface ConfigIssue {
  readonly flag: string
  readonly message: string
}

/** A configuration broke one or more rules. */
export class ConfigInvalid extends Schema.TaggedError<ConfigInvalid>()("ConfigInvalid", {
  issues: Schema.Array(Schema.Struct({ flag: Schema.String, message: Schema.String }))
}) {
  override get message(): string {
    return this.issues.map(formatIssue).join("\n")
  }
}

/** Renders an issue as the CLI prints it. */
export const formatIssue = (issue: ConfigIssue): string => `--${issue.flag}: ${issue.message}`

/** `check(flag, problem)`: pushes `{ flag, message: problem }` onto `issues` when a rule returned a problem. */
export const issueCheck = (issues: Array<ConfigIssue>) => (flag: string, problem: string | undefined): void => {
  if (problem !== undefined) issues.push({ flag, message: problem })
}

/** Rules of no one feature: a count of at least 1, a file path. Each returns the problem, or undefined. */
export const commonRules = {
  positiveInt: (n: number) => Number.isSafeInteger(n) && n >= 1 ? undefined : `must be an integer of at least 1 (got ${n})`,
  path: (s: string) => s.length > 0 ? undefined : "must be a file path"
} as const
