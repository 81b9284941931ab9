/**
 * The replay's chaos: SIGKILL a random live worker (and start its
 * replacement) each time a wait completes, or SIGSTOP one for a while on a
 * period. Each event goes into the timeline and the tally.
 *
 * @internal
 */
import { readdirSync, rmSync } from "node:fs"
import { Clock, Effect, Random } from "effect"
import type { TimelineRecorder } from "../Timeline.ts"
import type { Fleet } from "./Fleet.ts"
import type { Tally } from "./Tally.ts"

/** Unlinks /dev/shm/<prefix>-L* (a dead worker's KV cache). */
const removeSegments = (prefix: string): void => {
  try {
    for (const name of readdirSync("/dev/shm")) if (name.startsWith(`${prefix}-L`)) rmSync(`/dev/shm/${name}`, { force: true })
  } catch {
    // Nothing to clean where /dev/shm cannot be listed.
  }
}

/** Kills a random live worker (and starts its replacement) each time `wait` completes. */
export const killer = (fleet: Fleet, tally: Tally, timeline: TimelineRecorder, wait: Effect.Effect<void>) =>
  Effect.gen(function*() {
    while (true) {
      yield* wait
      const candidates = fleet.alive()
      if (candidates.length === 0) continue
      const victim = candidates[yield* Random.nextIntBetween(0, candidates.length - 1)]!
      // Uninterruptible: a replacement that registered must be known, so it is shut down at the end.
      yield* Effect.uninterruptible(Effect.gen(function*() {
        victim.child.kill("SIGKILL")
        fleet.markKilled(victim)
        tally.killed++
        const killedAt = yield* Clock.currentTimeMillis
        timeline.event(killedAt, { kind: "kill", slot: victim.slot, instance_id: victim.instanceId })
        timeline.sampleAlive(killedAt, fleet.alive().length)
        // A killed worker cannot unlink its own segments; like an engine's supervisor, we do.
        // The server's mappings stay valid until it reaps the instance.
        removeSegments(victim.namePrefix)
        yield* fleet.start(fleet.nodeOf(victim)).pipe(
          Effect.tap((w) =>
            Effect.map(Clock.currentTimeMillis, (at) => {
              tally.replaced++
              timeline.event(at, { kind: "replace", slot: w.slot, instance_id: w.instanceId })
              timeline.sampleAlive(at, fleet.alive().length)
            })
          ),
          Effect.catch((e) => Effect.logWarning(`replacement worker failed to start: ${e.message}`))
        )
      }))
    }
  })

/** Every `every` seconds SIGSTOPs a random live worker for `pauseSeconds`, then SIGCONTs it. */
export const pauser = (fleet: Fleet, tally: Tally, timeline: TimelineRecorder, every: number, pauseSeconds: number) =>
  Effect.gen(function*() {
    while (true) {
      yield* Effect.sleep(`${every} seconds`)
      const candidates = fleet.alive()
      if (candidates.length === 0) continue
      const victim = candidates[yield* Random.nextIntBetween(0, candidates.length - 1)]!
      victim.child.kill("SIGSTOP")
      tally.paused++
      timeline.event(yield* Clock.currentTimeMillis, { kind: "pause", slot: victim.slot, instance_id: victim.instanceId })
      yield* Effect.sleep(`${pauseSeconds} seconds`).pipe(
        Effect.ensuring(Effect.gen(function*() {
          victim.child.kill("SIGCONT")
          timeline.event(yield* Clock.currentTimeMillis, { kind: "resume", slot: victim.slot, instance_id: victim.instanceId })
        }))
      )
    }
  })
