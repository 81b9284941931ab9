/**
 * One peer's record in the send path (ReplyOutbox.ts, issue 24 item 10): its outbox (the replies waiting for
 * their turn) and its *window* (the sizes of the large messages among the last H+1 sent to it, whose sum bounds
 * what libzmq may still hold for it). The functions here keep the record's own counts in step; the outbox keeps
 * the totals over all peers and the rotation.
 *
 * Plain objects and functions, no Effects (the PING hot path, issue 16).
 */
import { compactAfterTake } from "./ArrayQueue.ts"

/** Replies of at most this many bytes (all frames) are never refused for bytes and not tracked in the window. */
export const SMALL_REPLY_BYTES = 1024

/** A reply waiting in an outbox, with its frames' bytes. */
export interface Queued {
  message: Array<Uint8Array>
  readonly bytes: number
}

/** Whether a request of the peer may be served now (ReplyOutbox's `whenClear`). */
export type Verdict = "clear" | "stalled"

/** One peer's outbox and window. */
export interface Peer {
  /** Its routing id as latin1 ({@link keyOf}). */
  readonly key: string
  /** Its routing id in hex, as logs and MqServer name peers. */
  readonly hex: string
  readonly routingId: Uint8Array
  readonly queue: Array<Queued>
  head: number
  /** Bytes of the messages in `queue` from `head` on. */
  queuedBytes: number
  /** Messages sent to the peer so far (since this record was made). */
  sent: number
  /** The tracked (larger than SMALL_REPLY_BYTES) messages among the last H+1 sent: their sequence numbers and sizes. */
  readonly bigSeq: Array<number>
  readonly bigBytes: Array<number>
  bigHead: number
  windowBytes: number
  /** When the head started waiting for the pipe (drain proof or EAGAIN); undefined when it has not. */
  waitingSinceMs: number | undefined
  backoffMs: number
  /** Its pipe stayed full past replyWaitMs: each head gets one attempt until a send succeeds again. */
  stalled: boolean
  /** When a send to it last failed with EAGAIN (clock ms): a stalled peer is tried at most once per backoff maximum. */
  lastEagainMs: number | undefined
  /** The message of its turn in progress is a drain probe. */
  draining: boolean
  /** idle: nothing queued; ready: in the rotation; backoff: waiting for its timer. */
  state: "idle" | "ready" | "backoff"
  gone: boolean
  /** Bytes of the large (tracked) replies in `queue` from `head` on. */
  queuedLargeBytes: number
  /** Requests waiting for this peer to be clear or stalled (ReplyOutbox's `whenClear`). */
  clearWaiters: Array<(verdict: Verdict) => void>
}

/**
 * A peer's key: its routing id's bytes as a latin1 string, built in JS (no call into Buffer's C++ per reply: the
 * PING hot path). Hex only where a peer is named (logs, `forget`).
 */
export const keyOf = (routingId: Uint8Array): string => {
  let key = ""
  for (let i = 0; i < routingId.length; i++) key += String.fromCharCode(routingId[i]!)
  return key
}

/** Bytes of a message's frames after the routing id. */
export const bytesOf = (message: Array<Uint8Array>): number => {
  let n = 0
  for (let i = 1; i < message.length; i++) n += message[i]!.byteLength
  return n
}

/**
 * A large frame that is a view into a larger buffer pins all of that buffer while libzmq holds it (zero-copy):
 * msgpackr packs a large value into a buffer of up to 4× its size and packs the next values into the rest. Such a
 * frame is copied (in place in `message`) into a buffer of its own, so that what a reply pins is what it is counted as.
 */
export const exactFrames = (message: Array<Uint8Array>): void => {
  for (let i = 1; i < message.length; i++) {
    const f = message[i]!
    if (f.byteLength > SMALL_REPLY_BYTES && f.buffer.byteLength > f.byteLength + SMALL_REPLY_BYTES) {
      const copy = Buffer.allocUnsafeSlow(f.byteLength)
      copy.set(f)
      message[i] = copy
    }
  }
}

/** A fresh record for `routingId` (key {@link keyOf}): nothing queued, an empty window. */
export const newPeer = (key: string, routingId: Uint8Array): Peer => ({
  key,
  hex: Buffer.from(routingId.buffer, routingId.byteOffset, routingId.byteLength).toString("hex"),
  routingId,
  queue: [],
  head: 0,
  queuedBytes: 0,
  sent: 0,
  bigSeq: [],
  bigBytes: [],
  bigHead: 0,
  windowBytes: 0,
  waitingSinceMs: undefined,
  backoffMs: 0,
  stalled: false,
  lastEagainMs: undefined,
  draining: false,
  state: "idle",
  gone: false,
  queuedLargeBytes: 0,
  clearWaiters: []
})

/** Messages waiting in the peer's outbox. */
export const queueLength = (p: Peer): number => p.queue.length - p.head

/** Drops the window entries older than the last `windowSize` (H+1) sends. */
export const evictWindow = (p: Peer, windowSize: number): void => {
  const oldest = p.sent - windowSize
  while (p.bigHead < p.bigSeq.length && p.bigSeq[p.bigHead]! <= oldest) {
    p.windowBytes -= p.bigBytes[p.bigHead]!
    p.bigHead++
  }
  if (p.bigHead > 1024 && p.bigHead * 2 > p.bigSeq.length) {
    p.bigSeq.splice(0, p.bigHead)
    p.bigBytes.splice(0, p.bigHead)
    p.bigHead = 0
  }
}

/** A message of `bytes` was just sent to the peer (`p.sent` already counts it): a large one enters the window. */
export const recordSent = (p: Peer, bytes: number): void => {
  if (bytes <= SMALL_REPLY_BYTES) return
  p.bigSeq.push(p.sent)
  p.bigBytes.push(bytes)
  p.windowBytes += bytes
}

/** "clear" when no large reply of the peer waits and it is not stalled (or it is gone); "stalled"; else undefined. */
export const verdictOf = (p: Peer): Verdict | undefined =>
  p.gone || (p.queuedLargeBytes === 0 && !p.stalled) ? "clear" : p.stalled ? "stalled" : undefined

/** Tells the peer's waiting requests once it is clear or stalled. */
export const tellWaiters = (p: Peer): void => {
  if (p.clearWaiters.length === 0) return
  const verdict = verdictOf(p)
  if (verdict === undefined) return
  const waiters = p.clearWaiters
  p.clearWaiters = []
  for (const w of waiters) w(verdict)
}

/** Appends `q` to the peer's outbox (its own counts; the caller keeps the total). */
export const pushQueued = (p: Peer, q: Queued): void => {
  p.queue.push(q)
  p.queuedBytes += q.bytes
  if (q.bytes > SMALL_REPLY_BYTES) p.queuedLargeBytes += q.bytes
}

/** Takes the head off the peer's outbox and returns it (its own counts; waiters told when a large one left). */
export const shiftQueued = (p: Peer): Queued => {
  const q = p.queue[p.head]!
  p.queue[p.head] = undefined as unknown as Queued
  p.head++
  p.queuedBytes -= q.bytes
  if (q.bytes > SMALL_REPLY_BYTES) {
    p.queuedLargeBytes -= q.bytes
    tellWaiters(p)
  }
  p.head = compactAfterTake(p.queue, p.head, 1024)
  return q
}

/**
 * Replaces the peer's large head with `replacement` (its refusal), which stays queued in its place; returns the
 * change in queued bytes for the caller's total.
 */
export const replaceHead = (p: Peer, replacement: Queued): number => {
  const q = p.queue[p.head]!
  p.queuedBytes += replacement.bytes - q.bytes
  p.queuedLargeBytes -= q.bytes
  p.queue[p.head] = replacement
  return replacement.bytes - q.bytes
}

/** Whether the record is the same as none: idle, nothing queued or tracked, not stalled, not waiting. */
export const holdsNothing = (p: Peer): boolean =>
  p.state === "idle" && queueLength(p) === 0 && p.windowBytes === 0 && !p.stalled && p.waitingSinceMs === undefined
