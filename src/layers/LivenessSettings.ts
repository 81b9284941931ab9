/**
 * The liveness settings from the server's configuration (issue 25 item 3):
 * `--worker-reap-timeout-seconds`, `--worker-registration-grace-seconds` and
 * `--worker-disconnect-grace-seconds`, validated by ServerConfig, as the
 * windows in ms that Connections and the Reaper read (Rule.ts `windowsOf`).
 */
import { Effect, Layer } from "effect"
import { LivenessSettings } from "../services/liveness/LivenessSettings.ts"
import { windowsOf } from "../services/liveness/Rule.ts"
import { ServerConfig } from "../services/server/ServerConfig.ts"

/** `LivenessSettings` of the `ServerConfig` in context. */
export const LivenessSettingsLive: Layer.Layer<LivenessSettings, never, ServerConfig> = Layer.effect(
  LivenessSettings,
  Effect.gen(function*() {
    return LivenessSettings.make(windowsOf(yield* ServerConfig))
  })
)
