/**
 * The worker liveness windows of `mpcache serve` (DESIGN §5; upstream
 * MPServerConfig: reap 120 s, grace 3600 s): how long a silent instance is
 * kept, before and after it proved alive, and after its last connection
 * closed. The reaper and the connection tracker run on them.
 */
import { type ConfigIssue, issueCheck } from "./ConfigIssue.ts"

/** The validated windows (part of ServerConfigShape), in seconds; the flags as parsed have the same names. */
export interface LivenessConfig {
  /** Reap window of instances with both liveness flags latched; 0 disables reaping (`--worker-reap-timeout-seconds`). */
  readonly workerReapTimeoutSeconds: number
  /** Reap window of instances not yet proven alive (`--worker-registration-grace-seconds`). */
  readonly workerRegistrationGraceSeconds: number
  /** Silence allowed after an instance's last connection closed; 0 disables (`--worker-disconnect-grace-seconds`). */
  readonly workerDisconnectGraceSeconds: number
}

/** Defaults of DESIGN §5: 120 s timeout, 3600 s grace, 10 s disconnect grace. */
export const livenessDefaults: LivenessConfig = {
  workerReapTimeoutSeconds: 120,
  workerRegistrationGraceSeconds: 3600,
  workerDisconnectGraceSeconds: 10
}

/** Single-flag rules of the windows (shared with the CLI's flag filters). */
export const livenessRules = {
  reapTimeout: (n: number) =>
    Number.isFinite(n) && (n === 0 || n >= 30)
      ? undefined
      : `worker reap timeout must be 0 (disabled) or at least 30 seconds (got ${n}); keep it at least 3 × the workers' heartbeat interval`,
  disconnectGrace: (n: number) =>
    Number.isFinite(n) && n >= 0 ? undefined : `worker disconnect grace must be 0 (disabled) or a positive number of seconds (got ${n})`
} as const

/** Checks the windows (the grace is at least the timeout) and pushes broken rules onto `issues`. Returns them. */
export const validateLiveness = (input: LivenessConfig, issues: Array<ConfigIssue>): LivenessConfig => {
  const check = issueCheck(issues)
  check("worker-reap-timeout-seconds", livenessRules.reapTimeout(input.workerReapTimeoutSeconds))
  const grace = input.workerRegistrationGraceSeconds
  if (!Number.isFinite(grace) || grace < input.workerReapTimeoutSeconds) {
    issues.push({
      flag: "worker-registration-grace-seconds",
      message: `worker registration grace must be at least the worker reap timeout (${input.workerReapTimeoutSeconds} s; got ${grace})`
    })
  }
  check("worker-disconnect-grace-seconds", livenessRules.disconnectGrace(input.workerDisconnectGraceSeconds))
  return {
    workerReapTimeoutSeconds: input.workerReapTimeoutSeconds,
    workerRegistrationGraceSeconds: grace,
    workerDisconnectGraceSeconds: input.workerDisconnectGraceSeconds
  }
}
