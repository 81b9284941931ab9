/**
 * The server's KV event log as a service (issue 28; DESIGN §10,
 * docs/kv-events.md): one log per server, sized by `--kv-event-log-size`
 * (0: off), its incarnation a random safe integer drawn at start; L1
 * appends through {@link KvEvents.l1} (L1EventSink.ts), the channels read
 * it. `kvEventsModule` is its server module: POLL_KV_EVENTS (op 34, on the
 * SYNC lane) and the `kv_events` block of `/api/status`.
 */
import { randomInt } from "node:crypto"
import { Context, Effect, Layer, Metric } from "effect"
import { KvEventPollResult, PollKvEvents } from "../../../schema/Op.ts"
import { RequestSaltGroup } from "../../liveness/InstanceOwner.ts"
import { row, type ServerModule } from "../Handler.ts"
import { ServerConfig } from "../ServerConfig.ts"
import { type KvEventLog, type KvEventPoll, type KvEventRecord, makeKvEventLog } from "./KvEventLog.ts"
import type { KvEventPublisherStatus } from "./KvEventPublisher.ts"
import { type L1EventSink, makeL1EventSink } from "./L1EventSink.ts"
import { type L2EventSink, makeL2EventSink } from "./L2EventSink.ts"

/** The log and the tiers' sides of it (undefined with events off: L1 then counts nothing). */
export class KvEvents extends Context.Service<KvEvents, {
  readonly log: KvEventLog
  readonly l1: L1EventSink | undefined
  readonly l2: L2EventSink | undefined
  /** Called by every append: the publisher's drain sets it (KvEventPublisher.ts); a no-op without one. */
  readonly wake: { current: () => void }
  /**
   * The publisher's status for `kv_events.publisher` (null: no PUB). A slot, not a service: the publisher binds
   * after the MQ server (its ZAP handler first), long after this module's status is assembled.
   */
  readonly publisherStatus: { current: () => KvEventPublisherStatus | null }
}>()("mpcache/services/server/KvEvents") {
  /**
   * A log of `capacity` records (0: off) with incarnation `incarnation` (default: drawn now), a stored record's
   * tokens in a ring slot of `chunkSizeTokens` (the server's chunk size; default the log's, 256).
   */
  static readonly make = (capacity: number, incarnation: number = randomInt(1, 2 ** 47), chunkSizeTokens?: number) => {
    const wake = { current: () => {} }
    const log = makeKvEventLog({ capacity, incarnation, ...(chunkSizeTokens === undefined ? {} : { tokensPerRecord: chunkSizeTokens }), onAppend: () => wake.current() })
    return {
      log,
      l1: log.enabled ? makeL1EventSink(log) : undefined,
      l2: log.enabled ? makeL2EventSink(log) : undefined,
      wake,
      publisherStatus: { current: () => null }
    }
  }
  /** The server's: `--kv-event-log-size` records. */
  static readonly layer = Layer.effect(
    this,
    Effect.gen(function*() {
      const config = yield* ServerConfig
      return KvEvents.make(config.kvEventLogSize, undefined, config.chunkSizeTokens)
    })
  )
  /** For tests: `capacity` records, a fixed incarnation. */
  static readonly layerTest = (capacity = 1024, incarnation = 7) => Layer.succeed(this, KvEvents.make(capacity, incarnation))
}

type PollWire = typeof KvEventPollResult.Type

/** A record as the wire carries it (upstream's `KVEventRecord`, plus `salt_group`). */
const recordWire = (r: KvEventRecord): PollWire["events"][number] =>
  r.kind === "stored"
    ? {
      seq: r.seq,
      kind: "stored",
      medium: r.medium,
      model_name: r.model,
      block_hashes: [r.chunkHash],
      parent_block_hash: r.parentHash,
      token_ids: Array.from(r.tokenIds),
      salt_group: r.saltGroup
    }
    : {
      seq: r.seq,
      kind: "removed",
      medium: r.medium,
      model_name: r.model,
      block_hashes: [...r.chunkHashes],
      parent_block_hash: null,
      token_ids: [],
      salt_group: r.saltGroup
    }

/** A poll's answer on the wire. */
export const pollWire = (p: KvEventPoll): PollWire => ({
  enabled: p.enabled,
  incarnation: p.incarnation,
  next_cursor: p.nextCursor,
  lost: p.lost,
  events: p.records.map(recordWire)
})

const lostAnswers = Metric.counter("mpcache_kv_event_lost_answers_total", {
  description: "POLL_KV_EVENTS answers that told the consumer to resync (lost)",
  incremental: true
})

/**
 * The KV events module: POLL_KV_EVENTS reads the log for the request's salt group (RequestSaltGroup: a
 * tenant's own, every group's for an admin or without tenancy), and `/api/status` gets `kv_events`.
 */
export const kvEventsModule: Effect.Effect<ServerModule, never, KvEvents> = Effect.gen(function*() {
  const { log, l1, publisherStatus } = yield* KvEvents
  // POLL answers that said `lost` (the publisher's own reads of the log are not answers: it counts its overflows).
  let lost = 0
  const poll = ([model, cursor, maxEvents]: readonly [string, number, number]) =>
    Effect.gen(function*() {
      const saltGroup = yield* RequestSaltGroup
      const answer = log.read({ cursor, maxEvents, model, saltGroup })
      // Copied out before anything yields: a record's token ids are a view of the log's ring (KvEventLog.ts).
      const wire = pollWire(answer)
      if (answer.lost) {
        lost++
        yield* Metric.update(lostAnswers, 1)
      }
      return wire
    })
  return {
    name: "kv_events",
    rows: [row(PollKvEvents, "SYNC", poll)],
    status: () =>
      Effect.sync(() => {
        const s = log.stats()
        return {
          kv_events: {
            enabled: s.enabled,
            capacity: s.capacity,
            incarnation: s.incarnation,
            depth: s.depth,
            oldest_seq: s.oldestSeq,
            newest_seq: s.newestSeq,
            records: s.appended,
            dropped: s.dropped,
            lost_answers: lost,
            held_chunks: l1?.heldChunks() ?? 0,
            publisher: publisherStatus.current()
          }
        }
      })
  }
})
