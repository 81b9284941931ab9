/**
 * The MQ server's door (issue 24 item 1, docs/security.md §1): every message passes it before anything else looks
 * at it, and only peers whose routing id the ROUTER generated get through. The rule and why: RoutingIds.ts.
 *
 * - A peer is judged on its first message (its ROUTER_NOTIFY connect notification, or its first request).
 * - `generated`: admitted; the MQ server's fast path serves admitted peers only ({@link PeerAdmission.isServed}).
 * - `verify`: its messages are held (in order, at most {@link MAX_HELD_MESSAGES}) until a probe of the counter
 *   comes back; generated before the probe: admitted and its held messages handled in order; otherwise it chose an
 *   id ahead of the counter: kicked at once (its held messages dropped), before the counter can reach its id.
 * - `chosen`: refused: each request is answered `forbidden` naming the rule; it is never bound to an instance, a
 *   tenant or a lane.
 *
 * Refusals are counted (`mpcache_routing_id_refusals_total{reason="chosen"|"ahead"}`) and logged at WARNING, at
 * most once per {@link REFUSAL_LOG_INTERVAL_MS} per reason.
 */
import { randomBytes } from "node:crypto"
import { Effect, Metric } from "effect"
import type { Scope } from "effect"
import { Forbidden } from "../../../schema/WireError.ts"
import type { BoundRouter } from "../../zmq/Sockets.ts"
import { byLabel } from "../../metrics/Series.ts"
import { routingIdRefusalsTotal } from "../ServerMetrics.ts"
import { generatedCounterOf, makeRoutingIdCounter } from "../../zmq/RoutingIds.ts"
import { makeWarnWindow } from "./WarnWindow.ts"

/** Messages held per peer while its id is verified; more are dropped (a verification takes one in-process round trip). */
export const MAX_HELD_MESSAGES = 256

/** Peers remembered as refused (their requests answered `forbidden`); the oldest is forgotten first. */
export const MAX_REFUSED_PEERS = 65_536

/** At most one WARNING per refusal reason in this many ms. */
export const REFUSAL_LOG_INTERVAL_MS = 10_000

/** How long a probe may take before it is written off and another sent (it is an in-process round trip). */
const PROBE_DEADLINE_MS = 5_000

/** Why a routing id is refused: the peer chose it, or chose one the counter has not generated yet (then kicked). */
export const ROUTING_ID_REFUSALS = ["chosen", "ahead"] as const
export type RoutingIdRefusal = typeof ROUTING_ID_REFUSALS[number]

/** `mpcache_routing_id_refusals_total`, one handle per reason, each at 0 from the start. */
const refusalMetric = byLabel(routingIdRefusalsTotal, "reason", ROUTING_ID_REFUSALS)

/** The `forbidden` error a refused peer's requests get. */
export const chosenRoutingIdError = (op: string): Forbidden =>
  new Forbidden({
    op,
    field: "routing_id",
    expected: "a routing id the server's ROUTER assigned (the client sets none)",
    actual: "a routing id the client set itself (ZMQ_ROUTING_ID)",
    message: `${op}: this server serves only routing ids its ROUTER assigns; do not set ZMQ_ROUTING_ID on the client (ids starting with a zero byte are reserved to libzmq)`
  })

/** The door of one MQ server. */
export interface PeerAdmission {
  /** Whether the peer with this routing id is admitted (the fast path's check: no allocation). */
  readonly isServed: (routingId: Uint8Array) => boolean
  /**
   * Judges one received message `[routing id, ...frames]` of peer `peer` (hex): true when the caller handles it
   * now; false when the door took it (held, a probe's reply, refused and answered, or dropped).
   */
  readonly admit: (received: Array<Buffer>, peer: string) => Effect.Effect<boolean>
  /** The peer's connection is gone (a confirmed disconnect): it is judged again if it shows up. */
  readonly forget: (routingId: Uint8Array, peer: string) => void
  /** For `/api/status`: peers refused since start by reason, and peers waiting for a verdict now. */
  readonly stats: () => { readonly refused: Readonly<Record<RoutingIdRefusal, number>>; readonly verifying: number }
}

interface Held {
  readonly routingId: Buffer
  readonly messages: Array<Array<Buffer>>
  /** Probes issued before this peer was first seen: the probe numbered above it decides. */
  readonly before: number
}

/**
 * The door for `router`. `handle` runs a message of an admitted peer (the MQ server's own handling; used for the
 * held messages of a peer once admitted); `answerRefused` answers a request frame pair of a refused peer.
 */
export const makePeerAdmission = (
  router: BoundRouter,
  handle: (received: Array<Buffer>) => Effect.Effect<void>,
  answerRefused: (routingId: Buffer, uidFrame: Buffer, opFrame: Buffer) => Effect.Effect<void>
): Effect.Effect<PeerAdmission, never, Scope.Scope> =>
  Effect.gen(function*() {
    const scope = yield* Effect.scope
    const counter = makeRoutingIdCounter(router.firstGeneratedId)
    const admitted = new Set<number>()
    const refused = new Set<string>()
    const held = new Map<string, Held>()
    const refusedSinceStart: Record<RoutingIdRefusal, number> = { chosen: 0, ahead: 0 }
    const warnings = makeWarnWindow(REFUSAL_LOG_INTERVAL_MS)
    let probesIssued = 0
    let probe: { readonly marker: Buffer; readonly number: number; readonly close: () => void } | undefined

    const refuse = (routingId: Buffer, peer: string, reason: RoutingIdRefusal): Effect.Effect<void> => {
      refusedSinceStart[reason]++
      if (reason === "ahead") {
        // Kicked: the id is free again, and a later claim of it is a new connection, judged anew.
        router.kick(routingId)
      } else {
        if (refused.size >= MAX_REFUSED_PEERS) refused.delete(refused.values().next().value!)
        refused.add(peer)
      }
      return Metric.update(refusalMetric[reason], 1).pipe(
        Effect.andThen(warnings.warn(
          reason,
          reason === "chosen"
            ? `refused a peer that set its own routing id (${refusedSinceStart.chosen} since start): this server serves only ids its ROUTER assigns; its requests are answered forbidden`
            : `kicked a peer that claimed a routing id the ROUTER has not generated yet (${refusedSinceStart.ahead} since start): such a claim would make libzmq abort when it generates that id`,
          1,
          { peer }
        ))
      )
    }

    const issueProbe: Effect.Effect<void> = Effect.suspend(() => {
      if (probe !== undefined || held.size === 0) return Effect.void
      const marker = randomBytes(16)
      const number = ++probesIssued
      probe = { marker, number, ...router.openProbe(marker) }
      // A probe is an in-process round trip; one that never comes back (a bug) must not hold peers forever.
      return Effect.sleep(PROBE_DEADLINE_MS).pipe(
        Effect.andThen(Effect.suspend(() => {
          if (probe?.number !== number) return Effect.void
          probe.close()
          probe = undefined
          return Effect.logError(`routing-id probe ${number} did not come back within ${PROBE_DEADLINE_MS} ms; sending another`).pipe(
            Effect.andThen(issueProbe)
          )
        })),
        Effect.forkIn(scope),
        Effect.asVoid
      )
    })

    const probed = (probeId: Buffer): Effect.Effect<void> =>
      Effect.gen(function*() {
        const done = probe!
        probe = undefined
        done.close()
        const generatedBefore = counter.probed(probeId)
        for (const [peer, h] of [...held]) {
          if (h.before >= done.number) continue
          held.delete(peer)
          if (generatedBefore(h.routingId)) {
            admitted.add(generatedCounterOf(h.routingId)!)
            for (const message of h.messages) yield* handle(message)
          } else {
            yield* refuse(h.routingId, peer, "ahead")
          }
        }
        yield* issueProbe
      })

    const admit = (received: Array<Buffer>, peer: string): Effect.Effect<boolean> => {
      const routingId = received[0]!
      if (probe !== undefined && received.length === 2 && received[1]!.equals(probe.marker)) {
        return Effect.as(probed(routingId), false)
      }
      const c = generatedCounterOf(routingId)
      if (c !== undefined && admitted.has(c)) return Effect.succeed(true)
      const waiting = held.get(peer)
      if (waiting !== undefined) {
        if (waiting.messages.length < MAX_HELD_MESSAGES) waiting.messages.push(received)
        return Effect.succeed(false)
      }
      if (refused.has(peer)) {
        return received.length >= 3 ? Effect.as(answerRefused(routingId, received[1]!, received[2]!), false) : Effect.succeed(false)
      }
      switch (counter.judge(routingId)) {
        case "generated":
          admitted.add(c!)
          return Effect.succeed(true)
        case "verify":
          held.set(peer, { routingId, messages: [received], before: probesIssued })
          return Effect.as(issueProbe, false)
        case "chosen":
          return refuse(routingId, peer, "chosen").pipe(
            Effect.andThen(received.length >= 3 ? answerRefused(routingId, received[1]!, received[2]!) : Effect.void),
            Effect.as(false)
          )
      }
    }

    return {
      isServed: (routingId) => {
        const c = generatedCounterOf(routingId)
        return c !== undefined && admitted.has(c)
      },
      admit,
      forget: (routingId, peer) => {
        const c = generatedCounterOf(routingId)
        if (c !== undefined) admitted.delete(c)
        refused.delete(peer)
      },
      stats: () => ({ refused: { ...refusedSinceStart }, verifying: held.size })
    }
  })
