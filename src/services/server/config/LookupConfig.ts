/**
 * What LOOKUP may keep between a lookup and its end (issue 24 item 6;
 * upstream read_ttl_seconds 300): the TTL of prefetch read locks and the
 * bounds on pending lookups.
 */
import { commonRules, type ConfigIssue, issueCheck } from "./ConfigIssue.ts"

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

/** The validated lookup settings (part of ServerConfigShape). */
export interface LookupConfig {
  /** Prefetch read locks older than this are released (`--lookup-lock-ttl-seconds`; upstream read_ttl_seconds 300). */
  readonly lookupLockTtlSeconds: number
  /** What pending lookups may keep (issue 24 item 6); over a bound the oldest is released. */
  readonly lookupLimits: LookupLimits
}

/** The lookup flags as parsed (part of ServerConfigInput). */
export interface LookupConfigInput extends LookupLimits {
  readonly lookupLockTtlSeconds: number
}

/** Defaults: upstream's 300 s lock TTL; bounds sized for vLLM's 1024 requests at once. */
export const lookupDefaults: LookupConfigInput = {
  lookupLockTtlSeconds: 300,
  // A scheduler keeps one pending lookup per request it has looked up and not yet ended: its running
  // and waiting requests (vLLM runs up to 1024 at once). 4 schedulers' worth per server.
  maxPendingLookupsPerPeer: 4096,
  maxPendingLookups: 16384,
  // 1024 requests × 8 ranks × 128 chunks (32K-token prompts at 256); ~200 bytes of heap each (docs/security.md).
  maxLookupLocks: 1 << 20
}

/** Single-flag rules of the lookup flags (shared with the CLI's flag filters). */
export const lookupRules = {
  lockTtl: (n: number) =>
    Number.isFinite(n) && n >= 1 ? undefined : `lookup lock TTL must be at least 1 second (got ${n})`
} as const

/** Checks the lookup flags (the per-peer bound at most the server's) and pushes broken rules onto `issues`. Returns them. */
export const validateLookup = (input: LookupConfigInput, issues: Array<ConfigIssue>): LookupConfig => {
  const check = issueCheck(issues)
  check("lookup-lock-ttl-seconds", lookupRules.lockTtl(input.lookupLockTtlSeconds))
  check("max-pending-lookups", commonRules.positiveInt(input.maxPendingLookups))
  check("max-pending-lookups-per-peer", commonRules.positiveInt(input.maxPendingLookupsPerPeer))
  check("max-lookup-locks", commonRules.positiveInt(input.maxLookupLocks))
  if (
    commonRules.positiveInt(input.maxPendingLookups) === undefined && commonRules.positiveInt(input.maxPendingLookupsPerPeer) === undefined &&
    input.maxPendingLookupsPerPeer > input.maxPendingLookups
  ) {
    issues.push({
      flag: "max-pending-lookups-per-peer",
      message: `must not exceed --max-pending-lookups (${input.maxPendingLookups}; got ${input.maxPendingLookupsPerPeer})`
    })
  }
  return {
    lookupLockTtlSeconds: input.lookupLockTtlSeconds,
    lookupLimits: {
      maxPendingLookups: input.maxPendingLookups,
      maxPendingLookupsPerPeer: input.maxPendingLookupsPerPeer,
      maxLookupLocks: input.maxLookupLocks
    }
  }
}
