/**
 * Which routing ids the server serves (issue 24 item 1, docs/security.md §1).
 *
 * libzmq 4.3's ROUTER gives a peer that sets no routing id one it generates: a zero byte and a 32-bit counter
 * (router.cpp identify_peer). A peer may instead set its own `ZMQ_ROUTING_ID`, and libzmq checks it only against
 * the ids held now: one that claims an id the counter will reach makes libzmq abort the whole process
 * (`Assertion failed: ok (socket_base.cpp:2113)`) when it generates that id for the next connection. The answers:
 *
 * - the counter starts at a random point (libc's rand() seeded from the kernel before the ROUTER exists:
 *   src/native/addon/limits.cc), so no peer can know which ids are coming;
 * - the server learns where the counter stands by probing it (an in-process DEALER whose id it generates:
 *   `BoundRouter.openProbe`), and a peer holding a zero-prefixed 5-byte id that the counter has not generated yet
 *   is kicked at once (`BoundRouter.kick`), so no such claim waits for the counter to reach it;
 * - the server serves only ids its ROUTER generated: a chosen id (any other shape) is answered `forbidden` and
 *   never bound to an instance, a tenant or a lane. So no peer takes over another's id, even during a kick
 *   (which lets the ROUTER hand ids over for one step).
 *
 * This module is the bookkeeping only (no sockets): the counter as far as known, and the verdict on an id.
 */

/** The 32-bit counter of a routing id the ROUTER generated, or undefined for any other shape (a chosen id). */
export const generatedCounterOf = (id: Uint8Array): number | undefined =>
  id.length === 5 && id[0] === 0 ? ((id[1]! << 24) >>> 0) + ((id[2]! << 16) | (id[3]! << 8) | id[4]!) : undefined

/** The routing id the ROUTER generates for counter value `counter` (the inverse of {@link generatedCounterOf}). */
export const generatedRoutingId = (counter: number): Buffer => {
  const id = Buffer.alloc(5)
  id.writeUInt32BE(counter >>> 0, 1)
  return id
}

/**
 * The verdict on a routing id seen for the first time:
 * - `generated`: the counter has passed it: an id the ROUTER generated (or, harmlessly, a chosen copy of one it
 *   generated for a peer that has left: the counter never comes back to it);
 * - `verify`: zero-prefixed and 5 bytes, but past the counter as last known: a probe decides;
 * - `chosen`: another shape: the peer set its own id.
 */
export type RoutingIdVerdict = "generated" | "verify" | "chosen"

/** The ROUTER's counter as the probes showed it. */
export interface RoutingIdCounter {
  /** The verdict on `id` now. */
  readonly judge: (id: Uint8Array) => RoutingIdVerdict
  /**
   * A probe came back with generated id `probeId`: every id generated before it is now `generated`. Returns
   * whether `id` (seen before the probe was issued) was generated before the probe: false means the peer chose
   * an id ahead of the counter.
   */
  readonly probed: (probeId: Uint8Array) => (id: Uint8Array) => boolean
}

/**
 * The counter's bookkeeping from the first id the ROUTER generated (its first probe's). Counters are compared by
 * their distance from that first id, modulo 2^32: the counter wraps only after 2^32 connections.
 */
export const makeRoutingIdCounter = (firstGenerated: number): RoutingIdCounter => {
  // Distance from the first generated id of the newest id known to be generated.
  let known = 0
  const distance = (counter: number): number => (counter - firstGenerated) >>> 0
  return {
    judge: (id) => {
      const counter = generatedCounterOf(id)
      if (counter === undefined) return "chosen"
      return distance(counter) <= known ? "generated" : "verify"
    },
    probed: (probeId) => {
      const probe = generatedCounterOf(probeId)
      if (probe === undefined) return () => false
      const at = distance(probe)
      if (at > known) known = at
      return (id) => {
        const counter = generatedCounterOf(id)
        return counter !== undefined && distance(counter) < at
      }
    }
  }
}
