/**
 * The MQ server's send path (DESIGN §3, §8; issue 24 item 10): one outbox per peer (routing id), drained
 * round-robin by one promise loop (zeromq.js allows one send in flight per socket), with a bound on the bytes
 * queued to each peer.
 *
 * Threat: a peer that never reads its replies. zeromq.js sends a Buffer over 128 bytes zero-copy, so libzmq's pipe
 * to the peer holds our Buffer until the peer's engine has written it; the ROUTER's SNDHWM counts messages, not
 * bytes, so 200 unread 16 MiB replies held 3.1 GiB and nothing was counted. Neither zeromq.js nor libzmq tells us
 * per peer how many bytes are queued, so the bound is proven from what they do guarantee (libzmq 4.3.5
 * src/pipe.cpp, router.cpp, session_base.cpp; stream_engine_base.cpp):
 *
 * - The pipe to a peer takes a message only while fewer than SNDHWM (`highWaterMark`, H) are unread in it by the
 *   peer's session: ROUTER_MANDATORY answers EAGAIN otherwise. The writer's view of the reads lags (it is updated
 *   every (H+1)/2 reads), which only makes a send fail sooner, never succeed with more queued.
 * - The engine takes one message at a time out of the pipe; the message it is writing is the only one it holds by
 *   reference (smaller ones are copied into its batch buffer).
 *
 * So right after a successful send to p, libzmq holds at most the last H+1 messages sent to p. Each peer's
 * *window* tracks the sizes of those messages; their sum (`windowBytes`) bounds what p may still hold. A reply
 * that would take the window past `maxQueuedBytesPerPeer` waits for proof of drain: probes (a lone empty frame,
 * which clients ignore) are sent to p in its turns until the window holds only what fits — each probe that gets
 * into the pipe pushes one older message out of the window, which is sound by FIFO + HWM. A peer that reads gets
 * its reply a few probes later; a peer that does not has a full pipe, its probe fails with EAGAIN, and after
 * `replyWaitMs` the reply is refused: replaced by a small `overloaded` error reply naming the flag, and counted.
 * Its later replies get one attempt each until a send to it succeeds again (`stalled`); an attempt within a backoff
 * maximum ({@link BACKOFF_MAX_MS}) of its last EAGAIN fails without a send, so a peer that reads again is served
 * within that time, and a flood of replies to one that does not costs no send each.
 *
 * What is waiting in the outbox for p is bounded the same way: a reply that would take it past the flag is
 * refused at once, as is one reply larger than the flag. Replies of at most {@link SMALL_REPLY_BYTES} are never
 * refused for bytes (they still wait their turn and fail when the pipe stays full); they are not tracked in the
 * window, so the bound on the pipe is the flag plus (H+1) × 1 KiB. The outbox of p holds at most
 * {@link MAX_QUEUED_MESSAGES} messages; past that a reply is dropped (counted as undeliverable). A reply is counted
 * by its frames' bytes, so a large frame that is a view into a larger buffer is first copied into one of its own
 * (see `exactFrames`).
 *
 * A peer's record (outbox and window) lives until the peer is gone: `forget` (MqServer's confirmed disconnect) or
 * EHOSTUNREACH, or until it holds nothing and a `sweepIdle` drops it.
 *
 * Fairness: peers take turns, one message per turn; a peer waiting for its pipe (EAGAIN, backing off) is out of
 * the rotation until its timer fires, so it never delays anyone else. Replies to one peer stay in order. A peer
 * whose replies back up (`isBackedUp`) loses the MQ server's fast path too (PeerQueues.ts, issue 27 item 1).
 *
 * Connection probes (`probe`, MqServer's disconnect check) bypass the outboxes: they carry nothing and their
 * answer (EHOSTUNREACH or not) does not depend on order.
 *
 * The loop is plain promises, not Effects (the PING hot path, issue 16); its clock is injected so the timing
 * rules are unit-tested on a manual clock.
 */
import {
  bytesOf,
  evictWindow,
  exactFrames,
  holdsNothing,
  keyOf,
  newPeer,
  type Peer,
  pushQueued,
  type Queued,
  queueLength,
  recordSent,
  replaceHead,
  shiftQueued,
  SMALL_REPLY_BYTES,
  tellWaiters,
  type Verdict,
  verdictOf
} from "./OutboxPeer.ts"
import { compactAfterTake } from "./ArrayQueue.ts"
import { type RefusalReason, refusalOf } from "./ReplyRefusal.ts"

/** Messages one peer's outbox holds at most; past it a reply is dropped as undeliverable. */
export const MAX_QUEUED_MESSAGES = 10_000

/** First and largest pause before a peer whose pipe was full (EAGAIN) is tried again, ms. */
const BACKOFF_FIRST_MS = 1
const BACKOFF_MAX_MS = 64

/** Sends the pump makes before it lets the event loop run (see `pump`). */
const PUMP_BATCH = 64

/** Resolves after the event loop's next turn (timers, I/O, immediates queued before it). */
export const yieldToEventLoop = (): Promise<void> => new Promise((resolve) => setImmediate(resolve))

/** The errno-like reason of a reply dropped because its peer's outbox held {@link MAX_QUEUED_MESSAGES}. */
export const OUTBOX_FULL_CODE = "OUTBOX_FULL"

/** The frame of a probe; compared by identity, so a reply that happens to be empty is never taken for one. */
export const PROBE_FRAME = Buffer.alloc(0)

/** Time for the outbox: now in ms, and a timer. */
export interface OutboxClock {
  readonly nowMs: () => number
  readonly after: (ms: number, run: () => void) => void
}

/** The real clock (Date.now, setTimeout). */
export const systemClock: OutboxClock = {
  nowMs: () => Date.now(),
  after: (ms, run) => void setTimeout(run, ms)
}

export interface ReplyOutboxOptions {
  /** The ROUTER's SNDHWM (messages); the window is the last highWaterMark + 1 messages. */
  readonly highWaterMark: number
  /** `--max-queued-reply-bytes-per-peer`: bytes the window, and separately the outbox, of one peer may hold. */
  readonly maxQueuedBytesPerPeer: number
  /** How long a reply may wait for its peer's pipe (drain proof, EAGAIN) before it is refused or dropped, ms. */
  readonly replyWaitMs: number
  /**
   * Sends one message (`[routing id, ...frames]`); resolves undefined when libzmq took it, else libzmq's errno
   * name (EAGAIN: the pipe is full; EHOSTUNREACH: the peer is gone). Never rejects.
   */
  readonly send: (message: Array<Uint8Array>) => Promise<string | undefined>
  /** A reply to `peer` (routing id, hex) could not be delivered; `code` is the errno name or {@link OUTBOX_FULL_CODE}. */
  readonly onUndeliverable: (peer: string, code: string) => void
  /** A reply of `bytes` to `peer` was refused for `reason`; an `overloaded` error reply takes its place. */
  readonly onRefused: (peer: string, reason: RefusalReason, bytes: number) => void
  readonly clock?: OutboxClock
}

/** Counters and depths of the outbox. */
export interface ReplyOutboxStats {
  /** Replies refused since start, by reason. */
  readonly refused: Readonly<Record<RefusalReason, number>>
  /** Drain probes sent since start. */
  readonly drainProbes: number
  /** Bytes waiting in the outboxes now, all peers. */
  readonly queuedBytes: number
  /** Peers with a reply waiting for their pipe (drain proof or EAGAIN) now. */
  readonly waitingPeers: number
  /** Peers with a record (outbox and window) now. */
  readonly peers: number
}

export interface ReplyOutbox {
  /** Queues `message` (`[routing id, uid, op, ...]`) for its peer, or its refusal; sends in the peer's turn. */
  readonly reply: (message: Array<Uint8Array>) => void
  /** A connection probe: false only for EHOSTUNREACH (the ROUTER dropped the peer's pipe). */
  readonly probe: (routingId: Uint8Array) => Promise<boolean>
  /**
   * Whether a request of this peer may be served now: "clear" when no large reply of its waits in its outbox and
   * it is not stalled; "stalled" when its pipe stayed full past the wait (its replies are being refused). Otherwise
   * it resolves when one of those holds — at most `replyWaitMs` later. The MQ server asks before a request whose
   * reply may be large is handled, so a peer that does not read makes the server build no more replies for it
   * ("or the request is not served": the garbage of replies built only to be refused is what grew its memory).
   * Synchronous for the common case: `undefined` means "clear" without a promise.
   */
  readonly whenClear: (routingId: Uint8Array) => Promise<Verdict> | undefined
  /**
   * Whether replies to this peer are backing up (issue 27 item 1): its pipe stayed full past the wait (stalled),
   * a reply of its waits for its pipe now, or its outbox holds at least `highWaterMark` replies (as many as its
   * whole pipe). The MQ server stops answering such a peer on the fast path, so it waits its turn with the others
   * and is the one slowed down, never them.
   */
  readonly isBackedUp: (routingId: Uint8Array) => boolean
  /** Counts a request refused unserved for a stalled peer (reason `not_served`) and returns its error reply. */
  readonly notServed: (message: Array<Uint8Array>) => Array<Uint8Array>
  /** The peer (hex) is gone: what waits for it is dropped (counted undeliverable) and its window forgotten. */
  readonly forget: (peer: string) => void
  /**
   * Drops the records of peers that hold nothing: no reply waiting, nothing tracked in the window, not stalled.
   * Such a record is the same as none (a new one starts with an empty window), so peers whose disconnect is never
   * confirmed (a refused routing id, a kicked one) cost nothing once idle. Returns how many it dropped.
   */
  readonly sweepIdle: () => number
  /** Resolves once every outbox is empty (a reply waits at most `replyWaitMs`). */
  readonly flushed: () => Promise<void>
  readonly stats: () => ReplyOutboxStats
}

/** An outbox over `options.send`; see the module comment for the rules. */
export const makeReplyOutbox = (options: ReplyOutboxOptions): ReplyOutbox => {
  const clock = options.clock ?? systemClock
  const limit = options.maxQueuedBytesPerPeer
  const windowSize = options.highWaterMark + 1
  const peers = new Map<string, Peer>()
  const ready: Array<Peer> = []
  let readyHead = 0
  const probes: Array<{ readonly message: Array<Uint8Array>; readonly settle: (delivered: boolean) => void }> = []
  const refused: Record<RefusalReason, number> = { reply_too_large: 0, outbox_full: 0, not_drained: 0, not_served: 0 }
  let drainProbes = 0
  let queuedBytes = 0
  // Whether the send loop is running; set and cleared inside it, so a loop that ends at once leaves it clear.
  let pumping = false
  let flushWaiters: Array<() => void> = []

  const peerOf = (routingId: Uint8Array): Peer => {
    const key = keyOf(routingId)
    let p = peers.get(key)
    if (p === undefined) {
      p = newPeer(key, routingId)
      peers.set(key, p)
    }
    return p
  }

  const evict = (p: Peer): void => evictWindow(p, windowSize)

  const enqueue = (p: Peer, q: Queued): void => {
    pushQueued(p, q)
    queuedBytes += q.bytes
    if (p.state === "idle") schedule(p)
    kick()
  }

  const dequeue = (p: Peer): void => {
    queuedBytes -= shiftQueued(p).bytes
  }

  const schedule = (p: Peer): void => {
    if (p.gone || queueLength(p) === 0) {
      p.state = "idle"
      settleFlushed()
      return
    }
    p.state = "ready"
    ready.push(p)
  }

  const refuse = (p: Peer, q: Queued, reason: RefusalReason, held: number): Queued => {
    refused[reason]++
    options.onRefused(p.hex, reason, q.bytes)
    const message = refusalOf(q.message, reason, q.bytes, held, limit)
    return { message, bytes: bytesOf(message) }
  }

  /** The head could not go in time: a large reply is refused in place, a small one dropped. */
  const giveUp = (p: Peer, reason: string): void => {
    const q = p.queue[p.head]!
    p.waitingSinceMs = undefined
    p.backoffMs = 0
    if (q.bytes > SMALL_REPLY_BYTES) {
      evict(p)
      queuedBytes += replaceHead(p, refuse(p, q, "not_drained", p.windowBytes))
    } else {
      dequeue(p)
      options.onUndeliverable(p.hex, reason)
    }
  }

  const dropAll = (p: Peer, code: string): void => {
    while (queueLength(p) > 0) {
      dequeue(p)
      options.onUndeliverable(p.hex, code)
    }
  }

  /**
   * The start of `p`'s turn: the message to try (its head, or a drain probe for it), or undefined when the turn
   * ended without a send (its head gave up waiting). One await per message in the loop: this is the PING hot path.
   */
  const start = (p: Peer): Array<Uint8Array> | undefined => {
    if (p.waitingSinceMs !== undefined && clock.nowMs() - p.waitingSinceMs >= options.replyWaitMs) {
      giveUp(p, "EAGAIN")
      p.stalled = true
      tellWaiters(p)
      schedule(p)
      return undefined
    }
    const q = p.queue[p.head]!
    if (q.bytes <= SMALL_REPLY_BYTES) {
      p.draining = false
      return q.message
    }
    evict(p)
    p.draining = p.windowBytes + q.bytes > limit
    return p.draining ? [p.routingId, PROBE_FRAME] : q.message
  }

  /** The end of `p`'s turn: libzmq answered `code` (undefined: taken). */
  const finish = (p: Peer, code: string | undefined): void => {
    if (p.gone) return
    if (code === undefined) {
      p.sent++
      if (p.stalled) {
        p.stalled = false
        tellWaiters(p)
      }
      p.backoffMs = 0
      if (p.draining) {
        drainProbes++
        p.waitingSinceMs ??= clock.nowMs()
      } else {
        recordSent(p, p.queue[p.head]!.bytes)
        dequeue(p)
        p.waitingSinceMs = undefined
      }
      return schedule(p)
    }
    if (code !== "EAGAIN") {
      // Gone (EHOSTUNREACH) or the socket is closing: nothing queued for it can be delivered.
      p.gone = true
      dropAll(p, code)
      tellWaiters(p)
      p.state = "idle"
      if (peers.get(p.key) === p) peers.delete(p.key)
      return settleFlushed()
    }
    if (p.stalled) {
      giveUp(p, code)
      tellWaiters(p)
      return schedule(p)
    }
    p.waitingSinceMs ??= clock.nowMs()
    p.backoffMs = Math.min(BACKOFF_MAX_MS, Math.max(BACKOFF_FIRST_MS, p.backoffMs * 2))
    p.state = "backoff"
    clock.after(p.backoffMs, () => {
      if (p.gone || p.state !== "backoff") return
      schedule(p)
      kick()
    })
  }

  const pump = async (): Promise<void> => {
    pumping = true
    let sinceYield = 0
    for (;;) {
      // A send that libzmq answers at once (taken, EAGAIN) resolves in a microtask, so a long backlog (a stalled
      // peer's replies, each given one attempt) would keep this loop from ever letting the event loop run: the
      // receive loop, the fibers and the timers would wait for it (issue 27 item 1). It yields now and then.
      if (++sinceYield >= PUMP_BATCH) {
        sinceYield = 0
        await yieldToEventLoop()
      }
      const probe = probes.shift()
      if (probe !== undefined) {
        const code = await options.send(probe.message)
        const p = peers.get(keyOf(probe.message[0]!))
        if (code === undefined && p !== undefined) p.sent++
        // Only EHOSTUNREACH means gone: a full pipe (EAGAIN) belongs to a live, slow peer.
        probe.settle(code !== "EHOSTUNREACH")
        continue
      }
      if (readyHead === ready.length) break
      const p = ready[readyHead]!
      ready[readyHead++] = undefined as unknown as Peer
      readyHead = compactAfterTake(ready, readyHead, 1024)
      if (p.gone || p.state !== "ready") continue
      try {
        const message = start(p)
        if (message === undefined) continue
        // A stalled peer's pipe stayed full past the wait: its replies fail as a send would, without one, until a
        // backoff maximum has passed since its last try (one send per flooded reply cost the loop most of its time).
        if (p.stalled && p.lastEagainMs !== undefined && clock.nowMs() - p.lastEagainMs < BACKOFF_MAX_MS) {
          finish(p, "EAGAIN")
          continue
        }
        const code = await options.send(message)
        if (code === "EAGAIN") p.lastEagainMs = clock.nowMs()
        finish(p, code)
      } catch {
        // A bug in a turn must not stop the loop or spin on the same head: that reply is dropped and counted.
        if (queueLength(p) > 0) {
          dequeue(p)
          options.onUndeliverable(p.hex, "INTERNAL")
        }
        p.waitingSinceMs = undefined
        schedule(p)
      }
    }
    pumping = false
    settleFlushed()
  }

  const kick = (): void => {
    if (!pumping) void pump()
  }

  const isFlushed = (): boolean => !pumping && queuedBytes === 0 && probes.length === 0 && [...peers.values()].every((p) => queueLength(p) === 0)

  const settleFlushed = (): void => {
    if (flushWaiters.length === 0 || !isFlushed()) return
    const waiters = flushWaiters
    flushWaiters = []
    waiters.forEach((w) => w())
  }

  return {
    reply: (message) => {
      const p = peerOf(message[0]!)
      const bytes = bytesOf(message)
      let q: Queued = { message, bytes }
      if (queueLength(p) >= MAX_QUEUED_MESSAGES) {
        return options.onUndeliverable(p.hex, OUTBOX_FULL_CODE)
      }
      if (bytes > SMALL_REPLY_BYTES) {
        if (bytes > limit) q = refuse(p, q, "reply_too_large", 0)
        else if (p.queuedBytes + bytes > limit) q = refuse(p, q, "outbox_full", p.queuedBytes)
        else exactFrames(message)
      }
      enqueue(p, q)
    },
    whenClear: (routingId) => {
      const p = peers.get(keyOf(routingId))
      if (p === undefined) return undefined
      const verdict = verdictOf(p)
      if (verdict === "clear") return undefined
      if (verdict === "stalled") return Promise.resolve("stalled")
      return new Promise((resolve) => {
        p.clearWaiters.push(resolve)
      })
    },
    isBackedUp: (routingId) => {
      const p = peers.get(keyOf(routingId))
      return p !== undefined && (p.stalled || p.waitingSinceMs !== undefined || queueLength(p) >= options.highWaterMark)
    },
    notServed: (message) => {
      const p = peerOf(message[0]!)
      refused.not_served++
      options.onRefused(p.hex, "not_served", 0)
      return refusalOf(message, "not_served", 0, p.windowBytes + p.queuedBytes, limit)
    },
    probe: (routingId) =>
      new Promise((resolve) => {
        probes.push({ message: [routingId, PROBE_FRAME], settle: resolve })
        kick()
      }),
    forget: (peer) => {
      const p = peers.get(Buffer.from(peer, "hex").toString("latin1"))
      if (p === undefined) return
      p.gone = true
      peers.delete(p.key)
      dropAll(p, "EHOSTUNREACH")
      tellWaiters(p)
      p.state = "idle"
      settleFlushed()
    },
    sweepIdle: () => {
      let dropped = 0
      for (const p of peers.values()) {
        evict(p)
        if (holdsNothing(p)) {
          peers.delete(p.key)
          dropped++
        }
      }
      return dropped
    },
    flushed: () =>
      isFlushed() ? Promise.resolve() : new Promise<void>((resolve) => {
        flushWaiters.push(resolve)
      }),
    stats: () => ({
      refused: { ...refused },
      drainProbes,
      queuedBytes,
      waitingPeers: [...peers.values()].filter((p) => p.waitingSinceMs !== undefined).length,
      peers: peers.size
    })
  }
}
