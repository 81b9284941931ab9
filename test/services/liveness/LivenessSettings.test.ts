/**
 * The liveness settings (src/services/liveness/LivenessSettings.ts, issue 25
 * item 3): its test layer, and the layer that derives it from the server's
 * configuration (src/layers/LivenessSettings.ts): the flags' seconds as ms,
 * and the reaper's period of DESIGN §5 (timeout / 4, at most grace / 2).
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect, Layer } from "effect"
import { LivenessSettingsLive } from "../../../src/layers/LivenessSettings.ts"
import { LivenessSettings } from "../../../src/services/liveness/LivenessSettings.ts"
import { ServerConfig } from "../../../src/services/server/ServerConfig.ts"

const settingsOf = <E>(layer: Layer.Layer<LivenessSettings, E>) =>
  Effect.provide(Effect.gen(function*() {
    return yield* LivenessSettings
  }), layer)

describe("LivenessSettings", () => {
  it.effect("layerTest: every window 0 unless given, so nothing is reaped and the reaper does not run", () =>
    Effect.gen(function*() {
      assert.deepStrictEqual(yield* settingsOf(LivenessSettings.layerTest()), {
        windows: { reapTimeoutMs: 0, registrationGraceMs: 0, disconnectGraceMs: 0 },
        scanPeriodMs: Infinity
      })
      assert.deepStrictEqual(yield* settingsOf(LivenessSettings.layerTest({ reapTimeoutMs: 120_000, registrationGraceMs: 3_600_000 })), {
        windows: { reapTimeoutMs: 120_000, registrationGraceMs: 3_600_000, disconnectGraceMs: 0 },
        scanPeriodMs: 30_000
      })
    }))

  it.effect("from the server's configuration: its defaults (120 s, 3600 s, 10 s) scan every 5 s", () =>
    Effect.gen(function*() {
      assert.deepStrictEqual(yield* settingsOf(LivenessSettingsLive.pipe(Layer.provide(ServerConfig.layerTest()))), {
        windows: { reapTimeoutMs: 120_000, registrationGraceMs: 3_600_000, disconnectGraceMs: 10_000 },
        scanPeriodMs: 5_000
      })
    }))

  it.effect("from the server's configuration: the flags' seconds as ms; disconnect grace 0 leaves timeout / 4", () =>
    Effect.gen(function*() {
      const config = ServerConfig.layerTest({ workerReapTimeoutSeconds: 60, workerRegistrationGraceSeconds: 600, workerDisconnectGraceSeconds: 0 })
      assert.deepStrictEqual(yield* settingsOf(LivenessSettingsLive.pipe(Layer.provide(config))), {
        windows: { reapTimeoutMs: 60_000, registrationGraceMs: 600_000, disconnectGraceMs: 0 },
        scanPeriodMs: 15_000
      })
    }))
})
