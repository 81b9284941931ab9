/**
 * Replies the ROUTER could not deliver, told to the operator (issue 18): the
 * counter `mpcache_undeliverable_replies_total` counts every one; this tally
 * adds one WARNING per peer and window with the count and the errno names
 * (EHOSTUNREACH: the peer is gone; EAGAIN: its pipe is full), so a flood of
 * failed replies costs one log line per peer every few seconds, not one per
 * reply. The MQ server records on its send path (synchronous, no fiber) and
 * runs the reporter in its scope; what is left is told when the scope closes.
 */
import { Effect } from "effect"

/** The default window: at most one WARNING per peer in this many ms. */
export const UNDELIVERED_WARNING_INTERVAL_MS = 5_000

export interface UndeliveredReplies {
  /** Counts one undeliverable reply to `peer` (routing id, hex) and why (`reason`: an errno name). */
  readonly record: (peer: string, reason: string) => void
  /** Logs one WARNING per peer recorded since the last report, and forgets them. */
  readonly report: Effect.Effect<void>
  /** Reports every `intervalMs` (Clock time) for the life of the caller's scope, and once more at its end. */
  readonly reportForever: Effect.Effect<never>
}

/** A tally reporting every `intervalMs`. */
export const makeUndeliveredReplies = (intervalMs: number = UNDELIVERED_WARNING_INTERVAL_MS): UndeliveredReplies => {
  const byPeer = new Map<string, { count: number; readonly reasons: Set<string> }>()
  const report = Effect.suspend(() => {
    if (byPeer.size === 0) return Effect.void
    const peers = [...byPeer]
    byPeer.clear()
    return Effect.forEach(peers, ([peer, { count, reasons }]) =>
      Effect.logWarning(
        `${count} repl${count === 1 ? "y" : "ies"} to peer ${peer} could not be delivered (${[...reasons].join(", ")}: ` +
          `the peer is gone or its pipe is full) in the last ${intervalMs / 1000} s`
      ).pipe(Effect.annotateLogs({ peer, undeliverable_replies: count })), { discard: true })
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
