/**
 * The per-tenant limits of a server with CURVE on (docs/security.md): what
 * one tenant's workers may hold and how fast they may register; over one a
 * request is answered `overloaded` naming the flag.
 */
import { totalmem } from "node:os"
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
}

/** The tenancy flags as parsed (part of ServerConfigInput). */
export interface TenancyConfigInput {
  readonly tenantMaxInstances: number
  readonly tenantMaxRegistersPerSecond: number
  readonly tenantMaxMappedBytes: number
}

/** Defaults: 64 instances, 20 REGISTERs per second, the machine's RAM. */
export const tenancyDefaults: TenancyConfigInput = {
  tenantMaxInstances: 64,
  tenantMaxRegistersPerSecond: 20,
  tenantMaxMappedBytes: totalmem()
}

/** Checks the tenancy flags (each a count of at least 1) and pushes broken rules onto `issues`. Returns the limits. */
export const validateTenancy = (input: TenancyConfigInput, issues: Array<ConfigIssue>): TenancyConfig => {
  const check = issueCheck(issues)
  check("tenant-max-instances", commonRules.positiveInt(input.tenantMaxInstances))
  check("tenant-max-registers-per-second", commonRules.positiveInt(input.tenantMaxRegistersPerSecond))
  check("tenant-max-mapped-bytes", commonRules.positiveInt(input.tenantMaxMappedBytes))
  return {
    tenantLimits: {
      maxInstances: input.tenantMaxInstances,
      maxRegistersPerSecond: input.tenantMaxRegistersPerSecond,
      maxMappedBytes: input.tenantMaxMappedBytes
    }
  }
}
