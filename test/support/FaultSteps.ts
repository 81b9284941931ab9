/**
 * Fault injection at every step of a path (issue 25 item 2): the services a
 * path calls (L1, the native copies, the L2 store) are wrapped so that each
 * call is a numbered step; a run armed at step n meets, right before that
 * call, either a defect (the call dies instead of running; a synchronous
 * call throws) or an interruption of the fiber making the call (a real
 * one, `interruptUnsafe`: delivered at its next interruptible point, as a
 * shutdown's would be, so atomic regions stay atomic). {@link atEveryStep}
 * runs the path once per step and kind until a run no longer reaches the
 * armed step, checking what the path holds after each run.
 */
import { Effect, Exit, Fiber, Layer } from "effect"
import { L1Store } from "../../src/services/server/L1Store.ts"
import { NativeMemory } from "../../src/native/Native.ts"
import { L2Store } from "../../src/services/server/l2/L2Store.ts"

export type FaultKind = "defect" | "interrupt"

/** The injected defect (named so a test can tell it from a real one). */
export class InjectedDefect extends Error {
  readonly step: string
  readonly at: number
  constructor(step: string, at: number) {
    super(`injected defect at step ${at} (${step})`)
    this.step = step
    this.at = at
  }
}

export interface FaultSteps {
  /** `effect` as one step: the armed one dies or has its fiber interrupted first. */
  readonly step: <A, E, R>(name: string, effect: Effect.Effect<A, E, R>) => Effect.Effect<A, E, R>
  /** A synchronous call as one step: the armed one throws (defect) or interrupts its fiber, then runs. */
  readonly syncStep: <A>(name: string, f: () => A) => A
  /** Arms step `at` (1-based) with `kind`; 0 disarms. Resets the count and the names seen. */
  readonly arm: (at: number, kind: FaultKind) => void
  /** The steps seen since the last arm, in order, and whether the armed one was reached. */
  readonly seen: () => { readonly names: ReadonlyArray<string>; readonly fired: boolean }
}

export const makeFaultSteps = (): FaultSteps => {
  let armedAt = 0
  let kind: FaultKind = "defect"
  let names: Array<string> = []
  let fired = false
  /** Counts a step; true when it is the armed one. */
  const hit = (name: string) => {
    names.push(name)
    if (armedAt === 0 || names.length !== armedAt) return false
    fired = true
    return true
  }
  return {
    step: (name, effect) =>
      Effect.suspend(() => {
        if (!hit(name)) return effect
        if (kind === "defect") return Effect.die(new InjectedDefect(name, armedAt))
        return Effect.withFiber((fiber) => {
          fiber.interruptUnsafe()
          return effect
        })
      }),
    syncStep: (name, f) => {
      if (hit(name)) {
        if (kind === "defect") throw new InjectedDefect(name, armedAt)
        Fiber.getCurrent()?.interruptUnsafe()
      }
      return f()
    },
    arm: (at, k) => {
      armedAt = at
      kind = k
      names = []
      fired = false
    },
    seen: () => ({ names: [...names], fired })
  }
}

/** L1Store with its effectful calls and `lockRead` as steps. */
export const faultyL1 = (faults: FaultSteps) =>
  Layer.effect(
    L1Store,
    Effect.gen(function*() {
      const l1 = yield* L1Store
      return L1Store.of({
        ...l1,
        reserveWrite: (k, n) => faults.step("l1.reserveWrite", l1.reserveWrite(k, n)),
        commit: (r) => faults.step("l1.commit", l1.commit(r)),
        fill: (r, b) => faults.step("l1.fill", l1.fill(r, b)),
        lockRead: (k) => faults.syncStep("l1.lockRead", () => l1.lockRead(k))
      })
    })
  )

/** NativeMemory with the transfers' batched copies as steps. */
export const faultyNative = (faults: FaultSteps) =>
  Layer.effect(
    NativeMemory,
    Effect.gen(function*() {
      const native = yield* NativeMemory
      return NativeMemory.of({
        ...native,
        gatherAll: (parts, dst) => faults.step("native.gatherAll", native.gatherAll(parts, dst)),
        scatterAll: (parts, src) => faults.step("native.scatterAll", native.scatterAll(parts, src))
      })
    })
  )

/** L2Store with GET as a step. */
export const faultyL2Store = (faults: FaultSteps) =>
  Layer.effect(
    L2Store,
    Effect.gen(function*() {
      const store = yield* L2Store
      return L2Store.of({ ...store, get: (k, t) => faults.step("l2.get", store.get(k, t)) })
    })
  )

/**
 * For each kind and each step n of `path` (1, 2, … until a run ends without
 * reaching step n): `setup` (disarmed), then `path` in a fiber of its own
 * with the fault at step n, then `check` (disarmed) with the run's exit,
 * its label, the kind and whether the fault fired.
 * Returns the steps of the clean run (the last one of each kind), so the
 * caller can assert the path was really walked.
 */
export const atEveryStep = <A, E, R, R2, R3, E3>(
  faults: FaultSteps,
  options: {
    readonly setup?: Effect.Effect<unknown, unknown, R2>
    readonly path: Effect.Effect<A, E, R>
    readonly check: (
      exit: Exit.Exit<A, E>,
      run: { readonly label: string; readonly kind: FaultKind; readonly fired: boolean }
    ) => Effect.Effect<void, E3, R3>
  }
) =>
  Effect.gen(function*() {
    let cleanRun: ReadonlyArray<string> = []
    for (const kind of ["defect", "interrupt"] as const) {
      for (let at = 1; ; at++) {
        faults.arm(0, kind)
        if (options.setup !== undefined) yield* options.setup
        faults.arm(at, kind)
        const fiber = yield* Effect.forkChild(options.path)
        const exit = yield* Fiber.await(fiber)
        const { names, fired } = faults.seen()
        faults.arm(0, kind)
        yield* options.check(exit, { label: `${kind} at step ${at} (${names[at - 1] ?? "none"})`, kind, fired })
        if (!fired) {
          cleanRun = names
          break
        }
      }
    }
    return cleanRun
  })
