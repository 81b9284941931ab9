/**
 * A CLI command failed for a reason already printed to stderr: exit status 1
 * (reference §7: each client command exits 1 on failure), no stack trace.
 */
import { Runtime, Schema } from "effect"

export class CommandFailed extends Schema.TaggedError<CommandFailed>()("CommandFailed", {
  message: Schema.String,
  exitCode: Schema.Number
}) {
  override get [Runtime.errorExitCode](): number {
    return this.exitCode
  }
  /** Already printed: runMain must not log it again (the marker means "report this"). */
  override get [Runtime.errorReported](): boolean {
    return false
  }
}
