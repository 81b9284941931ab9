/**
 * A router's view of one server's cache, as Effect `Stream`s of index updates (issue 28 item 5;
 * docs/kv-events.md): over POLL_KV_EVENTS ({@link pollKvIndexUpdates}) or over vLLM's PUB and its replay ROUTER
 * ({@link subscribeKvIndexUpdates}). Both resync the same way: a `Reset` update — withdraw everything announced
 * for this server — whenever what follows cannot be applied on top of what came before (a new incarnation, a
 * `lost` answer, sequence numbers going back, `AllBlocksCleared`), then the records from there on.
 * {@link makeKvIndex} applies updates to a set of chunk hashes.
 */
import { Data, Effect, Queue, Stream } from "effect"
import * as zmq from "zeromq"
import { PollKvEvents } from "../../schema/Op.ts"
import { decodeKvEventBatch, type ExternalBlockHash, KvEventBatchInvalid, seqFrame, seqOf } from "../../schema/VllmKvEvents.ts"
import type { MqClientShape, RequestError } from "./MqClient.ts"
import type { DealerCurve } from "../zmq/Sockets.ts"

/** One change of a server's chunk set, in the order the server made them. */
export type KvIndexUpdate =
  | { readonly _tag: "Reset" }
  | {
    readonly _tag: "Stored"
    readonly hashes: ReadonlyArray<ExternalBlockHash>
    readonly parentHash: ExternalBlockHash | null
    readonly tokenIds: ReadonlyArray<number>
    readonly medium: string
  }
  | { readonly _tag: "Removed"; readonly hashes: ReadonlyArray<ExternalBlockHash>; readonly medium: string }

/** A chunk set kept by applying updates: the hashes (hex, or decimal for vLLM's int hashes) held per medium. */
export interface KvIndex {
  readonly apply: (update: KvIndexUpdate) => void
  /** The hashes held in `medium` (default CPU), sorted. */
  readonly hashes: (medium?: string) => ReadonlyArray<string>
  /** Whether `hash` (in the form `hashes` lists: hex, or decimal for an int hash) is held in `medium` (default CPU). */
  readonly has: (hash: string, medium?: string) => boolean
  /** How many hashes are held in `medium` (default CPU). */
  readonly size: (medium?: string) => number
}

const keyOf = (h: ExternalBlockHash): string => (h instanceof Uint8Array ? Buffer.from(h).toString("hex") : String(h))

/** An empty index. */
export const makeKvIndex = (): KvIndex => {
  const held = new Map<string, Set<string>>()
  const of = (medium: string) => {
    let s = held.get(medium)
    if (s === undefined) held.set(medium, s = new Set())
    return s
  }
  return {
    apply: (u) => {
      if (u._tag === "Reset") held.clear()
      else if (u._tag === "Stored") for (const h of u.hashes) of(u.medium).add(keyOf(h))
      else for (const h of u.hashes) of(u.medium).delete(keyOf(h))
    },
    hashes: (medium = "CPU") => [...(held.get(medium) ?? [])].sort(),
    has: (hash, medium = "CPU") => held.get(medium)?.has(hash) === true,
    size: (medium = "CPU") => held.get(medium)?.size ?? 0
  }
}

/**
 * Polls `model`'s records with POLL_KV_EVENTS through `client`: from cursor 0, again at once while a poll came back
 * full, else after `intervalMs` (default 100 ms). A `lost` answer or a new incarnation yields `Reset` first (a new
 * incarnation's records are then read from cursor 0). Fails as the client's request fails (RequestError).
 */
export const pollKvIndexUpdates = (
  client: MqClientShape,
  options: { readonly model: string; readonly intervalMs?: number; readonly maxEvents?: number }
): Stream.Stream<KvIndexUpdate, RequestError> =>
  Stream.suspend(() => {
    const max = options.maxEvents ?? 1024
    let cursor = 0
    let incarnation: number | undefined
    const once = Effect.gen(function*() {
      const r = yield* client.request(PollKvEvents, [options.model, cursor, max])
      const out: Array<KvIndexUpdate> = []
      if (incarnation !== undefined && r.incarnation !== incarnation) {
        // Another run of the server: our cursor means nothing there; start over from its beginning.
        incarnation = r.incarnation
        cursor = 0
        return [{ _tag: "Reset" } as const]
      }
      incarnation = r.incarnation
      if (r.lost) out.push({ _tag: "Reset" })
      cursor = r.next_cursor
      for (const e of r.events) {
        out.push(
          e.kind === "stored"
            ? { _tag: "Stored", hashes: e.block_hashes, parentHash: e.parent_block_hash, tokenIds: e.token_ids, medium: e.medium }
            : { _tag: "Removed", hashes: e.block_hashes, medium: e.medium }
        )
      }
      if (r.events.length < max) yield* Effect.sleep(options.intervalMs ?? 100)
      return out
    })
    return Stream.fromIterableEffectRepeat(once)
  })

/** The PUB stream could not be read: a payload that is no KVEventBatch, or a replay the server did not answer. */
export class KvEventStreamError extends Data.TaggedError("KvEventStreamError")<{ readonly reason: string }> {
  override get message() {
    return `KV event stream: ${this.reason}`
  }
}

/** Where a server publishes (its `--kv-events-endpoint`, `--kv-events-replay-endpoint`, `--kv-events-topic`). */
export interface KvEventSubscription {
  readonly endpoint: string
  readonly replayEndpoint: string
  /** Default "kv-events". */
  readonly topic?: string
  /** With CURVE on the server (admins only): the server's public key and an admin's key pair. */
  readonly curve?: DealerCurve
  /** How long a replay may take before the stream fails; default 10,000 ms. */
  readonly replayTimeoutMs?: number
}

/**
 * Subscribes to a server's PUB (vLLM's `KVEventBatch`): first a replay from 0 (a late joiner learns what is still
 * buffered), then the live stream; a sequence gap is filled by a replay, numbers going back (a restart) or
 * `AllBlocksCleared` yield `Reset`. The sockets live as long as the stream runs. Fails with KvEventStreamError.
 */
export const subscribeKvIndexUpdates = (s: KvEventSubscription): Stream.Stream<KvIndexUpdate, KvEventStreamError> =>
  Stream.callback<KvIndexUpdate, KvEventStreamError>((queue) =>
    Effect.gen(function*() {
      const keys = s.curve === undefined ? {} : { curveServerKey: s.curve.serverPublicKey, curveSecretKey: s.curve.secretKey, curvePublicKey: s.curve.publicKey }
      const sub = yield* Effect.acquireRelease(Effect.sync(() => new zmq.Subscriber({ linger: 0, ...keys })), (x) => Effect.sync(() => x.close()))
      const replay = yield* Effect.acquireRelease(Effect.sync(() => new zmq.Dealer({ linger: 0, ...keys })), (x) => Effect.sync(() => x.close()))
      sub.connect(s.endpoint)
      sub.subscribe(s.topic ?? "kv-events")
      replay.connect(s.replayEndpoint)
      replay.receiveTimeout = s.replayTimeoutMs ?? 10_000
      // The last batch applied, and the last sequence number the SUB itself delivered.
      let last = -1
      let lastLive = -1

      const apply = (seq: number, payload: Uint8Array): Effect.Effect<void, KvEventStreamError> =>
        Effect.gen(function*() {
          if (seq <= last) return
          last = seq
          const batch = decodeKvEventBatch(payload)
          if (batch instanceof KvEventBatchInvalid) return yield* new KvEventStreamError({ reason: `batch ${seq}: ${batch.reason}` })
          for (const e of batch.events) {
            yield* Queue.offer(
              queue,
              e._tag === "AllBlocksCleared"
                ? { _tag: "Reset" }
                : e._tag === "BlockStored"
                ? { _tag: "Stored", hashes: e.blockHashes, parentHash: e.parentBlockHash, tokenIds: Array.from(e.tokenIds), medium: e.medium ?? "GPU" }
                : { _tag: "Removed", hashes: e.blockHashes, medium: e.medium ?? "GPU" }
            )
          }
        })

      const catchUp = (from: number) =>
        Effect.gen(function*() {
          yield* Effect.promise(() => replay.send([Buffer.alloc(0), seqFrame(from)]))
          for (;;) {
            const frames = yield* Effect.tryPromise({
              try: () => replay.receive(),
              catch: () => new KvEventStreamError({ reason: `the replay ROUTER at ${s.replayEndpoint} did not answer within ${s.replayTimeoutMs ?? 10_000} ms` })
            })
            const [seqBytes, payload] = frames.slice(-2)
            if (seqBytes === undefined || payload === undefined) return yield* new KvEventStreamError({ reason: "a replay message without its sequence number and payload" })
            const seq = seqOf(seqBytes)
            if (seq === undefined) return yield* new KvEventStreamError({ reason: "a replay sequence number that is not 8 bytes" })
            // END_SEQ: -1 as 8 signed bytes.
            if (seq === -1) return
            yield* apply(seq, payload)
          }
        })

      const run = Effect.gen(function*() {
        yield* catchUp(0)
        for (;;) {
          const [, seqBytes, payload] = yield* Effect.promise(() => sub.receive())
          const seq = seqBytes === undefined ? undefined : seqOf(seqBytes)
          if (seq === undefined || payload === undefined) return yield* new KvEventStreamError({ reason: "a message that is not [topic, 8-byte seq, payload]" })
          if (lastLive >= 0 && seq <= lastLive) {
            // The live numbers went back: the server restarted. Its batch 0 (AllBlocksCleared) is in the replay.
            yield* Queue.offer(queue, { _tag: "Reset" })
            last = -1
            lastLive = seq
            yield* catchUp(0)
            continue
          }
          lastLive = seq
          // At or below `last`: a batch the replay already brought (apply skips it).
          if (seq > last + 1) yield* catchUp(last + 1)
          yield* apply(seq, payload)
        }
      })
      yield* Effect.forkScoped(run.pipe(Effect.catch((e) => Queue.fail(queue, e))))
    })
  )
