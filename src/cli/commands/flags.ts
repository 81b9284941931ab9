/**
 * Flags shared by several commands: where the server is (`--host`/`--port`
 * or `--endpoint`, as for `serve`), where its HTTP frontend is, the request
 * timeout, and the log format.
 */
import { Option } from "effect"
import { Flag } from "effect/cli"
import { type ClientCurveKeys, readClientKeys } from "../../services/auth/Curve.ts"
import { defaults, rules, type LogFormat } from "../../services/server/ServerConfig.ts"

/**
 * A flag's help line (issue 29 item 3; the README promises "every flag, its
 * default and its rule", and effect's help lists no defaults): what it does and
 * its rule, then `[default: …]`. `shown` is the default as a user reads it: the
 * value (a boolean as on/off), or the words for one derived at start.
 */
export const described = (what: string, shown: string | number | boolean): string =>
  `${what} [default: ${typeof shown === "boolean" ? (shown ? "on" : "off") : shown}]`

const checked = <A>(flag: Flag.Flag<A>, rule: (a: A) => string | undefined): Flag.Flag<A> =>
  flag.pipe(Flag.filter((a) => rule(a) === undefined, (a) => rule(a) ?? ""))

export const host = checked(
  Flag.String("host").pipe(Flag.withDescription(described("Address the ZeroMQ endpoint binds or connects to: a host name or address", defaults.host)), Flag.withDefault(defaults.host)),
  rules.host
)
export const port = checked(
  Flag.Int("port").pipe(Flag.withDescription(described("TCP port of the ZeroMQ endpoint, 1 to 65535", defaults.port)), Flag.withDefault(defaults.port)),
  rules.port
)
/** An optional ZeroMQ endpoint flag `--name` (tcp://HOST:PORT or ipc://PATH), `shown` as its default in --help. */
export const optionalEndpoint = (name: string, description: string, shown: string) =>
  Flag.String(name).pipe(
    Flag.withDescription(described(description, shown)),
    Flag.filter((s) => rules.endpoint(s) === undefined, (s) => rules.endpoint(s) ?? ""),
    Flag.optional
  )
export const endpoint = optionalEndpoint("endpoint", "Any ZeroMQ endpoint (tcp://HOST:PORT or ipc://PATH); overrides --host/--port", "tcp://--host:--port")
export const httpHost = checked(
  Flag.String("http-host").pipe(Flag.withDescription(described("Address of the HTTP frontend", defaults.httpHost)), Flag.withDefault(defaults.httpHost)),
  rules.host
)
export const httpPort = checked(
  Flag.Int("http-port").pipe(Flag.withDescription(described("Port of the HTTP frontend, 0 to 65535 (0 picks a free one)", defaults.httpPort)), Flag.withDefault(defaults.httpPort)),
  rules.httpPort
)
export const logFormat = Flag.Literals("log-format", ["pretty", "json"] as const).pipe(
  Flag.withDescription(described("Log format on stderr: pretty, or json (one object per line)", defaults.logFormat)),
  Flag.withDefault<LogFormat>(defaults.logFormat)
)
const DEFAULT_TIMEOUT_SECONDS = 5
export const timeoutSeconds = Flag.Finite("timeout-seconds").pipe(
  Flag.withDescription(described("How long to wait for the server's reply, seconds; > 0", DEFAULT_TIMEOUT_SECONDS)),
  Flag.withDefault(DEFAULT_TIMEOUT_SECONDS),
  Flag.filter((n) => n > 0, (n) => `must be above 0 seconds (got ${n})`)
)

export const curveServerPublicKeyFile = Flag.String("curve-server-public-key-file").pipe(
  Flag.withDescription(described("Speak CURVE: the server's public key (its NAME.pub); needs --curve-secret-key-file", "none: CURVE off")),
  Flag.optional
)
export const curveSecretKeyFile = Flag.String("curve-secret-key-file").pipe(
  Flag.withDescription(described("Speak CURVE: this client's secret key (mpcache keygen NAME writes NAME.key; the public key derives from it)", "none: CURVE off")),
  Flag.optional
)

/** The CURVE flags of a client command. */
export interface CurveFlags {
  readonly curveServerPublicKeyFile: Option.Option<string>
  readonly curveSecretKeyFile: Option.Option<string>
}

/**
 * The client's CURVE keys from its flags: none without either flag; both
 * files read otherwise. Fails with the message to print (exit 2, naming the flag or file).
 */
export const curveKeysOf = (flags: CurveFlags): { readonly curve: ClientCurveKeys | undefined } | { readonly error: string } => {
  const server = Option.getOrUndefined(flags.curveServerPublicKeyFile)
  const secret = Option.getOrUndefined(flags.curveSecretKeyFile)
  if (server === undefined && secret === undefined) return { curve: undefined }
  if (server === undefined) return { error: "--curve-secret-key-file needs --curve-server-public-key-file too" }
  if (secret === undefined) return { error: "--curve-server-public-key-file needs --curve-secret-key-file too" }
  try {
    return { curve: readClientKeys(server, secret) }
  } catch (e) {
    return { error: e instanceof Error ? e.message : String(e) }
  }
}

/** The endpoint a client command talks to. */
export const endpointOf = (flags: { readonly host: string; readonly port: number; readonly endpoint: Option.Option<string> }): string =>
  Option.getOrElse(flags.endpoint, () => {
    const h = flags.host.includes(":") && !flags.host.startsWith("[") ? `[${flags.host}]` : flags.host
    return `tcp://${h}:${flags.port}`
  })
