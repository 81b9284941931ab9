/**
 * The per-tenant limits of a server with CURVE on (docs/security.md): what
 * one tenant's workers may hold and how fast they may register; over one a
 * request is answered `overloaded` naming the flag.
 */
import { totalmem } from "node:os"
import { MAX_L1_SHARE } from "../../auth/AuthorizedKeys.ts"
import { commonRules, type ConfigIssue, issueCheck } from "./ConfigIssue.ts"

/** Per-tenant limits; over one a request is answered `overloaded` naming it. */
export interface TenantLimits {
  /** Instances a tenant may hold registered (`--tenant-max-instances`, default 64). */
  readonly maxInstances: number
  /** REGISTERs (of any kind) per second per tenant, a bucket of that many (`--tenant-max-registers-per-second`, 20). */
  readonly maxRegistersPerSecond: number
  /** Bytes of worker memory a tenant's registrations may map (`--tenant-max-mapped-bytes`, the machine's RAM). */
  readonly maxMappedBytes: number
}

/** The validated tenancy settings (part of ServerConfigShape). */
export interface TenancyConfig {
  /** Per-tenant limits with CURVE on (docs/security.md). */
  readonly tenantLimits: TenantLimits
  /**
   * A tenant's weight in L1 unless its authorized-keys lines say `l1-share=W` (`--tenant-l1-share-default`,
   * default 1; issue 27 item 2: shares are weights, src/services/server/internal/L1Shares.ts).
   */
  readonly tenantL1ShareDefault: number
}

/** The tenancy flags as parsed (part of ServerConfigInput). */
export interface TenancyConfigInput {
  readonly tenantMaxInstances: number
  readonly tenantMaxRegistersPerSecond: number
  readonly tenantMaxMappedBytes: number
  readonly tenantL1ShareDefault: number
}

/** Defaults: 64 instances, 20 REGISTERs per second, the machine's RAM, an L1 weight of 1. */
export const tenancyDefaults: TenancyConfigInput = {
  tenantMaxInstances: 64,
  tenantMaxRegistersPerSecond: 20,
  tenantMaxMappedBytes: totalmem(),
  tenantL1ShareDefault: 1
}

/** `--tenant-l1-share-default` and `l1-share=W`: a weight above 0, at most the authorized-keys file's bound. */
export const l1ShareRule = (w: number): string | undefined =>
  Number.isFinite(w) && w > 0 && w <= MAX_L1_SHARE ? undefined : `must be a number above 0 and at most ${MAX_L1_SHARE} (a weight: shares are relative; got ${w})`

/** Checks the tenancy flags (each a count of at least 1) and pushes broken rules onto `issues`. Returns the limits. */
export const validateTenancy = (input: TenancyConfigInput, issues: Array<ConfigIssue>): TenancyConfig => {
  const check = issueCheck(issues)
  check("tenant-max-instances", commonRules.positiveInt(input.tenantMaxInstances))
  check("tenant-max-registers-per-second", commonRules.positiveInt(input.tenantMaxRegistersPerSecond))
  check("tenant-max-mapped-bytes", commonRules.positiveInt(input.tenantMaxMappedBytes))
  check("tenant-l1-share-default", l1ShareRule(input.tenantL1ShareDefault))
  return {
    tenantLimits: {
      maxInstances: input.tenantMaxInstances,
      maxRegistersPerSecond: input.tenantMaxRegistersPerSecond,
      maxMappedBytes: input.tenantMaxMappedBytes
    },
    tenantL1ShareDefault: input.tenantL1ShareDefault
  }
}
