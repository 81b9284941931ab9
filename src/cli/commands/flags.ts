/**
 * Flags shared by several commands: where the server is (`--host`/`--port`
 * or `--endpoint`, as for `serve`), where its HTTP frontend is, the request
 * timeout, and the log format.
 */
import { Option } from "effect"
import { Flag } from "effect/cli"
import { defaults, rules, type LogFormat } from "../../services/server/ServerConfig.ts"

const checked = <A>(flag: Flag.Flag<A>, rule: (a: A) => string | undefined): Flag.Flag<A> =>
  flag.pipe(Flag.filter((a) => rule(a) === undefined, (a) => rule(a) ?? ""))

export const host = checked(
  Flag.String("host").pipe(Flag.withDescription("Address the ZeroMQ endpoint binds or connects to"), Flag.withDefault(defaults.host)),
  rules.host
)
export const port = checked(
  Flag.Int("port").pipe(Flag.withDescription("TCP port of the ZeroMQ endpoint"), Flag.withDefault(defaults.port)),
  rules.port
)
export const endpoint = Flag.String("endpoint").pipe(
  Flag.withDescription("Any ZeroMQ endpoint (tcp://HOST:PORT or ipc://PATH); overrides --host/--port"),
  Flag.filter((s) => rules.endpoint(s) === undefined, (s) => rules.endpoint(s) ?? ""),
  Flag.optional
)
export const httpHost = checked(
  Flag.String("http-host").pipe(Flag.withDescription("Address of the HTTP frontend"), Flag.withDefault(defaults.httpHost)),
  rules.host
)
export const httpPort = checked(
  Flag.Int("http-port").pipe(Flag.withDescription("Port of the HTTP frontend (0 picks a free one)"), Flag.withDefault(defaults.httpPort)),
  rules.httpPort
)
export const logFormat = Flag.Literals("log-format", ["pretty", "json"] as const).pipe(
  Flag.withDescription("Log format on stderr"),
  Flag.withDefault<LogFormat>(defaults.logFormat)
)
export const timeoutSeconds = Flag.Finite("timeout-seconds").pipe(
  Flag.withDescription("How long to wait for the server's reply"),
  Flag.withDefault(5),
  Flag.filter((n) => n > 0, (n) => `must be above 0 seconds (got ${n})`)
)

/** The endpoint a client command talks to. */
export const endpointOf = (flags: { readonly host: string; readonly port: number; readonly endpoint: Option.Option<string> }): string =>
  Option.getOrElse(flags.endpoint, () => {
    const h = flags.host.includes(":") && !flags.host.startsWith("[") ? `[${flags.host}]` : flags.host
    return `tcp://${h}:${flags.port}`
  })
