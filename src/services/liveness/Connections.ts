/**
 * Connection loss (DESIGN §5): which routing ids each instance is bound to,
 * and which instances have lost all of them.
 *
 * A routing id becomes bound to an instance when a request from it naming
 * that held instance succeeds (REGISTER, PING [id], PING_REGISTERED, a
 * transfer). When none of an instance's bound routing ids is still
 * connected, the instance is `suspect` from that moment; a later successful
 * request naming it from a connected routing id binds that one and clears
 * the suspicion. The reaper reaps an instance suspect for longer than
 * `--worker-disconnect-grace-seconds` (reason `disconnect`). On loopback
 * and ipc a disconnect means a closed socket or a dead process.
 */
import { Clock, Context, Effect, Layer, Metric, Queue } from "effect"
import { LivenessSettings } from "./LivenessSettings.ts"
import type { InstanceId } from "../../schema/InstanceId.ts"
import { LivenessTargets } from "./LivenessTarget.ts"
import { PeerEvents } from "./PeerEvents.ts"
import { disconnectReapingOn, type Windows } from "./Rule.ts"
import { fromStart } from "../metrics/Series.ts"

const suspectGauge = fromStart(Metric.gauge("mpcache_suspect_instances", {
  description: "Instances with no connected routing id left (waiting out the disconnect grace)"
}))

export class Connections extends Context.Service<Connections, {
  /** What the MQ server reports to (provided as the PeerEvents service). */
  readonly events: PeerEvents["Service"]
  /** Suspect instances and since when (Clock millis). */
  readonly suspects: () => ReadonlyMap<bigint, number>
  /** Forgets an instance (reaped or no longer held by any module). */
  readonly forget: (id: bigint) => void
  /** Drops bookkeeping of instances no module holds any more (unregistered). */
  readonly prune: () => Effect.Effect<void>
  readonly stats: () => { readonly connectedPeers: number; readonly boundInstances: number; readonly suspects: number }
  /**
   * Signals, one per suspect instance, just after its disconnect grace ran
   * out: the reaper scans at once instead of at its next tick, so a dead
   * worker is reaped within the grace plus a scan, not the grace plus half
   * a grace.
   */
  readonly graceExpired: Queue.Dequeue<void>
}>()("mpcache/services/Connections") {
  static readonly layer = Layer.effect(
    this,
    Effect.gen(function*() {
      const targets = yield* LivenessTargets
      const { windows } = yield* LivenessSettings
      const graceExpired = yield* Queue.unbounded<void>()
      const scope = yield* Effect.scope
      const connected = new Set<string>()
      const bindings = new Map<bigint, Set<string>>()
      const peerInstances = new Map<string, Set<bigint>>()
      const suspects = new Map<bigint, number>()

      const held = (id: InstanceId) =>
        Effect.map(Effect.forEach(targets, (t) => t.holdsInstance(id)), (answers) => answers.some(Boolean))

      const forget = (id: bigint) => {
        for (const peer of bindings.get(id) ?? []) peerInstances.get(peer)?.delete(id)
        bindings.delete(id)
        suspects.delete(id)
      }

      const events: PeerEvents["Service"] = {
        connected: (peer) => Effect.sync(() => void connected.add(peer)),
        disconnected: (peer) =>
          Effect.gen(function*() {
            connected.delete(peer)
            const ids = peerInstances.get(peer)
            peerInstances.delete(peer)
            if (ids === undefined) return
            const now = yield* Clock.currentTimeMillis
            for (const id of ids) {
              const peers = bindings.get(id)
              peers?.delete(peer)
              if (peers === undefined || peers.size === 0) {
                bindings.delete(id)
                // A worker that said goodbye (UNREGISTER) and then closed its socket departed: nothing
                // to suspect or reap (issue 29 item 5: this read as a crash in the log).
                if (!suspects.has(id) && !(yield* held(id as InstanceId))) {
                  forget(id)
                  yield* Effect.logInfo(`instance ${id} departed: it unregistered, then closed its connection`)
                  continue
                }
                if (!suspects.has(id)) {
                  suspects.set(id, now)
                  yield* Effect.logInfo(`instance ${id} lost its last connection; suspect`)
                  if (disconnectReapingOn(windows)) {
                    // 1 ms past the grace: staleness is strict (Rule.ts `outlived`).
                    yield* Effect.sleep(windows.disconnectGraceMs + 1).pipe(
                      Effect.andThen(Queue.offer(graceExpired, undefined)),
                      Effect.forkIn(scope)
                    )
                  }
                }
              }
            }
            yield* Metric.update(suspectGauge, suspects.size)
          }),
        instanceMessage: (peer, id) =>
          Effect.gen(function*() {
            if (!connected.has(peer)) return
            if (bindings.get(id)?.has(peer) === true) return
            if (!(yield* held(id))) return
            let peers = bindings.get(id)
            if (peers === undefined) {
              peers = new Set()
              bindings.set(id, peers)
            }
            peers.add(peer)
            let ids = peerInstances.get(peer)
            if (ids === undefined) {
              ids = new Set()
              peerInstances.set(peer, ids)
            }
            ids.add(id)
            if (suspects.delete(id)) {
              yield* Effect.logInfo(`instance ${id} is connected again; no longer suspect`)
              yield* Metric.update(suspectGauge, suspects.size)
            }
          }),
        // The early returns of `instanceMessage` above, read synchronously.
        isBound: (peer, id) => !connected.has(peer) || bindings.get(id)?.has(peer) === true
      }

      return {
        events,
        suspects: () => suspects,
        forget,
        prune: () =>
          Effect.gen(function*() {
            const ids = new Set<bigint>([...bindings.keys(), ...suspects.keys()])
            for (const id of ids) if (!(yield* held(id as InstanceId))) forget(id)
            yield* Metric.update(suspectGauge, suspects.size)
          }),
        stats: () => ({ connectedPeers: connected.size, boundInstances: bindings.size, suspects: suspects.size }),
        graceExpired
      }
    })
  )

  /**
   * For tests: the real tracker over one in-memory target holding the ids in
   * `held` (LivenessTargets.layerTest) and `windows` over an all-off baseline
   * (LivenessSettings.layerTest: grace 0 unless a test sets it).
   */
  static readonly layerTest = (held: Set<bigint>, windows: Partial<Windows> = {}) =>
    this.layer.pipe(Layer.provide(Layer.mergeAll(LivenessTargets.layerTest(held), LivenessSettings.layerTest(windows))))

  /** The tracker as the MQ server's PeerEvents listener. */
  static readonly layerPeerEvents = Layer.effect(
    PeerEvents,
    Effect.gen(function*() {
      const connections = yield* Connections
      return connections.events
    })
  )
}
