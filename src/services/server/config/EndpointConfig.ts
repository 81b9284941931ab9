/**
 * Where `mpcache serve` listens and who may reach it (DESIGN §3, §7;
 * docs/security.md): the ZeroMQ endpoint (`--endpoint`, else
 * `--host`/`--port`), CURVE and its allowlist, the loopback rule (serving
 * beyond loopback needs CURVE or `--insecure-allow-remote`: fail closed) and
 * the group of an ipc socket file.
 */
import { readFileSync } from "node:fs"
import { unsafeIpcDirectory } from "../../zmq/Sockets.ts"
import { type ConfigIssue, issueCheck } from "./ConfigIssue.ts"

/** The CURVE key files of `serve`. */
export interface CurveFiles {
  /** The server's Z85 secret key, one line (`mpcache keygen` NAME.key). */
  readonly secretKeyFile: string
  /** The authorized-keys file (src/services/auth/AuthorizedKeys.ts). */
  readonly authorizedKeysFile: string
}

/** The validated listen settings (part of ServerConfigShape). */
export interface EndpointConfig {
  /** ZeroMQ endpoint the ROUTER binds: `--endpoint`, else `tcp://{--host}:{--port}`. */
  readonly endpoint: string
  /** CURVE and its allowlist (`--curve-secret-key-file`, `--curve-authorized-keys`); undefined: off. */
  readonly curve: CurveFiles | undefined
  /** Binding a non-loopback TCP address without CURVE was asked for (`--insecure-allow-remote`). */
  readonly insecureAllowRemote: boolean
  /** Group (gid) an ipc socket file is chowned to, mode 0660 (`--ipc-group`); undefined: mode 0600. */
  readonly ipcGroupId: number | undefined
}

/** The listen flags as parsed (part of ServerConfigInput). */
export interface EndpointConfigInput {
  readonly host: string
  readonly port: number
  readonly endpoint: string | undefined
  readonly curveSecretKeyFile: string | undefined
  readonly curveAuthorizedKeys: string | undefined
  readonly insecureAllowRemote: boolean
  readonly ipcGroup: string | undefined
}

/** Defaults of DESIGN §3 (upstream: port 5555), loopback only, no CURVE. */
export const endpointDefaults: EndpointConfigInput = {
  host: "127.0.0.1",
  port: 5555,
  endpoint: undefined,
  curveSecretKeyFile: undefined,
  curveAuthorizedKeys: undefined,
  insecureAllowRemote: false,
  ipcGroup: undefined
}

/** Single-flag rules of the listen flags (shared with the CLI's flag filters). */
export const endpointRules = {
  port: (n: number) => Number.isInteger(n) && n >= 1 && n <= 65535 ? undefined : `must be an integer from 1 to 65535 (got ${n})`,
  endpoint: (s: string) =>
    /^(tcp:\/\/[^\s]+:(\d+|\*)|ipc:\/\/[^\s]+)$/.test(s) ? undefined : `must be a ZeroMQ endpoint tcp://HOST:PORT or ipc://PATH (got "${s}")`,
  host: (s: string) => s.length > 0 && !/\s/.test(s) ? undefined : `must be a host name or address (got "${s}")`
} as const

/** Whether `host` (a name or address, IPv6 with or without brackets) is loopback only. */
export const isLoopbackHost = (host: string): boolean => {
  const h = host.startsWith("[") && host.endsWith("]") ? host.slice(1, -1) : host
  return h === "localhost" || h === "::1" || /^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(h)
}

/** The host of a `tcp://HOST:PORT` endpoint; undefined for any other transport. */
export const tcpHostOf = (endpoint: string): string | undefined => {
  const m = /^tcp:\/\/(.+):(\d+|\*)$/.exec(endpoint)
  return m === null ? undefined : m[1]
}

/** Whether CURVE was asked for: either of its files given (both are needed, {@link validateEndpoint} says so). */
export const curveRequested = (input: EndpointConfigInput): boolean =>
  input.curveSecretKeyFile !== undefined || input.curveAuthorizedKeys !== undefined

/** The gid of group `name` from /etc/group, or undefined. */
const groupId = (name: string): number | undefined => {
  try {
    for (const line of readFileSync("/etc/group", "utf8").split("\n")) {
      const [group, , gid] = line.split(":")
      if (group === name && gid !== undefined && /^\d+$/.test(gid)) return Number(gid)
    }
  } catch {
    return undefined
  }
  return undefined
}

/** The address rules of the listen flags: `--endpoint`, else `--host` and `--port`. First of all rules, as the CLI lists them. */
export const checkAddress = (input: EndpointConfigInput, issues: Array<ConfigIssue>): void => {
  const check = issueCheck(issues)
  if (input.endpoint !== undefined) check("endpoint", endpointRules.endpoint(input.endpoint))
  else {
    check("host", endpointRules.host(input.host))
    check("port", endpointRules.port(input.port))
  }
}

/**
 * The cross-flag rules of the listen flags, pushed onto `issues` (the address
 * rules are {@link checkAddress}'s): CURVE needs both files; a non-loopback
 * TCP address needs CURVE or `--insecure-allow-remote`; `--ipc-group` applies
 * to an ipc endpoint and names a group of /etc/group; an ipc socket's folder
 * must not be writable by others (Sockets.ts). Returns the settings.
 */
export const validateEndpoint = (input: EndpointConfigInput, issues: Array<ConfigIssue>): EndpointConfig => {
  const check = issueCheck(issues)
  const curveOn = curveRequested(input)
  if (curveOn && input.curveSecretKeyFile === undefined) {
    issues.push({ flag: "curve-secret-key-file", message: "--curve-authorized-keys needs the server's secret key file too" })
  }
  if (curveOn && input.curveAuthorizedKeys === undefined) {
    issues.push({ flag: "curve-authorized-keys", message: "--curve-secret-key-file needs the authorized-keys file too" })
  }
  const host = input.host.includes(":") && !input.host.startsWith("[") ? `[${input.host}]` : input.host
  const endpoint = input.endpoint ?? `tcp://${host}:${input.port}`
  const tcpHost = tcpHostOf(endpoint)
  if (tcpHost !== undefined && !isLoopbackHost(tcpHost) && !curveOn && !input.insecureAllowRemote) {
    issues.push({
      flag: input.endpoint === undefined ? "host" : "endpoint",
      message:
        `${tcpHost} is not a loopback address: serving beyond loopback needs CURVE (--curve-secret-key-file and --curve-authorized-keys), or --insecure-allow-remote to serve anyone who can reach it`
    })
  }
  if (input.ipcGroup !== undefined && !endpoint.startsWith("ipc://")) {
    issues.push({ flag: "ipc-group", message: "applies to an ipc:// --endpoint only" })
  }
  const ipcGroupId = input.ipcGroup === undefined ? undefined : groupId(input.ipcGroup)
  if (input.ipcGroup !== undefined && ipcGroupId === undefined) {
    issues.push({ flag: "ipc-group", message: `no group named "${input.ipcGroup}" in /etc/group` })
  }
  check("endpoint", unsafeIpcDirectory(endpoint))
  return {
    endpoint,
    curve: input.curveSecretKeyFile !== undefined && input.curveAuthorizedKeys !== undefined
      ? { secretKeyFile: input.curveSecretKeyFile, authorizedKeysFile: input.curveAuthorizedKeys }
      : undefined,
    insecureAllowRemote: input.insecureAllowRemote,
    ipcGroupId
  }
}
