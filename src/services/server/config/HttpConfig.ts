/**
 * The HTTP frontend's settings (`/api/status`, `/metrics`; DESIGN §7,
 * docs/security.md): its address, the bearer token a non-loopback frontend
 * needs (fail closed), and the idle timeout of its connections (issue 24
 * item 11).
 */
import { type ConfigIssue, issueCheck } from "./ConfigIssue.ts"
import { endpointRules, isLoopbackHost } from "./EndpointConfig.ts"

/** The validated HTTP settings (part of ServerConfigShape); the flags as parsed have the same names. */
export interface HttpConfig {
  /** HTTP frontend address (`--http-host`, `--http-port`; port 0 picks a free one). */
  readonly httpHost: string
  readonly httpPort: number
  /** File holding the HTTP bearer token (`--http-token-file`); undefined: no token (loopback only). */
  readonly httpTokenFile: string | undefined
  /**
   * HTTP connections that have not sent a complete request head within this many seconds of connecting (or of
   * their last response) are closed (`--http-idle-timeout-seconds`, default 5; issue 24 item 11).
   */
  readonly httpIdleTimeoutSeconds: number
}

/** Defaults: loopback port 8080, no token, 5 s idle timeout. */
export const httpDefaults: HttpConfig = {
  httpHost: "127.0.0.1",
  httpPort: 8080,
  httpTokenFile: undefined,
  httpIdleTimeoutSeconds: 5
}

/** Single-flag rules of the HTTP flags (shared with the CLI's flag filters; `--http-host` takes {@link endpointRules}.host). */
export const httpRules = {
  httpPort: (n: number) => Number.isInteger(n) && n >= 0 && n <= 65535 ? undefined : `must be an integer from 0 to 65535 (got ${n}; 0 picks a free port)`,
  httpIdleTimeout: (n: number) =>
    Number.isFinite(n) && n >= 0.1 && n <= 300 ? undefined : `must be a number of seconds from 0.1 to 300 (got ${n})`
} as const

/** Checks the HTTP flags and pushes broken rules onto `issues`: a frontend beyond loopback needs a token. Returns the settings. */
export const validateHttp = (input: HttpConfig, issues: Array<ConfigIssue>): HttpConfig => {
  const check = issueCheck(issues)
  check("http-host", endpointRules.host(input.httpHost))
  check("http-port", httpRules.httpPort(input.httpPort))
  check("http-idle-timeout-seconds", httpRules.httpIdleTimeout(input.httpIdleTimeoutSeconds))
  if (!isLoopbackHost(input.httpHost) && input.httpTokenFile === undefined) {
    issues.push({
      flag: "http-host",
      message: `${input.httpHost} is not a loopback address: an HTTP frontend beyond loopback needs --http-token-file (every request then needs Authorization: Bearer <token>)`
    })
  }
  return {
    httpHost: input.httpHost,
    httpPort: input.httpPort,
    httpTokenFile: input.httpTokenFile,
    httpIdleTimeoutSeconds: input.httpIdleTimeoutSeconds
  }
}
