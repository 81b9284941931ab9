/**
 * Configuration of the L2 tier (issue 15 item 1, DESIGN §9): the `--l2-*`
 * flags of `mpcache serve`, their defaults and rules, and the parsed
 * `--l2-url`. Off (no L2) unless `--l2-url` is given.
 */

/** One Redis node address. */
export interface L2Node {
  readonly host: string
  readonly port: number
}

/**
 * A parsed `--l2-url`: `redis://[user:pass@]host:port` (one node),
 * `rediss://…` (one node over TLS), `redis+cluster://host:port[,host:port…]`
 * or `rediss+cluster://…` (seed nodes of a Cluster; slots are discovered and
 * MOVED/ASK followed by the client).
 */
export interface L2Url {
  readonly mode: "single" | "cluster"
  readonly tls: boolean
  readonly nodes: ReadonlyArray<L2Node>
  readonly username: string | undefined
  readonly password: string | undefined
  /** The url with the password replaced by `***`, for logs and `/api/status`. */
  readonly display: string
}

/** The validated L2 settings. */
export interface L2Config {
  readonly url: L2Url
  /** First part of every key (`--l2-key-prefix`, default `mpc`). */
  readonly keyPrefix: string
  /** Expiry of written values in seconds; 0 = none (`--l2-ttl-seconds`). */
  readonly ttlSeconds: number
  /** Bytes of L2 writes in flight past which new writes are dropped (`--l2-max-inflight-bytes`, 256 MiB). */
  readonly maxInflightBytes: number
  /** Limit of a LOOKUP's EXISTS step (`--l2-lookup-timeout-ms`, 50). */
  readonly lookupTimeoutMs: number
  /** Limit of one GET or SET of a value (`--l2-transfer-timeout-ms`, 2000). */
  readonly transferTimeoutMs: number
  /** Failures or timeouts within `breakerWindowMs` that open the breaker (`--l2-breaker-failures`, 5). */
  readonly breakerFailures: number
  /** The window of those failures (`--l2-breaker-window-ms`, 10000). */
  readonly breakerWindowMs: number
  /** First probe delay once open, doubled per failed probe (`--l2-breaker-probe-ms`, 500). */
  readonly breakerProbeMs: number
  /** Cap of the probe delay (`--l2-breaker-probe-max-ms`, 30000). */
  readonly breakerProbeMaxMs: number
  /**
   * The fleet's secret (`--l2-secret-file`, issue 24 item 14): every value is then authenticated with
   * HMAC-SHA256 and a value without a valid MAC is never served (L2Mac.ts). Undefined: values carry
   * a checksum only, and the server warns at start that L2 must be as trusted as the servers.
   */
  readonly secretFile: string | undefined
}

/** The `--l2-*` values as parsed: L2Config's fields, the url still text (absent: L2 off). */
export interface L2ConfigInput extends Omit<L2Config, "url"> {
  readonly url: string | undefined
}

/** Defaults of issue 15 item 1 (L2 off). */
export const l2Defaults: L2ConfigInput = {
  url: undefined,
  keyPrefix: "mpc",
  ttlSeconds: 0,
  maxInflightBytes: 256 * 2 ** 20,
  lookupTimeoutMs: 50,
  transferTimeoutMs: 2000,
  breakerFailures: 5,
  breakerWindowMs: 10_000,
  breakerProbeMs: 500,
  breakerProbeMaxMs: 30_000,
  secretFile: undefined
}

const URL_FORM = "redis://[user:pass@]host:port, rediss://…, or redis+cluster://host:port[,host:port…]"

const parseNode = (s: string): L2Node | string => {
  const m = /^(\[[^\]]+\]|[^:@/\s]+):(\d{1,5})$/.exec(s)
  if (m === null) return `"${s}" is not host:port`
  const port = Number(m[2])
  if (port < 1 || port > 65535) return `port ${port} of "${s}" is not from 1 to 65535`
  const host = m[1]!.startsWith("[") ? m[1]!.slice(1, -1) : m[1]!
  return { host, port }
}

/** Parses `--l2-url`; a string says what is wrong with it. */
export const parseL2Url = (url: string): L2Url | string => {
  const m = /^(redis|rediss)(\+cluster)?:\/\/(?:([^:@/]*)(?::([^@/]*))?@)?([^/?#]+)\/?$/.exec(url)
  if (m === null) return `must be ${URL_FORM} (got "${url.replace(/:[^:@/]*@/, ":***@")}")`
  const mode = m[2] === undefined ? "single" : "cluster"
  const hosts = m[5]!.split(",")
  if (mode === "single" && hosts.length > 1) return `a redis:// url names one node; use redis+cluster:// for seed nodes (got ${hosts.length})`
  const nodes: Array<L2Node> = []
  for (const h of hosts) {
    const n = parseNode(h)
    if (typeof n === "string") return `${n}; expected ${URL_FORM}`
    nodes.push(n)
  }
  const username = m[3] === undefined || m[3] === "" ? undefined : decodeURIComponent(m[3])
  const password = m[4] === undefined ? undefined : decodeURIComponent(m[4])
  const auth = username === undefined && password === undefined ? "" : `${m[3] ?? ""}${password === undefined ? "" : ":***"}@`
  return { mode, tls: m[1] === "rediss", nodes, username, password, display: `${m[1]}${m[2] ?? ""}://${auth}${m[5]}` }
}

/** Single-flag rules of the `--l2-*` flags (the CLI's filters and `validateL2`). */
export const l2Rules = {
  url: (s: string) => {
    const r = parseL2Url(s)
    return typeof r === "string" ? r : undefined
  },
  keyPrefix: (s: string) =>
    /^[A-Za-z0-9_.-]{1,64}$/.test(s) ? undefined : `must be 1 to 64 characters of A-Z a-z 0-9 _ . - (got "${s}")`,
  ttlSeconds: (n: number) => Number.isSafeInteger(n) && n >= 0 ? undefined : `must be 0 (no expiry) or a whole number of seconds (got ${n})`,
  positiveInt: (n: number) => Number.isSafeInteger(n) && n >= 1 ? undefined : `must be an integer of at least 1 (got ${n})`
} as const

/** Checks the `--l2-*` values; pushes broken rules onto `issues`. Undefined when L2 is off or broken. */
export const validateL2 = (
  input: L2ConfigInput,
  issues: Array<{ readonly flag: string; readonly message: string }>
): L2Config | undefined => {
  const before = issues.length
  const check = (flag: string, problem: string | undefined) => {
    if (problem !== undefined) issues.push({ flag, message: problem })
  }
  check("l2-key-prefix", l2Rules.keyPrefix(input.keyPrefix))
  check("l2-ttl-seconds", l2Rules.ttlSeconds(input.ttlSeconds))
  check("l2-max-inflight-bytes", l2Rules.positiveInt(input.maxInflightBytes))
  check("l2-lookup-timeout-ms", l2Rules.positiveInt(input.lookupTimeoutMs))
  check("l2-transfer-timeout-ms", l2Rules.positiveInt(input.transferTimeoutMs))
  check("l2-breaker-failures", l2Rules.positiveInt(input.breakerFailures))
  check("l2-breaker-window-ms", l2Rules.positiveInt(input.breakerWindowMs))
  check("l2-breaker-probe-ms", l2Rules.positiveInt(input.breakerProbeMs))
  check("l2-breaker-probe-max-ms", l2Rules.positiveInt(input.breakerProbeMaxMs))
  if (input.breakerProbeMaxMs < input.breakerProbeMs) {
    issues.push({ flag: "l2-breaker-probe-max-ms", message: `must be at least --l2-breaker-probe-ms (${input.breakerProbeMs}; got ${input.breakerProbeMaxMs})` })
  }
  if (input.secretFile === "") issues.push({ flag: "l2-secret-file", message: "must be the path of a file holding the secret" })
  if (input.url === undefined) {
    if (input.secretFile !== undefined) issues.push({ flag: "l2-secret-file", message: "applies with --l2-url only (there is no L2 to authenticate)" })
    return undefined
  }
  const url = parseL2Url(input.url)
  if (typeof url === "string") issues.push({ flag: "l2-url", message: url })
  if (typeof url === "string" || issues.length > before) return undefined
  const { url: _, ...rest } = input
  return { ...rest, url }
}
