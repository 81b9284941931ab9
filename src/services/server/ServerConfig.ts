/**
 * Server configuration (DESIGN §5, §7): every `mpcache serve` flag with its
 * default and its rule. The CLI parses flags into a `ServerConfigInput` and
 * `validate` turns it into a `ServerConfig` or the list of broken rules,
 * each naming its flag (exit status 2).
 *
 * This module composes the features, each with its shape, flags as parsed,
 * defaults, rules and validation in a module of its own under `config/`
 * (EndpointConfig, HttpConfig, WorkerMemoryConfig, MapLimitsConfig,
 * LivenessConfig, LookupConfig, EngineDrivenConfig, TenancyConfig,
 * KvEventsConfig; beside
 * them l2/L2Config.ts and DescriptorBudget.ts), and holds the server's own
 * settings: chunk size, L1, pools, log format, reply queues.
 */
import { Context, Effect, Layer } from "effect"
import { MAX_CHUNK_SIZE_TOKENS } from "../../schema/Limits.ts"
import { commonRules, type ConfigIssue, ConfigInvalid, issueCheck } from "./config/ConfigIssue.ts"
import { type EndpointConfig, type EndpointConfigInput, checkAddress, curveRequested, endpointDefaults, endpointRules, validateEndpoint } from "./config/EndpointConfig.ts"
import { type EngineDrivenConfig, type EngineDrivenConfigInput, engineDrivenDefaults, engineDrivenRules, validateEngineDriven } from "./config/EngineDrivenConfig.ts"
import { type KvEventsConfig, kvEventsDefaults, kvEventsRules, validateKvEvents } from "./config/KvEventsConfig.ts"
import { type HttpConfig, httpDefaults, httpRules, validateHttp } from "./config/HttpConfig.ts"
import { type LivenessConfig, livenessDefaults, livenessRules, validateLiveness } from "./config/LivenessConfig.ts"
import { type LookupConfig, type LookupConfigInput, lookupDefaults, lookupRules, validateLookup } from "./config/LookupConfig.ts"
import { type MapLimitsConfig, type MapLimitsConfigInput, mapLimitsDefaults, mapLimitsRules, validateMapLimits } from "./config/MapLimitsConfig.ts"
import { l1ShareRule, type TenancyConfig, type TenancyConfigInput, tenancyDefaults, validateTenancy } from "./config/TenancyConfig.ts"
import { validateWorkerMemory, type WorkerMemoryConfig, workerMemoryDefaults, workerMemoryRules } from "./config/WorkerMemoryConfig.ts"
import {
  currentDescriptorLimit,
  type DescriptorBudget,
  descriptorBudget,
  type DescriptorBudgetInput,
  descriptorBudgetDefaults
} from "./DescriptorBudget.ts"
import { type L2Config, type L2ConfigInput, l2Defaults, validateL2 } from "./l2/L2Config.ts"
import { type KernelMapCount, readKernelMaxMapCount } from "./MapLimits.ts"

// The features' public names, where their importers have always found them.
export { type ConfigIssue, ConfigInvalid, formatIssue } from "./config/ConfigIssue.ts"
export { type CurveFiles, isLoopbackHost, tcpHostOf } from "./config/EndpointConfig.ts"
export { ENGINE_DRIVEN_TRANSPORTS, type EngineDrivenTransport, SHM_UNDER_TENANCY } from "./config/EngineDrivenConfig.ts"
export type { LookupLimits } from "./config/LookupConfig.ts"
export type { MapLimitsConfig } from "./config/MapLimitsConfig.ts"
export type { TenantLimits } from "./config/TenancyConfig.ts"
export { defaultFdSocket, NAMED_SEGMENTS, type NamedSegments } from "./config/WorkerMemoryConfig.ts"

/** Output format of the server's logs. */
export type LogFormat = "json" | "pretty"

/** A validated server configuration. */
export interface ServerConfigShape
  extends EndpointConfig, HttpConfig, WorkerMemoryConfig, LivenessConfig, LookupConfig, EngineDrivenConfig, TenancyConfig, KvEventsConfig
{
  /** Tokens per chunk (`--chunk-size`, default 256). */
  readonly chunkSizeTokens: number
  /** L1 capacity in GiB (`--l1-size-gb`, default 1). */
  readonly l1SizeGb: number
  /** Prefault the L1 pool's pages in the background at start (`--l1-prefault`, default true). */
  readonly l1Prefault: boolean
  /** NORMAL pool size (`--max-cpu-workers`, default `--max-workers`). */
  readonly maxCpuWorkers: number
  /** AFFINITY lanes (`--max-gpu-workers`, default `--max-workers`). */
  readonly maxGpuWorkers: number
  readonly logFormat: LogFormat
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
}

/** Flag values as parsed, before the cross-flag rules. */
export interface ServerConfigInput
  extends
    EndpointConfigInput,
    HttpConfig,
    WorkerMemoryConfig,
    MapLimitsConfigInput,
    LivenessConfig,
    LookupConfigInput,
    EngineDrivenConfigInput,
    TenancyConfigInput,
    KvEventsConfig
{
  readonly chunkSize: number
  readonly l1SizeGb: number
  readonly l1Prefault: boolean
  readonly maxWorkers: number
  readonly maxCpuWorkers: number | undefined
  readonly maxGpuWorkers: number | undefined
  readonly logFormat: LogFormat
  readonly l2: L2ConfigInput
  /** RLIMIT_NOFILE's soft limit the descriptor caps are taken from (`mpcache serve` raises it to the hard limit first). */
  readonly descriptorLimit: number
  /** The explicit descriptor caps (`--max-zmq-connections` …); undefined: a share of the limit. */
  readonly descriptorCaps: DescriptorBudgetInput
  /** undefined: the default of {@link ServerConfigShape.maxQueuedReplyBytesPerPeer}. */
  readonly maxQueuedReplyBytesPerPeer: number | undefined
}

/** Defaults of DESIGN §5 and §7 (upstream: port 5555, chunk 256, reap 120 s, grace 3600 s). */
export const defaults: ServerConfigInput = {
  ...endpointDefaults,
  ...httpDefaults,
  chunkSize: 256,
  l1SizeGb: 1,
  l1Prefault: true,
  ...workerMemoryDefaults,
  maxWorkers: 4,
  maxCpuWorkers: undefined,
  maxGpuWorkers: undefined,
  logFormat: "pretty",
  ...livenessDefaults,
  ...lookupDefaults,
  ...engineDrivenDefaults,
  ...tenancyDefaults,
  ...mapLimitsDefaults,
  ...kvEventsDefaults,
  l2: l2Defaults,
  descriptorLimit: currentDescriptorLimit(),
  descriptorCaps: descriptorBudgetDefaults,
  maxQueuedReplyBytesPerPeer: undefined
}

/** The least `--max-queued-reply-bytes-per-peer` takes: more than many small replies. */
export const MIN_QUEUED_REPLY_BYTES_PER_PEER = 65_536

/** The default of `--max-queued-reply-bytes-per-peer` for an L1 of `l1SizeGb` GiB: the L1 plus 1 MiB, at least 256 MiB. */
export const defaultMaxQueuedReplyBytesPerPeer = (l1SizeGb: number): number =>
  Math.max(256 * 2 ** 20, Math.floor(l1SizeGb * 2 ** 30) + 2 ** 20)

/** Single-flag rules of the server's own settings. */
const coreRules = {
  chunkSize: (n: number) =>
    Number.isInteger(n) && n >= 1 && n <= MAX_CHUNK_SIZE_TOKENS ? undefined : `must be an integer from 1 to ${MAX_CHUNK_SIZE_TOKENS} tokens (got ${n})`,
  l1SizeGb: (n: number) => Number.isFinite(n) && n > 0 && n <= 65536 ? undefined : `must be a number of GiB above 0 (got ${n})`,
  workers: (n: number) => Number.isInteger(n) && n >= 1 && n <= 1024 ? undefined : `must be an integer from 1 to 1024 (got ${n})`,
  queuedReplyBytes: (n: number) =>
    Number.isSafeInteger(n) && n >= MIN_QUEUED_REPLY_BYTES_PER_PEER
      ? undefined
      : `must be a number of bytes of at least ${MIN_QUEUED_REPLY_BYTES_PER_PEER} (got ${n})`
} as const

/** Single-flag rules, shared by the CLI's flag filters and `validate`: every feature's, by name. */
export const rules = {
  ...endpointRules,
  ...httpRules,
  ...coreRules,
  ...workerMemoryRules,
  ...livenessRules,
  ...lookupRules,
  ...engineDrivenRules,
  ...mapLimitsRules,
  ...kvEventsRules,
  l1Share: l1ShareRule,
  ...commonRules
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
  const check = issueCheck(issues)
  checkAddress(input, issues)
  const http = validateHttp(input, issues)
  check("chunk-size", coreRules.chunkSize(input.chunkSize))
  check("l1-size-gb", coreRules.l1SizeGb(input.l1SizeGb))
  check("max-workers", coreRules.workers(input.maxWorkers))
  if (input.maxCpuWorkers !== undefined) check("max-cpu-workers", coreRules.workers(input.maxCpuWorkers))
  if (input.maxGpuWorkers !== undefined) check("max-gpu-workers", coreRules.workers(input.maxGpuWorkers))
  if (input.maxQueuedReplyBytesPerPeer !== undefined) {
    check("max-queued-reply-bytes-per-peer", coreRules.queuedReplyBytes(input.maxQueuedReplyBytesPerPeer))
  }
  const workerMemory = validateWorkerMemory(input, issues)
  const mapLimits = validateMapLimits(input, kernel, issues)
  const liveness = validateLiveness(input, issues)
  const lookup = validateLookup(input, issues)
  const engineDriven = validateEngineDriven(input, curveRequested(input), issues)
  const tenancy = validateTenancy(input, issues)
  const endpoint = validateEndpoint(input, issues)
  const l2 = validateL2(input.l2, issues)
  const kvEvents = validateKvEvents(
    input,
    { endpoint: endpoint.endpoint, curveOn: curveRequested(input), insecureAllowRemote: input.insecureAllowRemote },
    issues
  )
  const budget = descriptorBudget(input.descriptorLimit, input.descriptorCaps)
  if ("issues" in budget) issues.push(...budget.issues)
  if (issues.length > 0 || "issues" in budget) return { issues }
  return {
    config: {
      ...endpoint,
      ...http,
      chunkSizeTokens: input.chunkSize,
      l1SizeGb: input.l1SizeGb,
      l1Prefault: input.l1Prefault,
      ...workerMemory,
      maxCpuWorkers: input.maxCpuWorkers ?? input.maxWorkers,
      maxGpuWorkers: input.maxGpuWorkers ?? input.maxWorkers,
      logFormat: input.logFormat,
      ...liveness,
      ...lookup,
      ...engineDriven,
      ...tenancy,
      ...kvEvents,
      mapLimits,
      l2,
      descriptors: budget.budget,
      maxQueuedReplyBytesPerPeer: input.maxQueuedReplyBytesPerPeer ?? defaultMaxQueuedReplyBytesPerPeer(input.l1SizeGb)
    }
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
