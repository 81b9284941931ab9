/**
 * How engine-driven contexts run (DESIGN §4): the transport of their KV
 * bytes (`--engine-driven-transport`; shm refused under CURVE, issue 24
 * item 7) and the TTL of an uncommitted PREPARE (issue 18).
 */
import { type ConfigIssue, issueCheck } from "./ConfigIssue.ts"

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

/** The validated engine-driven settings (part of ServerConfigShape). */
export interface EngineDrivenConfig {
  /** Engine-driven transport (`--engine-driven-transport`: default shm, inline with CURVE, which refuses shm). */
  readonly engineDrivenTransport: EngineDrivenTransport
  /**
   * A PREPARE_STORE / PREPARE_RETRIEVE not committed within this many seconds
   * is released (`--prepare-ttl-seconds`, default 60, > 0; issue 18): its
   * reservations dropped or read locks released, a late COMMIT answers false.
   */
  readonly prepareTtlSeconds: number
}

/** The engine-driven flags as parsed (part of ServerConfigInput). */
export interface EngineDrivenConfigInput {
  /** undefined: the default, shm without CURVE and inline with it. */
  readonly engineDrivenTransport: EngineDrivenTransport | undefined
  readonly prepareTtlSeconds: number
}

/** Defaults: the transport by CURVE, a 60 s PREPARE TTL. */
export const engineDrivenDefaults: EngineDrivenConfigInput = {
  engineDrivenTransport: undefined,
  prepareTtlSeconds: 60
}

/** Single-flag rules of the engine-driven flags (shared with the CLI's flag filters). */
export const engineDrivenRules = {
  engineDrivenTransport: (s: string) =>
    (ENGINE_DRIVEN_TRANSPORTS as ReadonlyArray<string>).includes(s) ? undefined : `must be shm or inline (got "${s}")`,
  prepareTtl: (n: number) =>
    Number.isFinite(n) && n > 0 ? undefined : `prepare TTL must be a number of seconds above 0 (got ${n})`
} as const

/**
 * Checks the engine-driven flags and pushes broken rules onto `issues`; with
 * `curveOn` (CURVE asked for) shm is refused and inline is the default — fail
 * closed: under tenancy no client may map the pool that holds every tenant's
 * chunks. Returns the settings.
 */
export const validateEngineDriven = (input: EngineDrivenConfigInput, curveOn: boolean, issues: Array<ConfigIssue>): EngineDrivenConfig => {
  const check = issueCheck(issues)
  if (input.engineDrivenTransport !== undefined) check("engine-driven-transport", engineDrivenRules.engineDrivenTransport(input.engineDrivenTransport))
  check("prepare-ttl-seconds", engineDrivenRules.prepareTtl(input.prepareTtlSeconds))
  if (curveOn && input.engineDrivenTransport === "shm") issues.push({ flag: "engine-driven-transport", message: SHM_UNDER_TENANCY })
  return {
    engineDrivenTransport: input.engineDrivenTransport ?? (curveOn ? "inline" : "shm"),
    prepareTtlSeconds: input.prepareTtlSeconds
  }
}
