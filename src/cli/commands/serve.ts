/**
 * `mpcache serve`: parses and validates every flag of DESIGN §5 and §7, then
 * runs the server until SIGINT/SIGTERM (stop receiving, finish in-flight
 * requests, run finalizers, exit 0). An invalid value exits 2 naming the flag
 * and the rule.
 */
import { CommandFailed } from "../CommandFailed.ts"
import { Effect, Option } from "effect"
import { CliError, Command, Flag } from "effect/cli"
import { loggerLayer } from "../../layers/Logging.ts"
import { ServerLive } from "../../layers/Server.ts"
import {
  defaults,
  ENGINE_DRIVEN_TRANSPORTS,
  formatIssue,
  NAMED_SEGMENTS,
  type NamedSegments,
  rules,
  validate,
  type ServerConfigInput
} from "../../services/server/ServerConfig.ts"
import { VERSION } from "../../version.ts"
import * as F from "./flags.ts"
import { launchLogged } from "../../layers/LaunchLogged.ts"
import { descriptorCapsOf, descriptorFlags } from "./descriptorFlags.ts"
import { l2Flags, l2InputOf } from "./l2Flags.ts"
import { raiseDescriptorLimit } from "../../native/ProcessLimits.ts"
import { DEFAULT_MAX_SEGMENTS_PER_REGISTER } from "../../services/server/MapLimits.ts"
import { MAX_CHUNK_SIZE_TOKENS } from "../../schema/Limits.ts"

// Each with its default shown in --help (F.described).
const int = (name: string, description: string, fallback: number, rule: (n: number) => string | undefined, shown: string | number = fallback) =>
  Flag.Int(name).pipe(
    Flag.withDescription(F.described(description, shown)),
    Flag.withDefault(fallback),
    Flag.filter((n) => rule(n) === undefined, (n) => rule(n) ?? "")
  )
const seconds = (name: string, description: string, fallback: number, rule: (n: number) => string | undefined) =>
  Flag.Finite(name).pipe(
    Flag.withDescription(F.described(description, fallback)),
    Flag.withDefault(fallback),
    Flag.filter((n) => rule(n) === undefined, (n) => rule(n) ?? "")
  )

const serveFlags = {
  host: F.host,
  port: F.port,
  endpoint: F.endpoint,
  httpHost: F.httpHost,
  httpPort: F.httpPort,
  chunkSize: int("chunk-size", `Tokens per chunk, 1 to ${MAX_CHUNK_SIZE_TOKENS}`, defaults.chunkSize, rules.chunkSize),
  l1SizeGb: Flag.Finite("l1-size-gb").pipe(
    Flag.withDescription(F.described("L1 (host memory) capacity in GiB; > 0, at most 65536", defaults.l1SizeGb)),
    Flag.withDefault(defaults.l1SizeGb),
    Flag.filter((n) => rules.l1SizeGb(n) === undefined, (n) => rules.l1SizeGb(n) ?? "")
  ),
  l1Prefault: Flag.Boolean("l1-prefault").pipe(
    Flag.withDescription(F.described("Prefault the L1 pool's pages in the background at start (--no-l1-prefault to skip)", defaults.l1Prefault)),
    Flag.withDefault(defaults.l1Prefault)
  ),
  namedSegments: Flag.Literals("named-segments", NAMED_SEGMENTS).pipe(
    Flag.withDescription(F.described("REGISTER of named shared-memory segments (cpu_shm): allow, or deny (refused with invalid_argument)", defaults.namedSegments)),
    Flag.withDefault<NamedSegments>(defaults.namedSegments)
  ),
  unlinkReapedSegments: Flag.Boolean("unlink-reaped-segments").pipe(
    Flag.withDescription(F.described(
      "After a reap (disconnect or timeout), unlink the instance's cpu_shm names that still name the memory it mapped",
      defaults.unlinkReapedSegments
    )),
    Flag.withDefault(defaults.unlinkReapedSegments)
  ),
  fdSocket: Flag.String("fd-socket").pipe(
    Flag.withDescription(F.described(
      "Unix socket cpu_memfd descriptors are passed on: a path (mode 0600), @name (abstract namespace) or off; at most 107 bytes",
      "next to an ipc endpoint (ENDPOINT.fds), else under $XDG_RUNTIME_DIR or /run"
    )),
    Flag.filter((s) => rules.fdSocket(s) === undefined, (s) => rules.fdSocket(s) ?? ""),
    Flag.optional
  ),
  requireSealedMemfd: Flag.Boolean("require-sealed-memfd").pipe(
    Flag.withDescription(F.described("Refuse passed memfds not sealed with F_SEAL_SHRINK and F_SEAL_SEAL (invalid_argument)", defaults.requireSealedMemfd)),
    Flag.withDefault(defaults.requireSealedMemfd)
  ),
  fdTokenTtlSeconds: seconds(
    "fd-token-ttl-seconds",
    "Passed descriptors not registered within this many seconds are closed; > 0",
    defaults.fdTokenTtlSeconds,
    rules.fdTokenTtl
  ),
  maxWorkers: int("max-workers", "Default size of the NORMAL and AFFINITY pools, 1 to 1024", defaults.maxWorkers, rules.workers),
  maxCpuWorkers: Flag.Int("max-cpu-workers").pipe(
    Flag.withDescription(F.described("NORMAL pool size, 1 to 1024", "--max-workers")),
    Flag.filter((n) => rules.workers(n) === undefined, (n) => rules.workers(n) ?? ""),
    Flag.optional
  ),
  maxGpuWorkers: Flag.Int("max-gpu-workers").pipe(
    Flag.withDescription(F.described("AFFINITY lanes, 1 to 1024", "--max-workers")),
    Flag.filter((n) => rules.workers(n) === undefined, (n) => rules.workers(n) ?? ""),
    Flag.optional
  ),
  logFormat: F.logFormat,
  workerReapTimeoutSeconds: seconds(
    "worker-reap-timeout-seconds",
    "Reap an instance proven alive (pinged and transferring) after this much silence; 0 disables, else >= 30",
    defaults.workerReapTimeoutSeconds,
    rules.reapTimeout
  ),
  workerRegistrationGraceSeconds: Flag.Finite("worker-registration-grace-seconds").pipe(
    Flag.withDescription(F.described(
      "Reap window of instances not yet proven alive; >= the reap timeout. With CURVE also how long a released instance id stays bound to its tenant",
      defaults.workerRegistrationGraceSeconds
    )),
    Flag.withDefault(defaults.workerRegistrationGraceSeconds)
  ),
  workerDisconnectGraceSeconds: seconds(
    "worker-disconnect-grace-seconds",
    "Reap an instance this long after its last connection closed; 0 disables",
    defaults.workerDisconnectGraceSeconds,
    rules.disconnectGrace
  ),
  lookupLockTtlSeconds: seconds(
    "lookup-lock-ttl-seconds",
    "Release prefetch read locks a scheduler never freed after this many seconds; >= 1",
    defaults.lookupLockTtlSeconds,
    rules.lockTtl
  ),
  maxPendingLookups: int(
    "max-pending-lookups",
    "Pending lookups (request ids holding read locks or an unreported count) the server keeps; over it the oldest is released; >= 1",
    defaults.maxPendingLookups,
    rules.positiveInt
  ),
  maxPendingLookupsPerPeer: int(
    "max-pending-lookups-per-peer",
    "Pending lookups one peer (connection) may have; over it its oldest is released; >= 1, <= --max-pending-lookups",
    defaults.maxPendingLookupsPerPeer,
    rules.positiveInt
  ),
  kvEventLogSize: int(
    "kv-event-log-size",
    "Records of the KV event log routers read (chunks stored and removed, docs/kv-events.md); 0 turns events off; 0 to 4194304",
    defaults.kvEventLogSize,
    rules.kvEventLogSize
  ),
  kvEventsEndpoint: F.optionalEndpoint(
    "kv-events-endpoint",
    "ZeroMQ PUB endpoint publishing vLLM's KVEventBatch (frames: topic, 8-byte big-endian sequence number, msgpack); with CURVE admins only",
    "off"
  ),
  kvEventsReplayEndpoint: F.optionalEndpoint(
    "kv-events-replay-endpoint",
    "ZeroMQ ROUTER endpoint answering a missed sequence number with every buffered batch from it on, then an end marker (vLLM's replay); needs --kv-events-endpoint",
    "off"
  ),
  kvEventsTopic: Flag.String("kv-events-topic").pipe(
    Flag.withDescription(F.described("Topic frame of every published batch (vLLM's topic); at most 255 bytes", defaults.kvEventsTopic)),
    Flag.filter((s) => rules.kvEventsTopic(s) === undefined, (s) => rules.kvEventsTopic(s) ?? ""),
    Flag.withDefault(defaults.kvEventsTopic)
  ),
  kvEventsHwm: int(
    "kv-events-hwm",
    "Batches the KV event PUB queues per subscriber before it drops that subscriber's copies (vLLM's hwm; the subscriber sees the gap and replays); 1 to 10000000",
    defaults.kvEventsHwm,
    rules.kvEventsHwm
  ),
  maxLookupLocks: int(
    "max-lookup-locks",
    "Read locks all pending lookups may hold (one per L1 object each); over it the oldest lookups are released; >= 1",
    defaults.maxLookupLocks,
    rules.positiveInt
  ),
  engineDrivenTransport: Flag.Literals("engine-driven-transport", ENGINE_DRIVEN_TRANSPORTS).pipe(
    Flag.withDescription(F.described(
      "Engine-driven transfers: shm (workers map the L1 pool and copy through slots) or inline (KV bytes in the messages); with CURVE shm is refused (it shares the pool with every tenant)",
      "shm, inline with CURVE"
    )),
    Flag.optional
  ),
  prepareTtlSeconds: seconds(
    "prepare-ttl-seconds",
    "Release an engine-driven PREPARE_STORE / PREPARE_RETRIEVE not committed within this long; > 0",
    defaults.prepareTtlSeconds,
    rules.prepareTtl
  ),
  curveSecretKeyFile: Flag.String("curve-secret-key-file").pipe(
    Flag.withDescription(F.described("Turn CURVE on: the server's secret key (mpcache keygen NAME writes NAME.key); needs --curve-authorized-keys", "none: CURVE off")),
    Flag.filter((s) => rules.path(s) === undefined, (s) => rules.path(s) ?? ""),
    Flag.optional
  ),
  curveAuthorizedKeys: Flag.String("curve-authorized-keys").pipe(
    Flag.withDescription(F.described("Client public keys allowed in, one '<z85 key> <tenant> [admin] [salt-group=NAME] [l1-share=W]' per line; reread on SIGHUP; needs --curve-secret-key-file", "none: CURVE off")),
    Flag.filter((s) => rules.path(s) === undefined, (s) => rules.path(s) ?? ""),
    Flag.optional
  ),
  insecureAllowRemote: Flag.Boolean("insecure-allow-remote").pipe(
    Flag.withDescription(F.described("Serve a non-loopback TCP address without CURVE (anyone who reaches it may use the server)", defaults.insecureAllowRemote)),
    Flag.withDefault(defaults.insecureAllowRemote)
  ),
  ipcGroup: Flag.String("ipc-group").pipe(
    Flag.withDescription(F.described("Group the ipc:// socket file belongs to (mode 0660 instead of 0600)", "none: mode 0600, the server's group")),
    Flag.optional
  ),
  httpTokenFile: Flag.String("http-token-file").pipe(
    Flag.withDescription(F.described("File holding a bearer token every HTTP request must carry (needed for a non-loopback --http-host)", "none: no token")),
    Flag.filter((s) => rules.path(s) === undefined, (s) => rules.path(s) ?? ""),
    Flag.optional
  ),
  tenantMaxInstances: int("tenant-max-instances", "Instances one tenant may hold registered (CURVE on); >= 1", defaults.tenantMaxInstances, rules.positiveInt),
  tenantMaxRegistersPerSecond: int(
    "tenant-max-registers-per-second",
    "REGISTERs one tenant may send per second (CURVE on); >= 1",
    defaults.tenantMaxRegistersPerSecond,
    rules.positiveInt
  ),
  tenantMaxMappedBytes: int(
    "tenant-max-mapped-bytes",
    "Bytes of worker memory one tenant's registrations may map (CURVE on); >= 1",
    defaults.tenantMaxMappedBytes,
    rules.positiveInt,
    `the machine's RAM (${defaults.tenantMaxMappedBytes})`
  ),
  tenantL1ShareDefault: seconds(
    "tenant-l1-share-default",
    "A tenant's weight in L1 unless its authorized-keys lines say l1-share=W (CURVE on): when L1 must evict it takes first from the salt group furthest over its share (its weight over those of the groups holding L1), and an idle group's share is lent; > 0",
    defaults.tenantL1ShareDefault,
    rules.l1Share
  ),
  maxMappings: Flag.Int("max-mappings").pipe(
    Flag.withDescription(F.described(
      "Mappings of worker memory the server holds at once, over every instance, with or without CURVE; >= 1, at most vm.max_map_count - 16384",
      "half the kernel's vm.max_map_count, read at start"
    )),
    Flag.filter((n) => rules.positiveInt(n) === undefined, (n) => rules.positiveInt(n) ?? ""),
    Flag.optional
  ),
  maxSegmentsPerRegister: Flag.Int("max-segments-per-register").pipe(
    Flag.withDescription(F.described("Distinct segments one REGISTER (or CB_REGISTER_ROPE) may name; >= 1, at most --max-mappings", DEFAULT_MAX_SEGMENTS_PER_REGISTER)),
    Flag.filter((n) => rules.positiveInt(n) === undefined, (n) => rules.positiveInt(n) ?? ""),
    Flag.optional
  ),
  maxMappedBytes: int(
    "max-mapped-bytes",
    "Bytes of worker host memory (cpu_shm, cpu_memfd) the server maps at once, over every instance, with or without CURVE; >= 1",
    defaults.maxMappedBytes,
    rules.positiveInt,
    `half the machine's RAM (${defaults.maxMappedBytes})`
  ),
  maxQueuedReplyBytesPerPeer: Flag.Int("max-queued-reply-bytes-per-peer").pipe(
    Flag.withDescription(F.described(
      "Bytes of replies queued to one connection (in its ZeroMQ pipe, and waiting in its outbox, each); past it a reply is refused with overloaded; >= 65536",
      "the L1 size + 1 MiB, at least 256 MiB"
    )),
    Flag.filter((n) => rules.queuedReplyBytes(n) === undefined, (n) => rules.queuedReplyBytes(n) ?? ""),
    Flag.optional
  ),
  httpIdleTimeoutSeconds: seconds(
    "http-idle-timeout-seconds",
    "Close an HTTP connection that has not sent a complete request head this long after connecting or after its last response; 0.1 to 300",
    defaults.httpIdleTimeoutSeconds,
    rules.httpIdleTimeout
  ),
  ...l2Flags,
  ...descriptorFlags
}

type FlagValue<T> = T extends Flag.Flag<infer A> ? A : never
type ServeFlags = { readonly [K in keyof typeof serveFlags]: FlagValue<(typeof serveFlags)[K]> }

const toInput = (f: ServeFlags): ServerConfigInput => ({
  host: f.host,
  port: f.port,
  endpoint: Option.getOrUndefined(f.endpoint),
  httpHost: f.httpHost,
  httpPort: f.httpPort,
  chunkSize: f.chunkSize,
  l1SizeGb: f.l1SizeGb,
  l1Prefault: f.l1Prefault,
  namedSegments: f.namedSegments,
  unlinkReapedSegments: f.unlinkReapedSegments,
  fdSocket: Option.getOrUndefined(f.fdSocket),
  requireSealedMemfd: f.requireSealedMemfd,
  fdTokenTtlSeconds: f.fdTokenTtlSeconds,
  maxWorkers: f.maxWorkers,
  maxCpuWorkers: Option.getOrUndefined(f.maxCpuWorkers),
  maxGpuWorkers: Option.getOrUndefined(f.maxGpuWorkers),
  logFormat: f.logFormat,
  workerReapTimeoutSeconds: f.workerReapTimeoutSeconds,
  workerRegistrationGraceSeconds: f.workerRegistrationGraceSeconds,
  workerDisconnectGraceSeconds: f.workerDisconnectGraceSeconds,
  lookupLockTtlSeconds: f.lookupLockTtlSeconds,
  maxPendingLookups: f.maxPendingLookups,
  maxPendingLookupsPerPeer: f.maxPendingLookupsPerPeer,
  maxLookupLocks: f.maxLookupLocks,
  kvEventLogSize: f.kvEventLogSize,
  kvEventsEndpoint: Option.getOrUndefined(f.kvEventsEndpoint),
  kvEventsReplayEndpoint: Option.getOrUndefined(f.kvEventsReplayEndpoint),
  kvEventsTopic: f.kvEventsTopic,
  kvEventsHwm: f.kvEventsHwm,
  engineDrivenTransport: Option.getOrUndefined(f.engineDrivenTransport),
  prepareTtlSeconds: f.prepareTtlSeconds,
  curveSecretKeyFile: Option.getOrUndefined(f.curveSecretKeyFile),
  curveAuthorizedKeys: Option.getOrUndefined(f.curveAuthorizedKeys),
  insecureAllowRemote: f.insecureAllowRemote,
  ipcGroup: Option.getOrUndefined(f.ipcGroup),
  httpTokenFile: Option.getOrUndefined(f.httpTokenFile),
  tenantMaxInstances: f.tenantMaxInstances,
  tenantMaxRegistersPerSecond: f.tenantMaxRegistersPerSecond,
  tenantMaxMappedBytes: f.tenantMaxMappedBytes,
  tenantL1ShareDefault: f.tenantL1ShareDefault,
  maxMappings: Option.getOrUndefined(f.maxMappings),
  maxSegmentsPerRegister: Option.getOrUndefined(f.maxSegmentsPerRegister),
  maxMappedBytes: f.maxMappedBytes,
  l2: l2InputOf(f),
  // The budget is taken from the limit as raised (idempotent: validate runs twice, in Command.validate and the handler).
  descriptorLimit: raiseDescriptorLimit().soft,
  descriptorCaps: descriptorCapsOf(f),
  maxQueuedReplyBytesPerPeer: Option.getOrUndefined(f.maxQueuedReplyBytesPerPeer),
  httpIdleTimeoutSeconds: f.httpIdleTimeoutSeconds
})

/** A key file the server was given cannot be used: exit 2 naming the file (and line). */
const badKeyFile = (reason: string) =>
  Effect.logError(`mpcache cannot start: ${reason}`).pipe(
    Effect.andThen(Effect.fail(new CommandFailed({ message: reason, exitCode: 2 })))
  )

/** Logs why the server cannot start as its last line and fails with exit status 1. */
const cannotStart = (reason: string) =>
  Effect.logError(`mpcache cannot start: ${reason}`).pipe(
    Effect.andThen(Effect.fail(new CommandFailed({ message: reason, exitCode: 1 })))
  )

export const serve = Command.make("serve", serveFlags, (flags) =>
  Effect.gen(function*() {
    const result = validate(toInput(flags))
    if ("issues" in result) return yield* Effect.die("unreachable: validated by Command.validate")
    const config = result.config
    yield* Effect.logInfo(`mpcache ${VERSION} starting`, {
      endpoint: config.endpoint,
      http: `${config.httpHost}:${config.httpPort}`,
      chunk_size: config.chunkSizeTokens,
      max_cpu_workers: config.maxCpuWorkers,
      max_gpu_workers: config.maxGpuWorkers,
      worker_reap_timeout_seconds: config.workerReapTimeoutSeconds,
      worker_registration_grace_seconds: config.workerRegistrationGraceSeconds,
      worker_disconnect_grace_seconds: config.workerDisconnectGraceSeconds,
      engine_driven_transport: config.engineDrivenTransport,
      prepare_ttl_seconds: config.prepareTtlSeconds,
      curve: config.curve !== undefined,
      l2: config.l2?.url.display ?? "off",
      max_mappings: config.mapLimits.maxMappings,
      max_segments_per_register: config.mapLimits.maxSegmentsPerRegister,
      max_mapped_bytes: config.mapLimits.maxMappedBytes,
      kernel_max_map_count: config.mapLimits.kernelMaxMapCount.value,
      max_queued_reply_bytes_per_peer: config.maxQueuedReplyBytesPerPeer,
      http_idle_timeout_seconds: config.httpIdleTimeoutSeconds,
      descriptors: `limit ${config.descriptors.limit}: ZeroMQ ${config.descriptors.zmqConnections}, HTTP ${config.descriptors.httpConnections}, descriptor socket ${config.descriptors.fdSocketConnections} (${config.descriptors.fdSocketConnectionsPerUid} per uid), passed ${config.descriptors.passedDescriptors} (${config.descriptors.passedDescriptorsPerPeer} per peer)`
    })
    if (config.mapLimits.kernelMaxMapCount.source === "fallback") {
      yield* Effect.logWarning(
        `${config.mapLimits.kernelMaxMapCount.reason}: assuming vm.max_map_count ${config.mapLimits.kernelMaxMapCount.value} (Linux's default) for --max-mappings`
      )
    }
    if (config.curve === undefined && config.insecureAllowRemote) {
      yield* Effect.logWarning(
        `--insecure-allow-remote: serving ${config.endpoint} without CURVE; anyone who can reach it may register memory, unregister instances and CLEAR the cache`
      )
    }
    yield* launchLogged(ServerLive(config)).pipe(
      // A server that cannot start says why on its last line (what failed, the errno, the size or endpoint),
      // without a stack trace, and exits 1 (issue 18).
      Effect.catchTags({
        L1PoolError: (e) => cannotStart(e.message),
        ZmqError: (e) => cannotStart(e.message),
        NativeError: (e) => cannotStart(e.message),
        KeyFileInvalid: (e) => badKeyFile(e.message),
        AuthorizedKeysInvalid: (e) => badKeyFile(e.message),
        HttpTokenInvalid: (e) => badKeyFile(e.message),
        L2SecretInvalid: (e) => badKeyFile(e.message)
      })
    )
  }).pipe(Effect.provide(loggerLayer(flags.logFormat)))).pipe(
  Command.withDescription("Run the mpcache server (ZeroMQ ROUTER + HTTP frontend)"),
  Command.validate((flags) => {
    const result = validate(toInput(flags))
    return "issues" in result
      ? Effect.fail(new CliError.ValidationError({ message: result.issues.map(formatIssue).join("\n") }))
      : Effect.void
  })
)
