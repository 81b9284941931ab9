/**
 * Replies the ROUTER could not deliver (issue 18) or that were refused for the
 * bytes queued to their peer (issue 24 item 10), told to the operator: the
 * counters (`mpcache_undeliverable_replies_total`, `mpcache_refused_replies_total`)
 * count every one; a tally adds one WARNING per peer and window with the count
 * and the reasons (EHOSTUNREACH: the peer is gone; EAGAIN: its pipe stayed
 * full; not_drained: it did not read its replies …), so a flood of failed
 * replies costs one log line per peer every few seconds, not one per reply.
 * The MQ server records on its send path (synchronous, no fiber) and runs the
 * reporter in its scope; what is left is told when the scope closes.
 */
import { Effect } from "effect"
import { BACKED_UP_MESSAGES_PER_SECOND } from "./ReceiveBrake.ts"

/** The default window: at most one WARNING per peer in this many ms. */
export const UNDELIVERED_WARNING_INTERVAL_MS = 5_000

export interface PeerTally {
  /** Counts one reply to `peer` (routing id, hex) and why (`reason`: an errno name or a refusal reason). */
  readonly record: (peer: string, reason: string) => void
  /** Logs one WARNING per peer recorded since the last report, and forgets them. */
  readonly report: Effect.Effect<void>
  /** Reports every `intervalMs` (Clock time) for the life of the caller's scope, and once more at its end. */
  readonly reportForever: Effect.Effect<never>
}

/** A tally reporting every `intervalMs`, each peer's line written by `line`. */
const makePeerTally = (
  intervalMs: number,
  line: (count: number, peer: string, reasons: string) => string,
  annotation: string
): PeerTally => {
  const byPeer = new Map<string, { count: number; readonly reasons: Set<string> }>()
  const report = Effect.suspend(() => {
    if (byPeer.size === 0) return Effect.void
    const peers = [...byPeer]
    byPeer.clear()
    return Effect.forEach(peers, ([peer, { count, reasons }]) =>
      Effect.logWarning(line(count, peer, [...reasons].join(", "))).pipe(Effect.annotateLogs({ peer, [annotation]: count })), {
      discard: true
    })
  })
  return {
    record: (peer, reason) => {
      const seen = byPeer.get(peer)
      if (seen === undefined) byPeer.set(peer, { count: 1, reasons: new Set([reason]) })
      else {
        seen.count++
        seen.reasons.add(reason)
      }
    },
    report,
    reportForever: report.pipe(Effect.delay(intervalMs), Effect.forever, Effect.ensuring(report))
  }
}

const replies = (count: number) => `${count} repl${count === 1 ? "y" : "ies"}`

/** Undeliverable replies, reported every `intervalMs`. */
export const makeUndeliveredReplies = (intervalMs: number = UNDELIVERED_WARNING_INTERVAL_MS): PeerTally =>
  makePeerTally(
    intervalMs,
    (count, peer, reasons) =>
      `${replies(count)} to peer ${peer} could not be delivered (${reasons}: the peer is gone or its pipe is full) in the last ${intervalMs / 1000} s`,
    "undeliverable_replies"
  )

/** Replies refused for the bytes queued to their peer (each answered `overloaded` instead), reported every `intervalMs`. */
export const makeRefusedReplies = (intervalMs: number = UNDELIVERED_WARNING_INTERVAL_MS): PeerTally =>
  makePeerTally(
    intervalMs,
    (count, peer, reasons) =>
      `${replies(count)} to peer ${peer} refused with overloaded (${reasons}): the bytes queued to it would pass --max-queued-reply-bytes-per-peer; it is not reading its replies, or asks for more than one reply may carry; in the last ${intervalMs / 1000} s`,
    "refused_replies"
  )

/**
 * Requests shed unhandled because their peer had too many waiting (answered `overloaded`, or not answered when its
 * replies already back up), reported every `intervalMs`.
 */
export const makeShedRequests = (intervalMs: number = UNDELIVERED_WARNING_INTERVAL_MS): PeerTally =>
  makePeerTally(
    intervalMs,
    (count, peer, reasons) =>
      `${count} request${count === 1 ? "" : "s"} from peer ${peer} shed without being handled (${reasons}; answered overloaded unless its replies back up): it sends faster than the server serves it, while other peers get their turns; in the last ${intervalMs / 1000} s`,
    "shed_requests"
  )

/**
 * Messages taken from a peer whose replies back up, under the receive loop's brake (ReceiveBrake.ts, issue 27 item
 * 1): the peer is held to its share, the others are not; reported every `intervalMs`.
 */
export const makeBrakedRequests = (intervalMs: number = UNDELIVERED_WARNING_INTERVAL_MS): PeerTally =>
  makePeerTally(
    intervalMs,
    (count, peer, reasons) =>
      `${count} message${count === 1 ? "" : "s"} from peer ${peer} taken under the receive loop's brake (${reasons}): it is not reading its replies, so the server takes at most ${BACKED_UP_MESSAGES_PER_SECOND.toLocaleString("en-US")} a second from such peers and it waits in its own send; others are not slowed; in the last ${intervalMs / 1000} s`,
    "braked_messages"
  )
