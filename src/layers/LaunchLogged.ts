/**
 * Runs a server layer until the fiber is interrupted (SIGINT/SIGTERM through
 * NodeRuntime.runMain), and logs both ends of the shutdown (issue 29 item 5):
 * "shutting down: …" as the interrupt arrives, before any finalizer runs, and
 * "stopped: …" with how long the drain took after the last one ran, so that
 * an operator's log says the process stopped, not only that it began to.
 * (Layer.launch with an onInterrupt hook logged its line only once every
 * finalizer had run, and nothing after.)
 */
import { Clock, Effect, Layer } from "effect"

/**
 * `Layer.launch(layer)` with the shutdown logged. Fails as building `layer`
 * fails (no line is logged then: it never started); never succeeds.
 */
export const launchLogged = <ROut, E, RIn>(layer: Layer.Layer<ROut, E, RIn>): Effect.Effect<never, E, RIn> =>
  Effect.scoped(Effect.gen(function*() {
    let shutdownAt: number | undefined
    // Added first, so it runs last: after every finalizer of the layer.
    yield* Effect.addFinalizer(() =>
      shutdownAt === undefined
        ? Effect.void
        : Effect.flatMap(Clock.currentTimeMillis, (now) =>
          Effect.logInfo(`stopped: in-flight requests drained and every resource released in ${now - shutdownAt!} ms`))
    )
    yield* Layer.build(layer)
    // Added last, so it runs first.
    yield* Effect.addFinalizer(() =>
      Effect.flatMap(Clock.currentTimeMillis, (now) => {
        shutdownAt = now
        return Effect.logInfo("shutting down: receiving stops, in-flight requests drain")
      })
    )
    return yield* Effect.never
  }))
