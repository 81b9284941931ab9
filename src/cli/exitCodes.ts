/**
 * Exit statuses of `mpcache` (DESIGN §5, §7):
 * 0 success, and after SIGINT/SIGTERM once the finalizers ran (effect's
 * default is 130, which orchestrators read as a crash); 1 a command failed;
 * 2 a flag is invalid (it names the flag and the rule).
 */
import { Cause, Exit, Runtime } from "effect"
import { CliError } from "effect/cli"

/** The exit status for a finished CLI run. */
export const exitCodeOf = <A, E>(exit: Exit.Exit<A, E>): number => {
  if (Exit.isSuccess(exit)) return 0
  if (Cause.hasInterruptsOnly(exit.cause)) return 0
  const error = Cause.squash(exit.cause)
  if (error instanceof CliError.ShowHelp) return error.errors.length > 0 ? 2 : 0
  if (CliError.isCliError(error)) return 2
  return Runtime.getErrorExitCode(error)
}

/** runMain teardown applying {@link exitCodeOf}. */
export const teardown: Runtime.Teardown = (exit, onExit) => onExit(exitCodeOf(exit))
