/**
 * The KV event flags (issue 28; docs/kv-events.md): how many records a
 * server keeps for routers to read (`--kv-event-log-size`, default 32768;
 * 0 turns events off) and vLLM's channel: the ZeroMQ PUB routers subscribe
 * to (`--kv-events-endpoint`), its topic and its replay ROUTER.
 *
 * The PUB's and the ROUTER's addresses follow the listen rule of the MQ
 * endpoint (EndpointConfig.ts, fail closed): a non-loopback TCP address
 * needs CURVE or `--insecure-allow-remote`; an ipc socket's folder must not
 * be writable by others.
 */
import { type ConfigIssue, issueCheck } from "./ConfigIssue.ts"
import { unsafeIpcDirectory } from "../../zmq/Sockets.ts"
import { endpointRules, isLoopbackHost, tcpHostOf } from "./EndpointConfig.ts"

/** The most records a log may keep: past it a record's memory (a chunk's token ids) outweighs any router's need. */
export const MAX_KV_EVENT_LOG_SIZE = 1 << 22

/** The validated KV event settings (part of ServerConfigShape). */
export interface KvEventsConfig {
  /** Records kept (`--kv-event-log-size`); 0: events off, nothing recorded, every poll says `enabled: false`. */
  readonly kvEventLogSize: number
  /** The PUB publishing vLLM's `KVEventBatch` (`--kv-events-endpoint`); undefined: none. */
  readonly kvEventsEndpoint: string | undefined
  /** The ROUTER answering replays of missed batches (`--kv-events-replay-endpoint`); undefined: none. */
  readonly kvEventsReplayEndpoint: string | undefined
  /** The first frame of every published message (`--kv-events-topic`, vLLM's `topic`). */
  readonly kvEventsTopic: string
  /**
   * The PUB's send high-water mark per subscriber, in batches (`--kv-events-hwm`, vLLM's `hwm`): past it libzmq
   * drops that subscriber's copies (it sees the sequence gap and replays); the server never waits.
   */
  readonly kvEventsHwm: number
}

/** Default: upstream's log size, no PUB, vLLM's documented topic. */
export const kvEventsDefaults: KvEventsConfig = {
  kvEventLogSize: 32768,
  kvEventsEndpoint: undefined,
  kvEventsReplayEndpoint: undefined,
  kvEventsTopic: "kv-events",
  kvEventsHwm: 100_000
}

/** Single-flag rules of the KV event flags (shared with the CLI's flag filters). */
export const kvEventsRules = {
  kvEventLogSize: (n: number) =>
    Number.isSafeInteger(n) && n >= 0 && n <= MAX_KV_EVENT_LOG_SIZE
      ? undefined
      : `must be an integer from 0 (events off) to ${MAX_KV_EVENT_LOG_SIZE} records (got ${n})`,
  kvEventsHwm: (n: number) =>
    Number.isSafeInteger(n) && n >= 1 && n <= 10_000_000 ? undefined : `must be an integer from 1 to 10000000 batches (got ${n})`,
  kvEventsTopic: (s: string) =>
    Buffer.byteLength(s) <= 255 && !/[\s]/.test(s) ? undefined : `must be at most 255 bytes without white space (got "${s}")`
} as const

/** What the address rules of the PUB and the ROUTER need from the listen flags. */
export interface KvEventsListenContext {
  /** The MQ endpoint (neither KV events socket may take it). */
  readonly endpoint: string
  readonly curveOn: boolean
  readonly insecureAllowRemote: boolean
}

/** Checks the KV event flags, pushing broken rules onto `issues`. */
export const validateKvEvents = (input: KvEventsConfig, listen: KvEventsListenContext, issues: Array<ConfigIssue>): KvEventsConfig => {
  const check = issueCheck(issues)
  check("kv-event-log-size", kvEventsRules.kvEventLogSize(input.kvEventLogSize))
  check("kv-events-topic", kvEventsRules.kvEventsTopic(input.kvEventsTopic))
  check("kv-events-hwm", kvEventsRules.kvEventsHwm(input.kvEventsHwm))
  const address = (flag: string, endpoint: string) => {
    const bad = endpointRules.endpoint(endpoint)
    if (bad !== undefined) return check(flag, bad)
    const host = tcpHostOf(endpoint)
    if (host !== undefined && !isLoopbackHost(host) && !listen.curveOn && !listen.insecureAllowRemote) {
      issues.push({
        flag,
        message: `${host} is not a loopback address: publishing beyond loopback needs CURVE (--curve-secret-key-file and --curve-authorized-keys), or --insecure-allow-remote to let anyone who can reach it read what this server holds`
      })
    }
    if (endpoint === listen.endpoint) issues.push({ flag, message: `is the MQ endpoint (${endpoint}); give the KV event socket an address of its own` })
    check(flag, unsafeIpcDirectory(endpoint))
  }
  if (input.kvEventsEndpoint !== undefined) {
    address("kv-events-endpoint", input.kvEventsEndpoint)
    if (input.kvEventLogSize === 0) issues.push({ flag: "kv-events-endpoint", message: "needs events on: --kv-event-log-size 0 turns them off" })
  }
  if (input.kvEventsEndpoint === undefined && input.kvEventsHwm !== kvEventsDefaults.kvEventsHwm) {
    issues.push({ flag: "kv-events-hwm", message: "applies to the PUB: give --kv-events-endpoint too" })
  }
  if (input.kvEventsReplayEndpoint !== undefined) {
    address("kv-events-replay-endpoint", input.kvEventsReplayEndpoint)
    if (input.kvEventsEndpoint === undefined) issues.push({ flag: "kv-events-replay-endpoint", message: "needs --kv-events-endpoint (it replays that PUB's batches)" })
    if (input.kvEventsReplayEndpoint === input.kvEventsEndpoint) issues.push({ flag: "kv-events-replay-endpoint", message: "is the same address as --kv-events-endpoint" })
  }
  return {
    kvEventLogSize: input.kvEventLogSize,
    kvEventsEndpoint: input.kvEventsEndpoint,
    kvEventsReplayEndpoint: input.kvEventsReplayEndpoint,
    kvEventsTopic: input.kvEventsTopic,
    kvEventsHwm: input.kvEventsHwm
  }
}
