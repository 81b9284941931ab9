/**
 * The liveness settings of one server (DESIGN §5 "Config" and "Reaper";
 * issue 25 item 3): its three windows and the reaper's scan period, in the
 * shape liveness reads them (ms). The flags that set them, their defaults
 * and rules stay in the server's configuration (`--worker-reap-timeout-seconds`,
 * `--worker-registration-grace-seconds`, `--worker-disconnect-grace-seconds`:
 * src/services/server/ServerConfig.ts); src/layers/LivenessSettings.ts
 * provides this service from it, so nothing under src/services/liveness
 * imports the server's modules.
 */
import { Context, Layer } from "effect"
import { disconnectReapingOn, timeReapingOn, type Windows } from "./Rule.ts"

/** The reaper's period, ms: `timeout / 4`, at most `disconnect_grace / 2`; Infinity when both are off (DESIGN §5 "Reaper"). */
export const scanPeriodMs = (w: Windows): number =>
  Math.min(timeReapingOn(w) ? w.reapTimeoutMs / 4 : Infinity, disconnectReapingOn(w) ? w.disconnectGraceMs / 2 : Infinity)

/** What Connections and the Reaper judge by. */
export interface LivenessSettingsShape {
  /** The windows, ms (Rule.ts: `reapTimeoutMs` 0 turns both heartbeat windows off, `disconnectGraceMs` 0 disconnect reaping). */
  readonly windows: Windows
  /** How often the reaper scans, ms ({@link scanPeriodMs}); Infinity when nothing can be reaped (the reaper does not run). */
  readonly scanPeriodMs: number
}

/** The liveness settings in context. */
export class LivenessSettings extends Context.Service<LivenessSettings, LivenessSettingsShape>()("mpcache/services/liveness/LivenessSettings") {
  /** The settings of `windows` (already validated: the server's configuration checks the flags). */
  static readonly make = (windows: Windows): LivenessSettingsShape => ({ windows, scanPeriodMs: scanPeriodMs(windows) })

  /** The settings of `windows`. */
  static readonly layer = (windows: Windows) => Layer.succeed(this, this.make(windows))

  /**
   * For tests: `windows` over a baseline with every window 0, i.e. nothing is
   * ever reaped unless a test turns a window on (not the server's defaults,
   * which ServerConfig owns).
   */
  static readonly layerTest = (windows: Partial<Windows> = {}) =>
    this.layer({ reapTimeoutMs: 0, registrationGraceMs: 0, disconnectGraceMs: 0, ...windows })
}
