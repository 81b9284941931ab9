/**
 * One bounded FIFO per peer (routing id), handed on peers in turn (issue 27 item 1: one peer cannot starve the
 * others). Two users: the MQ server's received messages on their way to `onMessage`, and each handler pool's
 * waiting jobs (Dispatch.ts).
 *
 * Threat: one peer sending as fast as it can. libzmq's ROUTER already takes messages from its pipes in turn
 * (fq_t), but what it handed us went through one FIFO to the receive fiber, and each pool through one FIFO to its
 * workers: a burst of one peer sat ahead of everyone else's requests (a fresh client's PING waited behind
 * thousands of a flooder's, a heartbeat behind a LOOKUP flood), and the receive FIFO had no bound, so a peer whose
 * messages came faster than the fiber served them grew the server's memory without limit. Here each peer has its
 * own FIFO with a bound on messages and on bytes; `next` takes one message from each peer with any waiting, in
 * turn, so a peer's burst delays another peer's request by at most one message of its own. A peer at its bound
 * gets nothing more queued (`push` answers false; the server answers `overloaded`).
 *
 * Order: a peer's messages stay in arrival order (its connect notification before its requests, its SYNC ops in
 * the order it sent them); across peers the order is the turns'. A peer whose message is being handled
 * (`next` until `done`) still has it `pending`, so the receive loop's fast path never overtakes it.
 *
 * Plain data, no Effect: the receive loop (a promise loop, the PING hot path of issue 16) pushes, fibers take.
 */
import { compactAfterTake } from "./ArrayQueue.ts"

/** Messages one peer may have waiting to be handled; past it its requests are answered `overloaded`. */
export const MAX_INBOUND_MESSAGES_PER_PEER = 1_000
/** Bytes one peer may have waiting to be handled (the frames after the routing id, as the outbox counts a reply); past it, as above. */
export const MAX_INBOUND_BYTES_PER_PEER = 64 * 1024 * 1024

interface PeerFifo<A> {
  readonly items: Array<{ readonly item: A; readonly bytes: number }>
  head: number
  bytes: number
  /** Taken by `next` and not `done` yet. */
  inService: number
  /** In the rotation (`ring`) now. */
  turning: boolean
}

export interface PeerQueuesStats {
  /** Messages waiting now, all peers. */
  readonly queued: number
  /** Bytes waiting now, all peers. */
  readonly queuedBytes: number
  /** Peers with a message waiting or being handled now. */
  readonly peers: number
  /** Messages refused since start because their peer was at its bound. */
  readonly refused: number
}

export interface PeerQueues<A> {
  /**
   * Queues `item` (`bytes` long) for `key`. False, queuing nothing, when `key` already has
   * {@link MAX_INBOUND_MESSAGES_PER_PEER} messages or the item would take it past {@link MAX_INBOUND_BYTES_PER_PEER}
   * (a peer with nothing waiting always gets one message in, however large). `always`: queued whatever the bounds
   * (a connect or disconnect notification, which must never be lost; there is one per connection event).
   */
  readonly push: (key: string, item: A, bytes: number, always?: boolean) => boolean
  /** The next message, peers in turn, one each per turn; undefined when none waits. Its peer keeps it pending until `done`. */
  readonly next: () => { readonly key: string; readonly item: A } | undefined
  /** The message `next` gave for `key` has been handled. */
  readonly done: (key: string) => void
  /** Messages of `key` waiting or being handled. */
  readonly pending: (key: string) => number
  /** Messages of `key` waiting (not yet taken by `next`): what its bound counts. */
  readonly waiting: (key: string) => number
  /** Messages waiting now, all peers (what `stats().queued` says, without building the stats). */
  readonly size: () => number
  readonly stats: () => PeerQueuesStats
}

/** Empty queues with the inbound bounds by default (`limits` for a pool's share, or tests). */
export const makePeerQueues = <A>(
  limits: { readonly messages: number; readonly bytes: number } = { messages: MAX_INBOUND_MESSAGES_PER_PEER, bytes: MAX_INBOUND_BYTES_PER_PEER }
): PeerQueues<A> => {
  const peers = new Map<string, PeerFifo<A>>()
  const ring: Array<string> = []
  let ringHead = 0
  let queued = 0
  let queuedBytes = 0
  let refused = 0

  const lengthOf = (p: PeerFifo<A>): number => p.items.length - p.head
  const forgetIfIdle = (key: string, p: PeerFifo<A>): void => {
    if (lengthOf(p) === 0 && p.inService === 0 && !p.turning) peers.delete(key)
  }

  return {
    push: (key, item, bytes, always = false) => {
      let p = peers.get(key)
      if (p === undefined) {
        p = { items: [], head: 0, bytes: 0, inService: 0, turning: false }
        peers.set(key, p)
      }
      const length = lengthOf(p)
      if (!always && (length >= limits.messages || (length > 0 && p.bytes + bytes > limits.bytes))) {
        refused++
        forgetIfIdle(key, p)
        return false
      }
      p.items.push({ item, bytes })
      p.bytes += bytes
      queued++
      queuedBytes += bytes
      if (!p.turning) {
        p.turning = true
        ring.push(key)
      }
      return true
    },
    next: () => {
      while (ringHead < ring.length) {
        const key = ring[ringHead++]!
        ringHead = compactAfterTake(ring, ringHead, 1024)
        const p = peers.get(key)
        if (p === undefined) continue
        const entry = p.items[p.head]
        if (entry === undefined) {
          p.turning = false
          forgetIfIdle(key, p)
          continue
        }
        p.items[p.head++] = undefined as unknown as { item: A; bytes: number }
        p.head = compactAfterTake(p.items, p.head, 64)
        p.bytes -= entry.bytes
        queued--
        queuedBytes -= entry.bytes
        p.inService++
        // Back of the line while it has more: one message per peer per turn.
        if (lengthOf(p) > 0) ring.push(key)
        else p.turning = false
        return { key, item: entry.item }
      }
      return undefined
    },
    done: (key) => {
      const p = peers.get(key)
      if (p === undefined) return
      p.inService = Math.max(0, p.inService - 1)
      forgetIfIdle(key, p)
    },
    pending: (key) => {
      const p = peers.get(key)
      return p === undefined ? 0 : lengthOf(p) + p.inService
    },
    waiting: (key) => {
      const p = peers.get(key)
      return p === undefined ? 0 : lengthOf(p)
    },
    size: () => queued,
    stats: () => ({ queued, queuedBytes, peers: peers.size, refused })
  }
}
