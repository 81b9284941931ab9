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

export interface TokenTable<A> {
  /** A new token for `grant`, or undefined when `maxPending` are pending already. */
  readonly issue: (
    grant: Omit<PendingToken<A>, "hex" | "expiresAtMs">,
    nowMs: number
  ) => { readonly token: Uint8Array; readonly pending: PendingToken<A> } | undefined
  /** Claims `hex` for `instanceId` on connection `peer` (see the module doc for the rules). */
  readonly claim: (hex: string, instanceId: bigint, peer: string, nowMs: number) => ClaimResult<A>
  /** Removes and returns every token whose deadline is ≤ `nowMs` (remembered as expired). */
  readonly expire: (nowMs: number) => ReadonlyArray<PendingToken<A>>
  /** Removes and returns `peer`'s tokens (its connection closed); remembered as expired. */
  readonly dropPeer: (peer: string) => ReadonlyArray<PendingToken<A>>
  /** Removes and returns every token (shutdown). */
  readonly drain: () => ReadonlyArray<PendingToken<A>>
  readonly pending: () => ReadonlyArray<PendingToken<A>>
}

/** Bytes of a token: 128 bits. */
export const TOKEN_BYTES = 16

/**
 * An empty table: tokens live `ttlMs`; at most `maxPending` at once; the
 * last `maxRemembered` used or expired hexes are remembered (older ones
 * read "unknown").
 */
export const makeTokenTable = <A>(options: {
  readonly ttlMs: number
  readonly maxPending: number
  readonly maxRemembered: number
  /** Random bytes; crypto.randomBytes by default. */
  readonly random?: (n: number) => Uint8Array
}): TokenTable<A> => {
  const random = options.random ?? ((n: number) => new Uint8Array(randomBytes(n)))
  const pending = new Map<string, PendingToken<A>>()
  const spent = new Map<string, "used" | "expired">()
  const remember = (hex: string, how: "used" | "expired") => {
    spent.delete(hex)
    spent.set(hex, how)
    if (spent.size > options.maxRemembered) spent.delete(spent.keys().next().value!)
  }
  const removeWhere = (test: (t: PendingToken<A>) => boolean) => {
    const out: Array<PendingToken<A>> = []
    for (const t of pending.values()) if (test(t)) out.push(t)
    for (const t of out) {
      pending.delete(t.hex)
      remember(t.hex, "expired")
    }
    return out
  }
  return {
    issue: (grant, nowMs) => {
      if (pending.size >= options.maxPending) return undefined
      const token = random(TOKEN_BYTES)
      const hex = Buffer.from(token).toString("hex")
      const entry: PendingToken<A> = { ...grant, hex, expiresAtMs: nowMs + options.ttlMs }
      pending.set(hex, entry)
      return { token, pending: entry }
    },
    claim: (hex, instanceId, peer, nowMs) => {
      const t = pending.get(hex)
      if (t === undefined) return { _tag: "Refused", reason: spent.get(hex) ?? "unknown", token: undefined }
      if (t.expiresAtMs <= nowMs) {
        pending.delete(hex)
        remember(hex, "expired")
        return { _tag: "Refused", reason: "expired", token: t }
      }
      if (t.peer !== peer) return { _tag: "Refused", reason: "peer", token: undefined }
      if (t.instanceId !== instanceId) return { _tag: "Refused", reason: "instance", token: undefined }
      pending.delete(hex)
      remember(hex, "used")
      return { _tag: "Claimed", token: t }
    },
    expire: (nowMs) => removeWhere((t) => t.expiresAtMs <= nowMs),
    dropPeer: (peer) => removeWhere((t) => t.peer === peer),
    drain: () => removeWhere(() => true),
    pending: () => [...pending.values()]
  }
}
