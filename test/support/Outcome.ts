/**
 * A request's outcome as data, for the worker scripts of the fault tests
 * (issue 13): `ok` with the request's result, or its error's tag and wire
 * fields (message, op, instance_id, field, expected, actual), or a defect;
 * always with how many milliseconds the request took.
 */
import { Effect } from "effect"

/** Runs `request`, timing it; never fails. */
export const outcome = <A, E extends { readonly _tag: string; readonly message: string }>(request: Effect.Effect<A, E>) =>
  Effect.gen(function*() {
    const started = Date.now()
    const exit = yield* Effect.exit(request)
    const ms = Date.now() - started
    if (exit._tag === "Success") return { ok: exit.value, ms }
    const failure = exit.cause.reasons.find((r) => r._tag === "Fail")
    if (failure === undefined || failure._tag !== "Fail") return { defect: String(exit.cause), ms }
    const e = failure.error as E & Record<string, unknown>
    const { _tag, message, op, instance_id, field, expected, actual } = e
    return { error: { _tag, message, op, instance_id, field, expected, actual }, ms }
  })
