/**
 * The one-time tokens of passed descriptors (issue 13 item 2, docs/memfd.md
 * "Tokens"). A token is 128 random bits the descriptor socket answers for
 * one request's descriptors; REGISTER_KV_CACHE names it to map them. It is
 * tied to what the request declared and to who sent it:
 *
 * - the ZeroMQ connection (`peer`, the ROUTER routing id) whose
 *   GET_SERVER_INFO nonce the request named: a REGISTER on any other
 *   connection is refused ("peer") and the token stays usable by its owner;
 * - the `instance_id` the request declared: a REGISTER of another id is
 *   refused ("instance"), the token stays;
 * - the sender's SO_PEERCRED pid/uid/gid, recorded for /api/status.
 *
 * It is used at most once: a successful claim removes it and remembers its
 * hex as used, so a replay is refused ("used"); a token past its deadline is
 * refused ("expired") and its descriptors handed back for closing, as the
 * sweep (`expire`) does for every token nobody claimed in time. A connection
 * that closes revokes its tokens (`dropPeer`). Time is the caller's `nowMs`
 * (read from the Clock: TestClock in tests).
 *
 * The deadline is fixed when the token is issued (issue 24 item 8: "closed
 * when its lifetime ends whether or not it is renewed"): nothing moves it —
 * not a claim refused for another connection or instance, not a new request
 * of the same connection for the same instance (that is a token of its own,
 * with its own deadline), not the connection's other traffic.
 *
 * What the tokens hold is bounded by its `weight` (the descriptors), in all
 * and per connection (issue 24 item 8): over either, `issue` refuses and
 * says which, so the caller answers `overloaded` naming the flag.
 */
import { randomBytes } from "node:crypto"

/** One token not yet claimed: what it was issued for and what it holds (the descriptors). */
export interface PendingToken<A> {
  readonly hex: string
  readonly peer: string
  readonly instanceId: bigint
  readonly pid: number
  readonly uid: number
  readonly gid: number
  readonly expiresAtMs: number
  readonly value: A
}

/** Why a claim was refused. */
export type ClaimRefusal = "unknown" | "used" | "expired" | "instance" | "peer"

/** A claim's outcome; a refusal for "expired" also hands back the token (its descriptors are to be closed). */
export type ClaimResult<A> =
  | { readonly _tag: "Claimed"; readonly token: PendingToken<A> }
  | { readonly _tag: "Refused"; readonly reason: ClaimRefusal; readonly token: PendingToken<A> | undefined }

/**
 * An issue's outcome: the token, or why not — `total`: the tokens would hold
 * more than `maxHeld`; `peer`: the connection's tokens more than
 * `maxHeldPerPeer` (`held`: what they hold now, before this grant).
 */
export type IssueResult<A> =
  | { readonly _tag: "Issued"; readonly token: Uint8Array; readonly pending: PendingToken<A> }
  | { readonly _tag: "Refused"; readonly reason: "total" | "peer"; readonly held: number; readonly cap: number }

export interface TokenTable<A> {
  /** A new token for `grant`, or a refusal when its weight would pass `maxHeld` or the peer's `maxHeldPerPeer`. */
  readonly issue: (grant: Omit<PendingToken<A>, "hex" | "expiresAtMs">, nowMs: number) => IssueResult<A>
  /** Claims `hex` for `instanceId` on connection `peer` (see the module doc for the rules). */
  readonly claim: (hex: string, instanceId: bigint, peer: string, nowMs: number) => ClaimResult<A>
  /** Removes and returns every token whose deadline is ≤ `nowMs` (remembered as expired). */
  readonly expire: (nowMs: number) => ReadonlyArray<PendingToken<A>>
  /** Removes and returns `peer`'s tokens (its connection closed); remembered as expired. */
  readonly dropPeer: (peer: string) => ReadonlyArray<PendingToken<A>>
  /** Removes and returns every token (shutdown). */
  readonly drain: () => ReadonlyArray<PendingToken<A>>
  readonly pending: () => ReadonlyArray<PendingToken<A>>
  /** The weight (descriptors) every pending token holds together. */
  readonly held: () => number
}

/** Bytes of a token: 128 bits. */
export const TOKEN_BYTES = 16

/**
 * An empty table: tokens live `ttlMs` from their issue; together they hold
 * at most `maxHeld` of `weight` (a token's descriptors), those of one peer at
 * most `maxHeldPerPeer`; the last `maxRemembered` used or expired hexes are
 * remembered (older ones read "unknown").
 */
export const makeTokenTable = <A>(options: {
  readonly ttlMs: number
  readonly maxHeld: number
  readonly maxHeldPerPeer: number
  readonly weight: (value: A) => number
  readonly maxRemembered: number
  /** Random bytes; crypto.randomBytes by default. */
  readonly random?: (n: number) => Uint8Array
}): TokenTable<A> => {
  const random = options.random ?? ((n: number) => new Uint8Array(randomBytes(n)))
  const pending = new Map<string, PendingToken<A>>()
  const spent = new Map<string, "used" | "expired">()
  /** peer → the weight its pending tokens hold (absent: none). */
  const heldBy = new Map<string, number>()
  let heldTotal = 0
  const remember = (hex: string, how: "used" | "expired") => {
    spent.delete(hex)
    spent.set(hex, how)
    if (spent.size > options.maxRemembered) spent.delete(spent.keys().next().value!)
  }
  const take = (t: PendingToken<A>, how: "used" | "expired") => {
    pending.delete(t.hex)
    remember(t.hex, how)
    const w = options.weight(t.value)
    heldTotal -= w
    const left = (heldBy.get(t.peer) ?? 0) - w
    if (left > 0) heldBy.set(t.peer, left)
    else heldBy.delete(t.peer)
  }
  const removeWhere = (test: (t: PendingToken<A>) => boolean) => {
    const out: Array<PendingToken<A>> = []
    for (const t of pending.values()) if (test(t)) out.push(t)
    for (const t of out) take(t, "expired")
    return out
  }
  return {
    issue: (grant, nowMs) => {
      const w = options.weight(grant.value)
      const peerHeld = heldBy.get(grant.peer) ?? 0
      if (heldTotal + w > options.maxHeld) return { _tag: "Refused", reason: "total", held: heldTotal, cap: options.maxHeld }
      if (peerHeld + w > options.maxHeldPerPeer) return { _tag: "Refused", reason: "peer", held: peerHeld, cap: options.maxHeldPerPeer }
      const token = random(TOKEN_BYTES)
      const hex = Buffer.from(token).toString("hex")
      const entry: PendingToken<A> = { ...grant, hex, expiresAtMs: nowMs + options.ttlMs }
      pending.set(hex, entry)
      heldTotal += w
      heldBy.set(grant.peer, peerHeld + w)
      return { _tag: "Issued", token, pending: entry }
    },
    claim: (hex, instanceId, peer, nowMs) => {
      const t = pending.get(hex)
      if (t === undefined) return { _tag: "Refused", reason: spent.get(hex) ?? "unknown", token: undefined }
      if (t.expiresAtMs <= nowMs) {
        take(t, "expired")
        return { _tag: "Refused", reason: "expired", token: t }
      }
      if (t.peer !== peer) return { _tag: "Refused", reason: "peer", token: undefined }
      if (t.instanceId !== instanceId) return { _tag: "Refused", reason: "instance", token: undefined }
      take(t, "used")
      return { _tag: "Claimed", token: t }
    },
    expire: (nowMs) => removeWhere((t) => t.expiresAtMs <= nowMs),
    dropPeer: (peer) => removeWhere((t) => t.peer === peer),
    drain: () => removeWhere(() => true),
    pending: () => [...pending.values()],
    held: () => heldTotal
  }
}
