/**
 * The pooled path of the MQ server (DESIGN §3, §3.1): the job that serves one attributable request on its pool —
 * judge the peer, decode the payload, run the handler, reply, measure. Built lazily, so the payload is decoded on
 * the pool, not on the receive loop. Never fails: a wire error is its error reply, a defect or a response that
 * does not encode is logged and answered `internal`, an interruption (shutdown) answers nothing.
 *
 * A transfer (the AFFINITY ops, whose replies may be large) first waits while its peer has a large reply waiting
 * for its pipe, and is not served at all once that peer is stalled (issue 24 item 10: a reply built only to be
 * refused is garbage that grows the server's memory as fast as the peer can ask).
 */
import { Cause, Effect, Exit } from "effect"
import { decodePayload, encodeReply } from "../../../schema/Frame.ts"
import { formatInstanceId } from "../../../schema/InstanceId.ts"
import { instanceIdOf } from "../../../schema/OpMeta.ts"
import { type BadRequest, Internal, isWireError } from "../../../schema/WireError.ts"
import type { PeerEvents } from "../../liveness/PeerEvents.ts"
import type { RequestBarrier } from "../../liveness/RequestBarrier.ts"
import type { Job } from "../Dispatch.ts"
import type { HandlerRow, HandlerTable, RequestContext } from "../Handler.ts"
import * as M from "../ServerMetrics.ts"
import type { SendPath } from "./SendPath.ts"

/** What the pooled path needs of the MQ server. */
export interface PooledJobsOptions {
  readonly table: HandlerTable
  readonly send: SendPath
  /** Told of each successful request that names an instance (binds the peer to it). */
  readonly events: PeerEvents["Service"]
  /** The request barrier: each job marks its `seq` finished there, whatever its end. */
  readonly barrier: RequestBarrier["Service"]
}

/**
 * The job of one request: `row` its handler row, `frames` its frames after the routing id (uid, op, payload),
 * `peer` the routing id in hex, `receivedAtMs` Date.now() at receipt (the latency metric), `seq` its barrier entry.
 */
export type PooledJob = (
  row: HandlerRow,
  routingId: Uint8Array,
  peer: string,
  frames: Array<Uint8Array>,
  receivedAtMs: number,
  seq: number
) => Job

const describeCause = (cause: Cause.Cause<unknown>): string => {
  const squashed = Cause.squash(cause)
  return squashed instanceof Error ? squashed.message : String(squashed)
}

/** The pooled jobs of one MQ server (its op metrics made once, here). */
export const makePooledJobs = (options: PooledJobsOptions): Effect.Effect<PooledJob> =>
  Effect.gen(function*() {
    const services = yield* Effect.context<never>()
    const { send } = options
    const opMetrics = new Map(
      [...options.table.byId.values()].map((r) => [r.op.id, M.opMetrics(r.op.name)] as const)
    )

    /**
     * The job for one attributable request: decode, run, reply, measure. Never fails. Built lazily, so the
     * payload is decoded on the pool, not on the receive loop.
     */
    const job: PooledJob = (row, routingId, peer, frames, receivedAtMs, seq) =>
      Effect.suspend(() => {
        // A transfer waits for its peer to be clear, or is not served once it is stalled (see the module comment).
        const gate = row.pool === "AFFINITY" ? send.outbox.whenClear(routingId) : undefined
        if (gate === undefined) return jobNow(row, routingId, peer, frames, receivedAtMs, seq, false)
        return Effect.promise(() => gate).pipe(
          Effect.flatMap((verdict) => jobNow(row, routingId, peer, frames, receivedAtMs, seq, verdict === "stalled"))
        )
      })

    const jobNow = (
      row: HandlerRow,
      routingId: Uint8Array,
      peer: string,
      frames: Array<Uint8Array>,
      receivedAtMs: number,
      seq: number,
      stalled: boolean
    ): Effect.Effect<void> => {
      const uidFrame = frames[0]!
      const opFrame = frames[1]!
      const ctx: RequestContext = { routingId, peer, skipBinding: false }
      // The peer is judged before its payload is decoded (issue 24 item 3: an unbound peer costs no decoding).
      const refused = stalled ? undefined : row.admit?.(ctx)
      const decoded = stalled || refused !== undefined ? Exit.fail(refused) : decodePayload(row.op, frames.slice(2))
      const instanceId = Exit.isSuccess(decoded) ? instanceIdOf(row.op, decoded.value as ReadonlyArray<unknown>) : undefined
      const run: Effect.Effect<void> = stalled
        ? Effect.sync(() => send.outbox.reply(send.outbox.notServed([routingId, uidFrame, opFrame])))
        : Exit.isFailure(decoded)
        ? refused !== undefined
          ? send.replyError(routingId, uidFrame, opFrame, refused)
          : Effect.logWarning("bad request", describeCause(decoded.cause)).pipe(
            Effect.andThen(send.replyError(routingId, uidFrame, opFrame, Cause.squash(decoded.cause) as BadRequest))
          )
        : Effect.exit(row.handle(decoded.value as ReadonlyArray<unknown>, ctx)).pipe(
          Effect.flatMap((exit): Effect.Effect<void> => {
            if (Exit.isSuccess(exit)) {
              const encoded = encodeReply(row.op, uidFrame, opFrame, exit.value as never)
              if (Exit.isSuccess(encoded)) {
                return Effect.sync(() => send.reply(routingId, encoded.value)).pipe(
                  Effect.andThen(instanceId === undefined || ctx.skipBinding ? Effect.void : options.events.instanceMessage(peer, instanceId))
                )
              }
              return Effect.logError("handler returned a response that does not encode", describeCause(encoded.cause))
                .pipe(
                  Effect.andThen(send.replyError(
                    routingId,
                    uidFrame,
                    opFrame,
                    new Internal({ op: row.op.name, field: "response", message: `${row.op.name}: the server produced an invalid response` })
                  ))
                )
            }
            const failure = Cause.squash(exit.cause)
            if (isWireError(failure) && !Cause.hasDies(exit.cause)) {
              return send.replyError(routingId, uidFrame, opFrame, failure)
            }
            if (Cause.hasInterruptsOnly(exit.cause)) return Effect.void
            return Effect.logError("handler failed", exit.cause).pipe(
              Effect.andThen(send.replyError(
                routingId,
                uidFrame,
                opFrame,
                new Internal({ op: row.op.name, message: `${row.op.name}: internal error: ${describeCause(exit.cause)}` })
              ))
            )
          })
        )
      const m = opMetrics.get(row.op.id)!
      const finish = () => {
        m.requests.updateUnsafe(1, services)
        m.latency.updateUnsafe((Date.now() - receivedAtMs) / 1000, services)
        options.barrier.exit(seq)
      }
      return run.pipe(
        Effect.annotateLogs(
          instanceId === undefined ? { op: row.op.name, peer } : { op: row.op.name, peer, instance_id: formatInstanceId(instanceId) }
        ),
        Effect.catchCause((cause) => Effect.logError("request job failed", cause)),
        Effect.ensuring(Effect.sync(finish))
      )
    }

    return job
  })
