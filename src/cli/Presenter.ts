/**
 * How `mpcache` answers an invalid invocation (issue 29 item 3): the error
 * first, one line per problem (the flag, the value, the rule), then one line
 * pointing at `--help` — not the command's whole help with the error at its
 * bottom (effect's default presenter printed 55 lines, then the error).
 * Help and version requests render as effect's default presenter does.
 */
import { Console } from "effect"
import { CliOutput } from "effect/cli"

/** The lines written to stderr for an invalid invocation of `commandPath` (e.g. ["mpcache", "serve"]). */
export const invalidInvocationLines = (
  commandPath: ReadonlyArray<string>,
  errors: ReadonlyArray<{ readonly message: string }>
): ReadonlyArray<string> => {
  const command = commandPath.join(" ")
  return [
    ...errors.flatMap((e) => e.message.split("\n").map((line) => `${command}: ${line}`)),
    `Run '${command} --help' for every flag, its default and its rule.`
  ]
}

/** The presenter of `mpcache` (provided in src/cli/main.ts). */
export const PresenterLive = CliOutput.layerPresenter({
  present: (event) =>
    event._tag === "InvalidInvocation"
      ? Console.error(invalidInvocationLines(event.commandPath, event.errors).join("\n"))
      : CliOutput.defaultPresenter.present(event)
})

