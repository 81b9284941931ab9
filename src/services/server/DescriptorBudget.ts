/**
 * The server's descriptor budget (issue 24 items 8, 9 and 11): every listener that hands out file descriptors
 * — the ZeroMQ endpoint, the HTTP frontend, the descriptor socket — and the passed descriptors the server holds
 * between a descriptor request and its REGISTER each get a cap, so that no one of them can use up the table and
 * starve the others (a new worker's connection, a REGISTER's mappings, the status page).
 *
 * The budget is taken from RLIMIT_NOFILE as the process has it at start, after `mpcache serve` raised the soft
 * limit to the hard one (src/native/addon/limits.cc). Each cap has a flag; a flag left out takes its share of the
 * limit below. The caps together must leave {@link MIN_HEADROOM} descriptors for the rest of the process (Node
 * and libuv, libzmq's own sockets and signalers, Redis, log and key files, a REGISTER's segments between open and
 * mmap): a configuration that does not is refused at start, naming the flags (exit 2).
 */
import { readFileSync } from "node:fs"

/** The caps, in descriptors (connections are one descriptor each). */
export interface DescriptorBudget {
  /** RLIMIT_NOFILE's soft limit the budget was taken from. */
  readonly limit: number
  /** Concurrent ZeroMQ connections (`--max-zmq-connections`; default 1/2 of the limit). */
  readonly zmqConnections: number
  /** Concurrent HTTP connections (`--max-http-connections`; default 1/32 of the limit, at most 1024). */
  readonly httpConnections: number
  /** Concurrent descriptor-socket connections, all senders (`--fd-socket-max-connections`; default 1/64 of the limit, at most 128). */
  readonly fdSocketConnections: number
  /** Concurrent descriptor-socket connections of one uid (`--fd-socket-max-connections-per-uid`; default 1/8 of the above, at least 1). */
  readonly fdSocketConnectionsPerUid: number
  /** Passed descriptors held for tokens not yet registered, all peers (`--max-passed-descriptors`; default 1/8 of the limit). */
  readonly passedDescriptors: number
  /** Passed descriptors held for one ZeroMQ peer (`--max-passed-descriptors-per-peer`; default 1/8 of the above, at least 64). */
  readonly passedDescriptorsPerPeer: number
  /** What the caps leave for everything else (at least {@link MIN_HEADROOM}). */
  readonly headroom: number
}

/** The explicit caps of `mpcache serve` (undefined: the default share of the limit). */
export interface DescriptorBudgetInput {
  readonly maxZmqConnections: number | undefined
  readonly maxHttpConnections: number | undefined
  readonly fdSocketMaxConnections: number | undefined
  readonly fdSocketMaxConnectionsPerUid: number | undefined
  readonly maxPassedDescriptors: number | undefined
  readonly maxPassedDescriptorsPerPeer: number | undefined
}

/** The caps all left to their defaults. */
export const descriptorBudgetDefaults: DescriptorBudgetInput = {
  maxZmqConnections: undefined,
  maxHttpConnections: undefined,
  fdSocketMaxConnections: undefined,
  fdSocketMaxConnectionsPerUid: undefined,
  maxPassedDescriptors: undefined,
  maxPassedDescriptorsPerPeer: undefined
}

/** Descriptors the caps must leave to the rest of the process (see the module comment). */
export const MIN_HEADROOM = 64

/** The least RLIMIT_NOFILE the server starts with: the headroom and a few of each kind. */
export const MIN_DESCRIPTOR_LIMIT = 256

/**
 * RLIMIT_NOFILE's soft limit as /proc/self/limits says it ("Max open files"); 1024 (the usual default) when it
 * cannot be read. The limit `validate` budgets when the CLI did not raise and pass it.
 */
export const currentDescriptorLimit = (): number => {
  try {
    const line = readFileSync("/proc/self/limits", "utf8").split("\n").find((l) => l.startsWith("Max open files"))
    const soft = line?.slice("Max open files".length).trim().split(/\s+/)[0]
    if (soft === "unlimited") return Number.MAX_SAFE_INTEGER
    return soft !== undefined && /^\d+$/.test(soft) ? Number(soft) : 1024
  } catch {
    return 1024
  }
}

/** One broken rule of the budget: the flag and what it must be (as ServerConfig's issues). */
export interface BudgetIssue {
  readonly flag: string
  readonly message: string
}

/**
 * The budget for `limit` descriptors with the explicit caps of `input`, or the rules it breaks, each naming its
 * flag: a limit under {@link MIN_DESCRIPTOR_LIMIT}, a per-uid or per-peer cap above its total, caps that together
 * leave less than {@link MIN_HEADROOM}.
 */
export const descriptorBudget = (
  limit: number,
  input: DescriptorBudgetInput
): { readonly budget: DescriptorBudget } | { readonly issues: ReadonlyArray<BudgetIssue> } => {
  // An unlimited soft limit is budgeted as a large finite one: the caps stay meaningful.
  const l = Math.min(limit, 1 << 24)
  if (l < MIN_DESCRIPTOR_LIMIT) {
    return {
      issues: [{
        flag: "max-zmq-connections",
        message: `the process may open only ${l} descriptors (RLIMIT_NOFILE, hard limit included); mpcache needs at least ${MIN_DESCRIPTOR_LIMIT} (raise it: ulimit -n, LimitNOFILE=)`
      }]
    }
  }
  const zmqConnections = input.maxZmqConnections ?? Math.floor(l / 2)
  const httpConnections = input.maxHttpConnections ?? Math.max(8, Math.min(1024, Math.floor(l / 32)))
  const fdSocketConnections = input.fdSocketMaxConnections ?? Math.max(4, Math.min(128, Math.floor(l / 64)))
  const fdSocketConnectionsPerUid = input.fdSocketMaxConnectionsPerUid ?? Math.max(1, Math.floor(fdSocketConnections / 8))
  const passedDescriptors = input.maxPassedDescriptors ?? Math.floor(l / 8)
  const passedDescriptorsPerPeer = input.maxPassedDescriptorsPerPeer ?? Math.min(passedDescriptors, Math.max(64, Math.floor(passedDescriptors / 8)))
  const issues: Array<BudgetIssue> = []
  if (fdSocketConnectionsPerUid > fdSocketConnections) {
    issues.push({
      flag: "fd-socket-max-connections-per-uid",
      message: `must be at most --fd-socket-max-connections (${fdSocketConnections}), got ${fdSocketConnectionsPerUid}`
    })
  }
  if (passedDescriptorsPerPeer > passedDescriptors) {
    issues.push({
      flag: "max-passed-descriptors-per-peer",
      message: `must be at most --max-passed-descriptors (${passedDescriptors}), got ${passedDescriptorsPerPeer}`
    })
  }
  const used = zmqConnections + httpConnections + fdSocketConnections + passedDescriptors
  const headroom = l - used
  if (headroom < MIN_HEADROOM) {
    const named = ([
      ["max-zmq-connections", input.maxZmqConnections],
      ["max-http-connections", input.maxHttpConnections],
      ["fd-socket-max-connections", input.fdSocketMaxConnections],
      ["max-passed-descriptors", input.maxPassedDescriptors]
    ] as const).filter(([, v]) => v !== undefined).map(([f]) => f)
    issues.push({
      flag: named[0] ?? "max-zmq-connections",
      message: `the caps (ZeroMQ ${zmqConnections} + HTTP ${httpConnections} + descriptor socket ${fdSocketConnections} + passed descriptors ${passedDescriptors} = ${used}) must leave at least ${MIN_HEADROOM} of the process's ${l} descriptors (RLIMIT_NOFILE) for everything else${named.length > 1 ? ` (set: ${named.map((f) => `--${f}`).join(", ")})` : ""}`
    })
  }
  if (issues.length > 0) return { issues }
  return {
    budget: {
      limit: l,
      zmqConnections,
      httpConnections,
      fdSocketConnections,
      fdSocketConnectionsPerUid,
      passedDescriptors,
      passedDescriptorsPerPeer,
      headroom
    }
  }
}
