/**
 * Server configuration (DESIGN §5, §7): every `mpcache serve` flag with its
 * default and its rule, in one place. The CLI parses flags into a
 * `ServerConfigInput` and `validate` turns it into a `ServerConfig` or the
 * list of broken rules, each naming its flag (exit status 2).
 */
import { accessSync, constants, readFileSync } from "node:fs"
import { tmpdir, totalmem } from "node:os"
import { Context, Effect, Layer, Schema } from "effect"
import { MAX_CHUNK_SIZE_TOKENS } from "../../schema/Limits.ts"
import { unsafeIpcDirectory } from "../zmq/Sockets.ts"
import {
  currentDescriptorLimit,
  type DescriptorBudget,
  descriptorBudget,
  type DescriptorBudgetInput,
  descriptorBudgetDefaults
} from "./DescriptorBudget.ts"
import { type L2Config, type L2ConfigInput, l2Defaults, validateL2 } from "./l2/L2Config.ts"
import {
  DEFAULT_MAX_SEGMENTS_PER_REGISTER,
  defaultMaxMappedBytes,
  defaultMaxMappings,
  type KernelMapCount,
  KERNEL_MAX_MAP_COUNT_PATH,
  maxMappingsAllowed,
  RESERVED_MAPS,
  readKernelMaxMapCount
} from "./MapLimits.ts"

/** Output format of the server's logs. */
export type LogFormat = "json" | "pretty"

/**
 * How engine-driven contexts move KV bytes (`--engine-driven-transport`,
 * DESIGN §4; upstream picks `ShmTransferStrategy` when the server's L1 is a
 * shared segment, else `PickleTransferStrategy`): `shm` hands out slots in
 * the shared L1 pool that workers map; `inline` carries the bytes in the
 * messages (REGISTER answers `shm_name ""`, `pool_size 0`).
 */
export type EngineDrivenTransport = "shm" | "inline"

/** The values `--engine-driven-transport` accepts. */
export const ENGINE_DRIVEN_TRANSPORTS: ReadonlyArray<EngineDrivenTransport> = ["shm", "inline"]

/**
 * Why `--engine-driven-transport shm` is refused with CURVE on (issue 24
 * item 7; docs/security.md): the `shm` REGISTER answers the one L1 pool's
 * name, and a tenant that maps it reads and overwrites every tenant's chunks.
 */
export const SHM_UNDER_TENANCY =
  "shm shares the L1 pool with every engine-driven worker: a tenant that maps it reads and overwrites every other tenant's chunks; with CURVE tenants use inline (the default when CURVE is on)"

/**
 * Whether REGISTER may name POSIX shared-memory segments (`cpu_shm`
 * descriptors; `--named-segments`, issue 13 item 3): `allow` (default) or
 * `deny` (refused with invalid_argument). A named segment can be opened by
 * any process of the user, so `deny` is for servers whose workers hand
 * memory over otherwise.
 */
export type NamedSegments = "allow" | "deny"

/** The values `--named-segments` accepts. */
export const NAMED_SEGMENTS: ReadonlyArray<NamedSegments> = ["allow", "deny"]

/** A validated server configuration. */
export interface ServerConfigShape {
  /** ZeroMQ endpoint the ROUTER binds: `--endpoint`, else `tcp://{--host}:{--port}`. */
  readonly endpoint: string
  /** HTTP frontend address (`--http-host`, `--http-port`; port 0 picks a free one). */
  readonly httpHost: string
  readonly httpPort: number
  /** Tokens per chunk (`--chunk-size`, default 256). */
  readonly chunkSizeTokens: number
  /** L1 capacity in GiB (`--l1-size-gb`, default 1). */
  readonly l1SizeGb: number
  /** Prefault the L1 pool's pages in the background at start (`--l1-prefault`, default true). */
  readonly l1Prefault: boolean
  /** cpu_shm descriptors allowed at REGISTER (`--named-segments`, default allow; issue 13 item 3). */
  readonly namedSegments: NamedSegments
  /**
   * After a reap for `disconnect` or `timeout`, unlink the reaped instance's
   * cpu_shm names whose file is still the one mapped (`--unlink-reaped-segments`, default off).
   */
  readonly unlinkReapedSegments: boolean
  /**
   * The descriptor socket cpu_memfd descriptors are passed on (`--fd-socket`,
   * issue 13 item 2; docs/memfd.md): a path, `@name` (abstract namespace), or
   * undefined for the default ({@link defaultFdSocket}, where a failure to
   * listen only turns cpu_memfd off); "off" turns it off.
   */
  readonly fdSocket: string | undefined
  /** Refuse memfds not sealed with F_SEAL_SHRINK and F_SEAL_SEAL (`--require-sealed-memfd`, default off). */
  readonly requireSealedMemfd: boolean
  /** Passed descriptors not registered within this many seconds are closed (`--fd-token-ttl-seconds`, default 30). */
  readonly fdTokenTtlSeconds: number
  /** NORMAL pool size (`--max-cpu-workers`, default `--max-workers`). */
  readonly maxCpuWorkers: number
  /** AFFINITY lanes (`--max-gpu-workers`, default `--max-workers`). */
  readonly maxGpuWorkers: number
  readonly logFormat: LogFormat
  /** Reap window of instances with both liveness flags latched; 0 disables reaping (`--worker-reap-timeout-seconds`). */
  readonly workerReapTimeoutSeconds: number
  /** Reap window of instances not yet proven alive (`--worker-registration-grace-seconds`). */
  readonly workerRegistrationGraceSeconds: number
  /** Silence allowed after an instance's last connection closed; 0 disables (`--worker-disconnect-grace-seconds`). */
  readonly workerDisconnectGraceSeconds: number
  /** Prefetch read locks older than this are released (`--lookup-lock-ttl-seconds`; upstream read_ttl_seconds 300). */
  readonly lookupLockTtlSeconds: number
  /** What pending lookups may keep (issue 24 item 6); over a bound the oldest is released. */
  readonly lookupLimits: LookupLimits
  /** Engine-driven transport (`--engine-driven-transport`: default shm, inline with CURVE, which refuses shm). */
  readonly engineDrivenTransport: EngineDrivenTransport
  /**
   * A PREPARE_STORE / PREPARE_RETRIEVE not committed within this many seconds
   * is released (`--prepare-ttl-seconds`, default 60, > 0; issue 18): its
   * reservations dropped or read locks released, a late COMMIT answers false.
   */
  readonly prepareTtlSeconds: number
  /** CURVE and its allowlist (`--curve-secret-key-file`, `--curve-authorized-keys`); undefined: off. */
  readonly curve: CurveFiles | undefined
  /** Binding a non-loopback TCP address without CURVE was asked for (`--insecure-allow-remote`). */
  readonly insecureAllowRemote: boolean
  /** Group (gid) an ipc socket file is chowned to, mode 0660 (`--ipc-group`); undefined: mode 0600. */
  readonly ipcGroupId: number | undefined
  /** File holding the HTTP bearer token (`--http-token-file`); undefined: no token (loopback only). */
  readonly httpTokenFile: string | undefined
  /** Per-tenant limits with CURVE on (docs/security.md). */
  readonly tenantLimits: TenantLimits
  /** Bounds on the mappings of worker memory, with or without CURVE (issue 24 items 4 and 12). */
  readonly mapLimits: MapLimitsConfig
  /** The L2 tier (`--l2-*`, issue 15); undefined: off (no `--l2-url`). */
  readonly l2: L2Config | undefined
  /** Caps on descriptors per listener and for passed descriptors (issue 24 item 11; DescriptorBudget.ts). */
  readonly descriptors: DescriptorBudget
  /**
   * Bytes of replies queued to one peer (`--max-queued-reply-bytes-per-peer`, issue 24 item 10): what its ZeroMQ
   * pipe may still hold, and separately what waits in its outbox, each at most this; past it a reply is refused
   * with `overloaded`. Default: the L1 capacity plus 1 MiB (any reply this server can build fits), at least 256 MiB.
   */
  readonly maxQueuedReplyBytesPerPeer: number
  /**
   * HTTP connections that have not sent a complete request head within this many seconds of connecting (or of
   * their last response) are closed (`--http-idle-timeout-seconds`, default 5; issue 24 item 11).
   */
  readonly httpIdleTimeoutSeconds: number
}

/** The CURVE key files of `serve`. */
export interface CurveFiles {
  /** The server's Z85 secret key, one line (`mpcache keygen` NAME.key). */
  readonly secretKeyFile: string
  /** The authorized-keys file (src/services/auth/AuthorizedKeys.ts). */
  readonly authorizedKeysFile: string
}

/**
 * Bounds on pending lookups — request ids whose read locks or hit count the
 * server keeps between LOOKUP and END_SESSION / RETRIEVE / the TTL (issue 24
 * item 6). Over one, the oldest pending lookup is released (locks freed,
 * counted in `mpcache_lookup_sessions_released_total{reason}`); the new
 * LOOKUP is served.
 */
export interface LookupLimits {
  /** Pending lookups in the whole server (`--max-pending-lookups`, default 16384). */
  readonly maxPendingLookups: number
  /** Pending lookups whose last LOOKUP came from one peer (routing id) (`--max-pending-lookups-per-peer`, default 4096). */
  readonly maxPendingLookupsPerPeer: number
  /** Read locks all pending lookups hold together, one per L1 object each (`--max-lookup-locks`, default 1048576). */
  readonly maxLookupLocks: number
}

/** Per-tenant limits; over one a request is answered `overloaded` naming it. */
export interface TenantLimits {
  /** Instances a tenant may hold registered (`--tenant-max-instances`, default 64). */
  readonly maxInstances: number
  /** REGISTERs (of any kind) per second per tenant, a bucket of that many (`--tenant-max-registers-per-second`, 20). */
  readonly maxRegistersPerSecond: number
  /** Bytes of worker memory a tenant's registrations may map (`--tenant-max-mapped-bytes`, the machine's RAM). */
  readonly maxMappedBytes: number
}

/**
 * Bounds on the worker memory the server maps (issue 24 items 4 and 12,
 * MapLimits.ts); over one a REGISTER or CB_REGISTER_ROPE is answered
 * `overloaded` naming the flag, before anything is mapped.
 */
export interface MapLimitsConfig {
  /** `vm.max_map_count` as read at start (or the fallback, logged as a warning). */
  readonly kernelMaxMapCount: KernelMapCount
  /** Mappings of worker memory held at once, over every instance (`--max-mappings`, default half the kernel's cap). */
  readonly maxMappings: number
  /** Distinct segments one registration may name (`--max-segments-per-register`, default 1024, at most `maxMappings`). */
  readonly maxSegmentsPerRegister: number
  /** Bytes of worker host memory mapped at once, over every instance (`--max-mapped-bytes`, default half the RAM). */
  readonly maxMappedBytes: number
}

/** Flag values as parsed, before the cross-flag rules. */
export interface ServerConfigInput {
  readonly host: string
  readonly port: number
  readonly endpoint: string | undefined
  readonly httpHost: string
  readonly httpPort: number
  readonly chunkSize: number
  readonly l1SizeGb: number
  readonly l1Prefault: boolean
  readonly namedSegments: NamedSegments
  readonly unlinkReapedSegments: boolean
  readonly fdSocket: string | undefined
  readonly requireSealedMemfd: boolean
  readonly fdTokenTtlSeconds: number
  readonly maxWorkers: number
  readonly maxCpuWorkers: number | undefined
  readonly maxGpuWorkers: number | undefined
  readonly logFormat: LogFormat
  readonly workerReapTimeoutSeconds: number
  readonly workerRegistrationGraceSeconds: number
  readonly workerDisconnectGraceSeconds: number
  readonly lookupLockTtlSeconds: number
  readonly maxPendingLookups: number
  readonly maxPendingLookupsPerPeer: number
  readonly maxLookupLocks: number
  /** undefined: the default, shm without CURVE and inline with it. */
  readonly engineDrivenTransport: EngineDrivenTransport | undefined
  readonly prepareTtlSeconds: number
  readonly curveSecretKeyFile: string | undefined
  readonly curveAuthorizedKeys: string | undefined
  readonly insecureAllowRemote: boolean
  readonly ipcGroup: string | undefined
  readonly httpTokenFile: string | undefined
  readonly tenantMaxInstances: number
  readonly tenantMaxRegistersPerSecond: number
  readonly tenantMaxMappedBytes: number
  /** undefined: half the kernel's vm.max_map_count. */
  readonly maxMappings: number | undefined
  /** undefined: 1024, or `maxMappings` when that is lower. */
  readonly maxSegmentsPerRegister: number | undefined
  readonly maxMappedBytes: number
  readonly l2: L2ConfigInput
  /** RLIMIT_NOFILE's soft limit the descriptor caps are taken from (`mpcache serve` raises it to the hard limit first). */
  readonly descriptorLimit: number
  /** The explicit descriptor caps (`--max-zmq-connections` …); undefined: a share of the limit. */
  readonly descriptorCaps: DescriptorBudgetInput
  /** undefined: the default of {@link ServerConfigShape.maxQueuedReplyBytesPerPeer}. */
  readonly maxQueuedReplyBytesPerPeer: number | undefined
  readonly httpIdleTimeoutSeconds: number
}

/** Defaults of DESIGN §5 and §7 (upstream: port 5555, chunk 256, reap 120 s, grace 3600 s). */
export const defaults: ServerConfigInput = {
  host: "127.0.0.1",
  port: 5555,
  endpoint: undefined,
  httpHost: "127.0.0.1",
  httpPort: 8080,
  chunkSize: 256,
  l1SizeGb: 1,
  l1Prefault: true,
  namedSegments: "allow",
  unlinkReapedSegments: false,
  fdSocket: undefined,
  requireSealedMemfd: false,
  fdTokenTtlSeconds: 30,
  maxWorkers: 4,
  maxCpuWorkers: undefined,
  maxGpuWorkers: undefined,
  logFormat: "pretty",
  workerReapTimeoutSeconds: 120,
  workerRegistrationGraceSeconds: 3600,
  workerDisconnectGraceSeconds: 10,
  lookupLockTtlSeconds: 300,
  // A scheduler keeps one pending lookup per request it has looked up and not yet ended: its running
  // and waiting requests (vLLM runs up to 1024 at once). 4 schedulers' worth per server.
  maxPendingLookupsPerPeer: 4096,
  maxPendingLookups: 16384,
  // 1024 requests × 8 ranks × 128 chunks (32K-token prompts at 256); ~200 bytes of heap each (docs/security.md).
  maxLookupLocks: 1 << 20,
  engineDrivenTransport: undefined,
  prepareTtlSeconds: 60,
  curveSecretKeyFile: undefined,
  curveAuthorizedKeys: undefined,
  insecureAllowRemote: false,
  ipcGroup: undefined,
  httpTokenFile: undefined,
  tenantMaxInstances: 64,
  tenantMaxRegistersPerSecond: 20,
  tenantMaxMappedBytes: totalmem(),
  maxMappings: undefined,
  maxSegmentsPerRegister: undefined,
  maxMappedBytes: defaultMaxMappedBytes(),
  l2: l2Defaults,
  descriptorLimit: currentDescriptorLimit(),
  descriptorCaps: descriptorBudgetDefaults,
  maxQueuedReplyBytesPerPeer: undefined,
  httpIdleTimeoutSeconds: 5
}

/** The least `--max-queued-reply-bytes-per-peer` takes: more than many small replies. */
export const MIN_QUEUED_REPLY_BYTES_PER_PEER = 65_536

/** The default of `--max-queued-reply-bytes-per-peer` for an L1 of `l1SizeGb` GiB: the L1 plus 1 MiB, at least 256 MiB. */
export const defaultMaxQueuedReplyBytesPerPeer = (l1SizeGb: number): number =>
  Math.max(256 * 2 ** 20, Math.floor(l1SizeGb * 2 ** 30) + 2 ** 20)

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

/** Single-flag rules, shared by the CLI's flag filters and `validate`. */
export const rules = {
  port: (n: number) => Number.isInteger(n) && n >= 1 && n <= 65535 ? undefined : `must be an integer from 1 to 65535 (got ${n})`,
  httpPort: (n: number) => Number.isInteger(n) && n >= 0 && n <= 65535 ? undefined : `must be an integer from 0 to 65535 (got ${n}; 0 picks a free port)`,
  endpoint: (s: string) =>
    /^(tcp:\/\/[^\s]+:(\d+|\*)|ipc:\/\/[^\s]+)$/.test(s) ? undefined : `must be a ZeroMQ endpoint tcp://HOST:PORT or ipc://PATH (got "${s}")`,
  host: (s: string) => s.length > 0 && !/\s/.test(s) ? undefined : `must be a host name or address (got "${s}")`,
  chunkSize: (n: number) =>
    Number.isInteger(n) && n >= 1 && n <= MAX_CHUNK_SIZE_TOKENS ? undefined : `must be an integer from 1 to ${MAX_CHUNK_SIZE_TOKENS} tokens (got ${n})`,
  l1SizeGb: (n: number) => Number.isFinite(n) && n > 0 && n <= 65536 ? undefined : `must be a number of GiB above 0 (got ${n})`,
  workers: (n: number) => Number.isInteger(n) && n >= 1 && n <= 1024 ? undefined : `must be an integer from 1 to 1024 (got ${n})`,
  reapTimeout: (n: number) =>
    Number.isFinite(n) && (n === 0 || n >= 30)
      ? undefined
      : `worker reap timeout must be 0 (disabled) or at least 30 seconds (got ${n}); keep it at least 3 × the workers' heartbeat interval`,
  lockTtl: (n: number) =>
    Number.isFinite(n) && n >= 1 ? undefined : `lookup lock TTL must be at least 1 second (got ${n})`,
  prepareTtl: (n: number) =>
    Number.isFinite(n) && n > 0 ? undefined : `prepare TTL must be a number of seconds above 0 (got ${n})`,
  disconnectGrace: (n: number) =>
    Number.isFinite(n) && n >= 0 ? undefined : `worker disconnect grace must be 0 (disabled) or a positive number of seconds (got ${n})`,
  engineDrivenTransport: (s: string) =>
    (ENGINE_DRIVEN_TRANSPORTS as ReadonlyArray<string>).includes(s) ? undefined : `must be shm or inline (got "${s}")`,
  namedSegments: (s: string) =>
    (NAMED_SEGMENTS as ReadonlyArray<string>).includes(s) ? undefined : `must be allow or deny (got "${s}")`,
  fdSocket: (s: string) =>
    s === "off" || (s.length > 1 && !s.includes("\0") && Buffer.byteLength(s) <= 107)
      ? undefined
      : `must be a socket path, @name (abstract namespace) or off, at most 107 bytes (got "${s}")`,
  fdTokenTtl: (n: number) =>
    Number.isFinite(n) && n > 0 ? undefined : `must be a number of seconds above 0 (got ${n})`,
  positiveInt: (n: number) => Number.isSafeInteger(n) && n >= 1 ? undefined : `must be an integer of at least 1 (got ${n})`,
  queuedReplyBytes: (n: number) =>
    Number.isSafeInteger(n) && n >= MIN_QUEUED_REPLY_BYTES_PER_PEER
      ? undefined
      : `must be a number of bytes of at least ${MIN_QUEUED_REPLY_BYTES_PER_PEER} (got ${n})`,
  httpIdleTimeout: (n: number) =>
    Number.isFinite(n) && n >= 0.1 && n <= 300 ? undefined : `must be a number of seconds from 0.1 to 300 (got ${n})`,
  /** `--max-mappings` under a kernel cap of `kernel` maps (MapLimits.ts). */
  maxMappings: (n: number, kernel: KernelMapCount) => {
    const allowed = maxMappingsAllowed(kernel.value)
    if (!Number.isSafeInteger(n) || n < 1 || n > allowed) {
      const read = kernel.source === "kernel" ? `read at start from ${KERNEL_MAX_MAP_COUNT_PATH}` : `assumed: ${kernel.reason}`
      return `must be an integer from 1 to ${allowed} (got ${n}): vm.max_map_count is ${kernel.value} (${read}) and the server keeps ${
        kernel.value - allowed
      } of those maps for its own (V8's heap, thread stacks, libraries, the L1 pool: ${RESERVED_MAPS}, or half of a cap below ${2 * RESERVED_MAPS}); raise vm.max_map_count for more`
    }
    return undefined
  },
  maxSegmentsPerRegister: (n: number, maxMappings: number) =>
    Number.isSafeInteger(n) && n >= 1 && n <= maxMappings
      ? undefined
      : `must be an integer from 1 to --max-mappings (${maxMappings}) (got ${n})`,
  path: (s: string) => s.length > 0 ? undefined : "must be a file path"
} as const

/**
 * Checks every rule (single-flag and cross-flag) and resolves the derived
 * values, the mapping bounds against the kernel's cap `kernel` (read from
 * /proc by default). Returns the config, or every broken rule.
 */
export const validate = (
  input: ServerConfigInput,
  kernel: KernelMapCount = readKernelMaxMapCount()
): { readonly config: ServerConfigShape } | { readonly issues: ReadonlyArray<ConfigIssue> } => {
  const issues: Array<ConfigIssue> = []
  const check = (flag: string, problem: string | undefined) => {
    if (problem !== undefined) issues.push({ flag, message: problem })
  }
  if (input.endpoint !== undefined) check("endpoint", rules.endpoint(input.endpoint))
  else {
    check("host", rules.host(input.host))
    check("port", rules.port(input.port))
  }
  check("http-host", rules.host(input.httpHost))
  check("http-port", rules.httpPort(input.httpPort))
  check("chunk-size", rules.chunkSize(input.chunkSize))
  check("l1-size-gb", rules.l1SizeGb(input.l1SizeGb))
  check("named-segments", rules.namedSegments(input.namedSegments))
  if (input.fdSocket !== undefined) check("fd-socket", rules.fdSocket(input.fdSocket))
  check("fd-token-ttl-seconds", rules.fdTokenTtl(input.fdTokenTtlSeconds))
  check("max-workers", rules.workers(input.maxWorkers))
  if (input.maxCpuWorkers !== undefined) check("max-cpu-workers", rules.workers(input.maxCpuWorkers))
  if (input.maxGpuWorkers !== undefined) check("max-gpu-workers", rules.workers(input.maxGpuWorkers))
  check("worker-reap-timeout-seconds", rules.reapTimeout(input.workerReapTimeoutSeconds))
  const grace = input.workerRegistrationGraceSeconds
  if (!Number.isFinite(grace) || grace < input.workerReapTimeoutSeconds) {
    issues.push({
      flag: "worker-registration-grace-seconds",
      message: `worker registration grace must be at least the worker reap timeout (${input.workerReapTimeoutSeconds} s; got ${grace})`
    })
  }
  check("worker-disconnect-grace-seconds", rules.disconnectGrace(input.workerDisconnectGraceSeconds))
  check("lookup-lock-ttl-seconds", rules.lockTtl(input.lookupLockTtlSeconds))
  check("max-pending-lookups", rules.positiveInt(input.maxPendingLookups))
  check("max-pending-lookups-per-peer", rules.positiveInt(input.maxPendingLookupsPerPeer))
  check("max-lookup-locks", rules.positiveInt(input.maxLookupLocks))
  if (
    rules.positiveInt(input.maxPendingLookups) === undefined && rules.positiveInt(input.maxPendingLookupsPerPeer) === undefined &&
    input.maxPendingLookupsPerPeer > input.maxPendingLookups
  ) {
    issues.push({
      flag: "max-pending-lookups-per-peer",
      message: `must not exceed --max-pending-lookups (${input.maxPendingLookups}; got ${input.maxPendingLookupsPerPeer})`
    })
  }
  if (input.engineDrivenTransport !== undefined) check("engine-driven-transport", rules.engineDrivenTransport(input.engineDrivenTransport))
  check("prepare-ttl-seconds", rules.prepareTtl(input.prepareTtlSeconds))
  check("tenant-max-instances", rules.positiveInt(input.tenantMaxInstances))
  check("tenant-max-registers-per-second", rules.positiveInt(input.tenantMaxRegistersPerSecond))
  check("tenant-max-mapped-bytes", rules.positiveInt(input.tenantMaxMappedBytes))
  if (input.maxQueuedReplyBytesPerPeer !== undefined) {
    check("max-queued-reply-bytes-per-peer", rules.queuedReplyBytes(input.maxQueuedReplyBytesPerPeer))
  }
  check("http-idle-timeout-seconds", rules.httpIdleTimeout(input.httpIdleTimeoutSeconds))
  const maxMappings = input.maxMappings ?? defaultMaxMappings(kernel.value)
  const maxMappingsProblem = rules.maxMappings(maxMappings, kernel)
  check("max-mappings", maxMappingsProblem)
  const maxSegmentsPerRegister = input.maxSegmentsPerRegister ?? Math.min(DEFAULT_MAX_SEGMENTS_PER_REGISTER, maxMappings)
  // Against --max-mappings only once that one is valid (one broken rule, one message).
  check(
    "max-segments-per-register",
    maxMappingsProblem === undefined
      ? rules.maxSegmentsPerRegister(maxSegmentsPerRegister, maxMappings)
      : input.maxSegmentsPerRegister === undefined ? undefined : rules.positiveInt(maxSegmentsPerRegister)
  )
  check("max-mapped-bytes", rules.positiveInt(input.maxMappedBytes))
  const curveOn = input.curveSecretKeyFile !== undefined || input.curveAuthorizedKeys !== undefined
  if (curveOn && input.curveSecretKeyFile === undefined) {
    issues.push({ flag: "curve-secret-key-file", message: "--curve-authorized-keys needs the server's secret key file too" })
  }
  if (curveOn && input.curveAuthorizedKeys === undefined) {
    issues.push({ flag: "curve-authorized-keys", message: "--curve-secret-key-file needs the authorized-keys file too" })
  }
  // Fail closed (issue 24 item 7): under tenancy no client may map the pool that holds every tenant's chunks.
  if (curveOn && input.engineDrivenTransport === "shm") issues.push({ flag: "engine-driven-transport", message: SHM_UNDER_TENANCY })
  const engineDrivenTransport: EngineDrivenTransport = input.engineDrivenTransport ?? (curveOn ? "inline" : "shm")
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
  if (!isLoopbackHost(input.httpHost) && input.httpTokenFile === undefined) {
    issues.push({
      flag: "http-host",
      message: `${input.httpHost} is not a loopback address: an HTTP frontend beyond loopback needs --http-token-file (every request then needs Authorization: Bearer <token>)`
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
  const l2 = validateL2(input.l2, issues)
  const budget = descriptorBudget(input.descriptorLimit, input.descriptorCaps)
  if ("issues" in budget) issues.push(...budget.issues)
  if (issues.length > 0 || "issues" in budget) return { issues }
  return {
    config: {
      endpoint,
      httpHost: input.httpHost,
      httpPort: input.httpPort,
      chunkSizeTokens: input.chunkSize,
      l1SizeGb: input.l1SizeGb,
      l1Prefault: input.l1Prefault,
      namedSegments: input.namedSegments,
      unlinkReapedSegments: input.unlinkReapedSegments,
      fdSocket: input.fdSocket,
      requireSealedMemfd: input.requireSealedMemfd,
      fdTokenTtlSeconds: input.fdTokenTtlSeconds,
      maxCpuWorkers: input.maxCpuWorkers ?? input.maxWorkers,
      maxGpuWorkers: input.maxGpuWorkers ?? input.maxWorkers,
      logFormat: input.logFormat,
      workerReapTimeoutSeconds: input.workerReapTimeoutSeconds,
      workerRegistrationGraceSeconds: grace,
      workerDisconnectGraceSeconds: input.workerDisconnectGraceSeconds,
      lookupLockTtlSeconds: input.lookupLockTtlSeconds,
      lookupLimits: {
        maxPendingLookups: input.maxPendingLookups,
        maxPendingLookupsPerPeer: input.maxPendingLookupsPerPeer,
        maxLookupLocks: input.maxLookupLocks
      },
      engineDrivenTransport,
      prepareTtlSeconds: input.prepareTtlSeconds,
      curve: input.curveSecretKeyFile !== undefined && input.curveAuthorizedKeys !== undefined
        ? { secretKeyFile: input.curveSecretKeyFile, authorizedKeysFile: input.curveAuthorizedKeys }
        : undefined,
      insecureAllowRemote: input.insecureAllowRemote,
      ipcGroupId,
      httpTokenFile: input.httpTokenFile,
      tenantLimits: {
        maxInstances: input.tenantMaxInstances,
        maxRegistersPerSecond: input.tenantMaxRegistersPerSecond,
        maxMappedBytes: input.tenantMaxMappedBytes
      },
      mapLimits: { kernelMaxMapCount: kernel, maxMappings, maxSegmentsPerRegister, maxMappedBytes: input.maxMappedBytes },
      l2,
      descriptors: budget.budget,
      maxQueuedReplyBytesPerPeer: input.maxQueuedReplyBytesPerPeer ?? defaultMaxQueuedReplyBytesPerPeer(input.l1SizeGb),
      httpIdleTimeoutSeconds: input.httpIdleTimeoutSeconds
    }
  }
}

/**
 * Where the descriptor socket goes when `--fd-socket` is not given (issue 13
 * item 2): next to an ipc endpoint's socket file (`<file>.fds`); else
 * `$XDG_RUNTIME_DIR/mpcache-<host>-<port>.fds` (`<port>` = `pid<N>` for an
 * ephemeral port `*`), or under /run without it
 * (the temp folder when /run is not writable; the socket is mode 0600
 * wherever it is).
 */
export const defaultFdSocket = (endpoint: string, runtimeDir: string | undefined = process.env["XDG_RUNTIME_DIR"]): string => {
  if (endpoint.startsWith("ipc://")) return `${endpoint.slice("ipc://".length)}.fds`
  // An ephemeral port ("*") is known only after the bind: the process id keeps such servers apart.
  const tag = endpoint.replace(/^[a-z]+:\/\//, "").replace(/:\*$/, `:pid${process.pid}`).replace(/[^A-Za-z0-9.]+/g, "-").replace(/^-|-$/g, "")
  const dir = runtimeDir !== undefined && runtimeDir.length > 0 ? runtimeDir : writable("/run") ? "/run" : tmpdir()
  return `${dir}/mpcache-${tag}.fds`
}

const writable = (dir: string): boolean => {
  try {
    accessSync(dir, constants.W_OK)
    return true
  } catch {
    return false
  }
}

/** The server's configuration as a service. */
export class ServerConfig extends Context.Service<ServerConfig, ServerConfigShape>()("mpcache/services/server/ServerConfig") {
  /** A fixed configuration (already validated). */
  static readonly layer = (config: ServerConfigShape) => Layer.succeed(this, config)
  /**
   * The defaults with `overrides` applied, validated; dies with `ConfigInvalid` on a broken rule.
   * For tests.
   */
  static readonly layerTest = (overrides: Partial<ServerConfigInput> = {}) =>
    Layer.effect(
      this,
      Effect.suspend(() => {
        // Tests create many pools: no background prefault unless asked.
        const result = validate({ ...defaults, l1Prefault: false, ...overrides })
        return "issues" in result ? Effect.die(new ConfigInvalid({ issues: result.issues })) : Effect.succeed(result.config)
      })
    )
}
