/**
 * How worker memory reaches the server (issue 13 items 2 and 3;
 * docs/memfd.md): whether REGISTER may name POSIX shared-memory segments,
 * what happens to a reaped worker's names, and the descriptor socket
 * cpu_memfd descriptors are passed on.
 */
import { accessSync, constants } from "node:fs"
import { tmpdir } from "node:os"
import { type ConfigIssue, issueCheck } from "./ConfigIssue.ts"

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

/** The validated settings (part of ServerConfigShape); the flags as parsed have the same names. */
export interface WorkerMemoryConfig {
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
}

/** Defaults: named segments allowed and kept after a reap; the default descriptor socket, unsealed memfds taken, 30 s tokens. */
export const workerMemoryDefaults: WorkerMemoryConfig = {
  namedSegments: "allow",
  unlinkReapedSegments: false,
  fdSocket: undefined,
  requireSealedMemfd: false,
  fdTokenTtlSeconds: 30
}

/** Single-flag rules of these flags (shared with the CLI's flag filters). */
export const workerMemoryRules = {
  namedSegments: (s: string) =>
    (NAMED_SEGMENTS as ReadonlyArray<string>).includes(s) ? undefined : `must be allow or deny (got "${s}")`,
  fdSocket: (s: string) =>
    s === "off" || (s.length > 1 && !s.includes("\0") && Buffer.byteLength(s) <= 107)
      ? undefined
      : `must be a socket path, @name (abstract namespace) or off, at most 107 bytes (got "${s}")`,
  fdTokenTtl: (n: number) =>
    Number.isFinite(n) && n > 0 ? undefined : `must be a number of seconds above 0 (got ${n})`
} as const

/** Checks these flags and pushes broken rules onto `issues`. Returns the settings. */
export const validateWorkerMemory = (input: WorkerMemoryConfig, issues: Array<ConfigIssue>): WorkerMemoryConfig => {
  const check = issueCheck(issues)
  check("named-segments", workerMemoryRules.namedSegments(input.namedSegments))
  if (input.fdSocket !== undefined) check("fd-socket", workerMemoryRules.fdSocket(input.fdSocket))
  check("fd-token-ttl-seconds", workerMemoryRules.fdTokenTtl(input.fdTokenTtlSeconds))
  return {
    namedSegments: input.namedSegments,
    unlinkReapedSegments: input.unlinkReapedSegments,
    fdSocket: input.fdSocket,
    requireSealedMemfd: input.requireSealedMemfd,
    fdTokenTtlSeconds: input.fdTokenTtlSeconds
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
