/**
 * Structured logs (`--log-format json|pretty`), always on stderr so that a
 * command's stdout carries only its result. Annotations (op, peer,
 * instance_id) come from the code that logs.
 */
import { Layer, Logger } from "effect"
import type { LogFormat } from "../services/server/ServerConfig.ts"

/** The logger for `format`: one JSON object per line, or human-readable lines. */
export const loggerLayer = (format: LogFormat): Layer.Layer<never> =>
  Layer.mergeAll(
    Logger.layer([
      format === "json" ? Logger.withConsoleError(Logger.formatJson) : Logger.consolePretty({ colors: false })
    ]),
    Layer.succeed(Logger.LogToStderr, true)
  )
