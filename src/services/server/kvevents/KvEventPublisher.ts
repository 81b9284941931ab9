/**
 * vLLM's channel for the KV event log (issue 28 item 4; docs/kv-events.md, "The PUB"): a ZeroMQ PUB at
 * `--kv-events-endpoint` publishing vLLM's `KVEventBatch` (schema/VllmKvEvents.ts) and, with
 * `--kv-events-replay-endpoint`, a ROUTER answering a missed sequence number with every buffered batch from it on
 * and vLLM's end marker.
 *
 * - The drain reads the log on the turn after an append (each append wakes it), at most once per
 *   {@link MIN_BATCH_INTERVAL_MS}: up to
 *   {@link BATCH_RECORDS} records a batch, sequence numbers from 0 per server start. Batch 0 is
 *   `[AllBlocksCleared]`, so a vLLM consumer that saw an earlier run of this server drops it.
 * - A slow or dead subscriber never slows the server: the PUB never blocks (libzmq drops a subscriber's messages
 *   past `--kv-events-hwm` batches, default 100,000 as vLLM's `hwm`, silently: libzmq counts nothing per subscriber), the subscriber sees the sequence
 *   gap and replays. The replay buffer keeps the last {@link REPLAY_BATCHES} batches and at most
 *   {@link REPLAY_BYTES} bytes; a replay whose ROUTER pipe fills is cut short and counted (the end marker may be
 *   lost with it: the subscriber's replay times out and it asks again).
 * - Records the drain could not read before the log dropped them are published as `AllBlocksCleared` (the
 *   consumer forgets this server: a router that knows too little misroutes less than one that knows wrong).
 * - With CURVE both sockets are CURVE servers in the ZAP domain `mpcache-kv-events`, which admits admins' keys
 *   only (a PUB cannot filter per subscriber; docs/security.md, "KV events").
 * - Without a PUB the drain still runs: it counts records by kind and medium for `/metrics`.
 * - The replay ROUTER passes the routing-id door of the MQ server (internal/PeerAdmission.ts): a peer that claims
 *   a routing id the ROUTER will generate would make libzmq abort the process.
 */
import { Effect, Layer, Metric, Option, Queue } from "effect"
import type * as zmq from "zeromq"
import { KV_EVENTS_ZAP_DOMAIN, Tenancy } from "../../auth/Tenancy.ts"
import { byLabel, fromStart } from "../../metrics/Series.ts"
import { type BoundRouter, ZmqSockets } from "../../zmq/Sockets.ts"
import { encodeKvEventBatch, END_SEQ, seqFrame, seqOf, type VllmKvEvent } from "../../../schema/VllmKvEvents.ts"
import { makePeerAdmission } from "../internal/PeerAdmission.ts"
import { MqServer } from "../MqServer.ts"
import { ServerConfig } from "../ServerConfig.ts"
import type { KvEventRecord } from "./KvEventLog.ts"
import { makeDrainSchedule } from "./DrainSchedule.ts"
import { KvEvents } from "./KvEvents.ts"

/** Records one batch carries at most. */
export const BATCH_RECORDS = 1024
/**
 * The drain runs at most once per this many milliseconds (the batches' rate is bounded, their latency too): a
 * batch costs about 200 µs whatever it holds (bench:events), about an engine step (vLLM publishes one a step).
 */
export const MIN_BATCH_INTERVAL_MS = 25
/** Batches the replay buffer keeps (vLLM's `buffer_steps` default). */
export const REPLAY_BATCHES = 10_000
/** Bytes of payload the replay buffer keeps at most; the oldest batches go first. */
export const REPLAY_BYTES = 64 * 2 ** 20
/** Messages queued per replay peer; past it the replay is cut short. */
const REPLAY_SEND_HWM = 20_000

const recordsTotal = Metric.counter("mpcache_kv_event_records_total", {
  description: "KV event records by kind (stored, removed) and medium (CPU, STORAGE), as the publisher drained them",
  incremental: true
})
const records = {
  stored: byLabel(Metric.withAttributes(recordsTotal, { kind: "stored" }), "medium", ["CPU", "STORAGE"]),
  removed: byLabel(Metric.withAttributes(recordsTotal, { kind: "removed" }), "medium", ["CPU", "STORAGE"])
}
const batchesTotal = fromStart(Metric.counter("mpcache_kv_event_batches_published_total", {
  description: "KVEventBatch messages the PUB sent (--kv-events-endpoint)",
  incremental: true
}))
const replaysTotal = fromStart(Metric.counter("mpcache_kv_event_replays_total", {
  description: "Replay requests the replay ROUTER answered (--kv-events-replay-endpoint)",
  incremental: true
}))
const subscribersGauge = fromStart(Metric.gauge("mpcache_kv_event_subscribers", {
  description: "Connections to the KV event PUB now"
}))
const droppedTotal = Metric.counter("mpcache_kv_event_publisher_drops_total", {
  description: "What the publisher could not deliver: log_overflow (records gone before the drain read them), replay_cut (a replay whose pipe filled), malformed_replay (requests that were no 8-byte sequence number)",
  incremental: true
})
const dropped = byLabel(droppedTotal, "reason", ["log_overflow", "replay_cut", "malformed_replay"])

/** The publisher's `/api/status` figures (inside `kv_events.publisher`). */
export interface KvEventPublisherStatus {
  readonly endpoint: string
  readonly replay_endpoint: string | null
  readonly topic: string
  readonly subscribers: number
  readonly batches_published: number
  readonly next_seq: number
  readonly replay_buffer: { readonly batches: number; readonly bytes: number; readonly oldest_seq: number | null }
  readonly replays_served: number
  readonly replay_batches_sent: number
  readonly replays_cut: number
  readonly malformed_replays: number
  readonly log_overflows: number
}

const eventOf = (r: KvEventRecord, blockSize: number): VllmKvEvent =>
  r.kind === "stored"
    ? {
      _tag: "BlockStored",
      blockHashes: [r.chunkHash],
      parentBlockHash: r.parentHash,
      tokenIds: r.tokenIds,
      blockSize,
      loraId: null,
      medium: r.medium
    }
    : { _tag: "BlockRemoved", blockHashes: r.chunkHashes, medium: r.medium }

/**
 * The publisher for the server in context: the drain fiber always, the PUB and the replay ROUTER when
 * configured. Built after the MQ server (its ZAP handler must be bound first); its status lands in
 * `kv_events.publisher` through {@link KvEvents}'s `publisherStatus`. Fails (at start) with `ZmqError` when an
 * endpoint cannot be bound.
 */
export const KvEventPublisherLive = Layer.effectDiscard(Effect.gen(function*() {
  const config = yield* ServerConfig
  // A server without the data path (layerTestBare) has no log.
  const found = yield* Effect.serviceOption(KvEvents)
  yield* MqServer
  if (Option.isNone(found) || !found.value.log.enabled) return
  const events = found.value
  const { log } = events
  const sockets = yield* ZmqSockets
  const tenancy = yield* Tenancy
  const curve = tenancy.curve === undefined ? undefined : { secretKey: tenancy.curve.secretKey, zapDomain: KV_EVENTS_ZAP_DOMAIN }
  const topic = Buffer.from(config.kvEventsTopic, "utf8")
  let subscribers = 0
  const pub: zmq.Publisher | undefined = config.kvEventsEndpoint === undefined ? undefined : yield* sockets.bindPublisher(config.kvEventsEndpoint, {
    sendHighWaterMark: config.kvEventsHwm,
    ...(curve === undefined ? {} : { curve }),
    onConnectionEvent: (e) =>
      Effect.suspend(() => {
        subscribers = Math.max(0, subscribers + (e === "accepted" ? 1 : -1))
        return Metric.update(subscribersGauge, subscribers)
      })
  })

  const buffer: Array<{ readonly seq: number; readonly payload: Buffer }> = []
  let bufferBytes = 0
  let nextSeq = 0
  const counts = { published: 0, replays: 0, replayBatches: 0, cut: 0, malformed: 0, overflows: 0 }

  // The drain is plain JavaScript on the event loop, not a fiber (a fiber's wake-up, latch and promise per STORE
  // cost more than the batch's encoding; bench:events), run by DrainSchedule.ts. Metrics are updated with the
  // layer's services; a refused send or a failed drain is told by the warning fiber below.
  const services = yield* Effect.context<never>()
  const warnings = yield* Queue.unbounded<string>()
  yield* Queue.take(warnings).pipe(Effect.flatMap((w) => Effect.logWarning(w)), Effect.forever, Effect.forkScoped)

  // One send in flight at a time (zeromq.js: EBUSY); PUB never blocks: past a subscriber's HWM libzmq drops its copy.
  const outgoing: Array<{ readonly seq: number; readonly payload: Buffer }> = []
  let sending = false
  const pump = (): void => {
    const next = pub === undefined || sending ? undefined : outgoing.shift()
    if (next === undefined) return
    sending = true
    const settled = (error?: unknown) => {
      sending = false
      if (error === undefined) {
        counts.published++
        batchesTotal.updateUnsafe(1, services)
      } else Queue.offerUnsafe(warnings, `KV events: the PUB refused batch ${next.seq}: ${String(error)}`)
      pump()
    }
    try {
      pub!.send([topic, seqFrame(next.seq), next.payload]).then(() => settled(), settled)
    } catch (e) {
      settled(e)
    }
  }

  const publish = (batch: ReadonlyArray<VllmKvEvent>): void => {
    const seq = nextSeq++
    const payload = encodeKvEventBatch(Date.now() / 1000, batch)
    buffer.push({ seq, payload })
    bufferBytes += payload.length
    while (buffer.length > REPLAY_BATCHES || (bufferBytes > REPLAY_BYTES && buffer.length > 1)) bufferBytes -= buffer.shift()!.payload.length
    outgoing.push({ seq, payload })
    pump()
  }

  let cursor = 0
  /** Reads what is new since `cursor` and publishes it, up to BATCH_RECORDS records a batch. */
  const drainNow = (): void => {
    while (cursor < log.newestSeq()) {
      const read = log.read({ cursor, maxEvents: BATCH_RECORDS })
      cursor = read.nextCursor
      const batch: Array<VllmKvEvent> = []
      if (read.lost) {
        counts.overflows++
        dropped.log_overflow.updateUnsafe(1, services)
        batch.push({ _tag: "AllBlocksCleared" })
      }
      // Counted per (kind, medium) here and added once a batch: a metric update per record would cost more than
      // the record's encoding.
      const counted = { stored: { CPU: 0, STORAGE: 0 }, removed: { CPU: 0, STORAGE: 0 } }
      for (const r of read.records) {
        counted[r.kind][r.medium]++
        // Without a PUB the drain only counts: no event is built for nobody.
        if (pub !== undefined) batch.push(eventOf(r, config.chunkSizeTokens))
      }
      for (const kind of ["stored", "removed"] as const) {
        for (const medium of ["CPU", "STORAGE"] as const) {
          if (counted[kind][medium] > 0) records[kind][medium].updateUnsafe(counted[kind][medium], services)
        }
      }
      if (pub !== undefined && batch.length > 0) publish(batch)
    }
  }

  // Woken by each append; run on the next turn, at most once per MIN_BATCH_INTERVAL_MS (DrainSchedule.ts). A
  // drain that throws (a defect) is told and the server goes on (an exception in a timer would end the process);
  // what it read is lost, so subscribers get AllBlocksCleared, as for records the log dropped.
  const drainSafely = () => {
    try {
      drainNow()
    } catch (e) {
      Queue.offerUnsafe(warnings, `KV events: the drain failed (subscribers are sent AllBlocksCleared): ${String(e)}`)
      try {
        if (pub !== undefined) publish([{ _tag: "AllBlocksCleared" }])
      } catch {
        // Nothing more to do: the next drain publishes what follows.
      }
    }
  }
  const schedule = makeDrainSchedule(drainSafely, MIN_BATCH_INTERVAL_MS)
  yield* Effect.acquireRelease(
    Effect.sync(() => {
      if (pub !== undefined) publish([{ _tag: "AllBlocksCleared" }])
      events.wake.current = schedule.wake
      drainNow()
    }),
    () =>
      Effect.sync(() => {
        events.wake.current = () => {}
        schedule.cancel()
      })
  )

  let replayEndpoint: string | null = null
  if (pub !== undefined && config.kvEventsReplayEndpoint !== undefined) {
    replayEndpoint = config.kvEventsReplayEndpoint
    const bound: BoundRouter = yield* sockets.bindRouter(config.kvEventsReplayEndpoint, {
      sendHighWaterMark: REPLAY_SEND_HWM,
      lingerMs: 0,
      ...(curve === undefined ? {} : { curve })
    })
    const router = bound.socket
    const connected = new Set<string>()
    /** One request `[id, "", seq]` (REQ) or `[id, seq]` (DEALER): every buffered batch from seq on, then the end. */
    const serve = (received: Array<Buffer>): Effect.Effect<void> =>
      Effect.gen(function*() {
        const [id, ...frames] = received
        if (id === undefined) return
        const peer = id.toString("hex")
        // ROUTER_NOTIFY: a lone empty frame on connect and on disconnect.
        if (frames.length === 1 && frames[0]!.length === 0) {
          if (connected.delete(peer)) admission.forget(id, peer)
          else connected.add(peer)
          return
        }
        const seqBytes = frames.length === 2 && frames[0]!.length === 0 ? frames[1] : frames.length === 1 ? frames[0] : undefined
        const start = seqBytes === undefined ? undefined : seqOf(seqBytes)
        if (start === undefined || start < 0) {
          counts.malformed++
          yield* Metric.update(dropped.malformed_replay, 1)
          return yield* Effect.logDebug("KV events: ignored a replay request that was no 8-byte big-endian sequence number").pipe(
            Effect.annotateLogs({ peer })
          )
        }
        counts.replays++
        yield* Metric.update(replaysTotal, 1)
        const empty = Buffer.alloc(0)
        for (const b of buffer.slice()) {
          if (b.seq < start) continue
          const sent = yield* Effect.exit(Effect.tryPromise(() => router.send([id, empty, seqFrame(b.seq), b.payload])))
          if (sent._tag === "Failure") {
            counts.cut++
            return yield* Metric.update(dropped.replay_cut, 1)
          }
          counts.replayBatches++
        }
        yield* Effect.exit(Effect.tryPromise(() => router.send([id, empty, END_SEQ, empty])))
      })
    const admission = yield* makePeerAdmission(bound, serve, () => Effect.void)
    yield* Effect.tryPromise(() => router.receive()).pipe(
      Effect.flatMap((received) => admission.admit(received, received[0]?.toString("hex") ?? "").pipe(
        Effect.flatMap((go) => go ? serve(received) : Effect.void)
      )),
      Effect.forever,
      Effect.ignore,
      Effect.forkScoped
    )
  }

  events.publisherStatus.current = () =>
    pub === undefined ? null : {
      endpoint: config.kvEventsEndpoint!,
      replay_endpoint: replayEndpoint,
      topic: config.kvEventsTopic,
      subscribers,
      batches_published: counts.published,
      next_seq: nextSeq,
      replay_buffer: { batches: buffer.length, bytes: bufferBytes, oldest_seq: buffer[0]?.seq ?? null },
      replays_served: counts.replays,
      replay_batches_sent: counts.replayBatches,
      replays_cut: counts.cut,
      malformed_replays: counts.malformed,
      log_overflows: counts.overflows
    }
  yield* Effect.addFinalizer(() => Effect.sync(() => (events.publisherStatus.current = () => null)))
}))
