/**
 * The L2 tier (issue 15 items 4–7, DESIGN §9): what L1, LOOKUP and the
 * transfers ask of L2, behind the circuit breaker.
 *
 * - Write path: `writeThrough` after a STORE commits an object to L1. It
 *   never waits: the object is read-locked, its value (header + bytes, the
 *   header in the object's L1 headroom, so no copy is made) sent
 *   with `SET … NX [EX ttl]` from a fiber of the tier's scope, and the lock
 *   released when that write ends. A write of a key already in flight is
 *   joined (nothing more is sent); past `--l2-max-inflight-bytes` new writes
 *   are dropped and counted; with the breaker open they are skipped.
 * - Read path: `existsPrefix` (LOOKUP's EXISTS step under
 *   `--l2-lookup-timeout-ms`) and `fetch` (a GET into a fresh L1 object,
 *   read-locked like an L1 hit). A value whose header or checksum does not
 *   match is a miss: the key is deleted and counted. With `--l2-secret-file`
 *   values are authenticated (L2Mac.ts, issue 24 item 14): one without a
 *   valid MAC is never served — a miss, deleted and counted apart
 *   (`unauthenticated_values`). Without it the layer warns at start.
 * - Failure is a miss, never a hang: every command has a timeout, a failure
 *   feeds the breaker, and an open breaker answers "nothing in L2" at once.
 *
 * `layerOff` is the tier when `--l2-url` is not given: no L2, no cost.
 */
import { Context, Duration, Effect, Layer, Metric, Option, Scope } from "effect"
import { ServerConfig } from "../ServerConfig.ts"
import { L1Store } from "../L1Store.ts"
import * as L1Handles from "../internal/L1Handles.ts"
import type { ReadLock } from "../internal/L1Handles.ts"
import type { KvLayout } from "../LayoutRegistry.ts"
import { KvEvents } from "../kvevents/KvEvents.ts"
import type { ChunkOrigin } from "../kvevents/L1EventSink.ts"
import type { L2EventSink } from "../kvevents/L2EventSink.ts"
import type { ObjectKey } from "../ObjectKey.ts"
import type { ServerModule } from "../Handler.ts"
import type { L2Config } from "./L2Config.ts"
import { type L2Breaker, makeBreaker } from "./L2Breaker.ts"
import { makeHmacSha256Unsafe } from "../../../native/Hmac.ts"
import { type L2SecretInvalid, readL2Secret } from "./L2Mac.ts"
import { type L2Error, L2Store } from "./L2Store.ts"
import { authenticated, checksummed, isUnauthenticated, l2KeyOf, layoutFingerprint, type ValueFormat } from "./L2Value.ts"
import {
  l2BytesInTotal,
  l2BytesOutTotal,
  l2CommandSeconds,
  l2CorruptTotal,
  l2DroppedWritesTotal,
  l2FailedWritesTotal,
  l2HitsTotal,
  l2InflightBytes,
  l2MissesTotal,
  l2UnauthenticatedTotal
} from "./L2Metrics.ts"

/** The `l2` block of `/api/status` (null when L2 is off). */
export interface L2Status {
  /** `--l2-url` without its password. */
  readonly url: string
  readonly state: "ok" | "open" | "probing"
  /** Whether the client is connected now (the state is `probing` until the first PING, so an unreachable store at start reads `open`). */
  readonly connected: boolean
  readonly inflight_bytes: number
  /** Writes in flight (each holds one L1 read lock). */
  readonly queue_depth: number
  readonly last_error: string | null
  readonly writes: number
  readonly dropped_writes: number
  readonly failed_writes: number
  readonly hit_chunks: number
  readonly corrupt_values: number
  /** Whether values are authenticated with HMAC-SHA256 (`--l2-secret-file`, issue 24 item 14). */
  readonly authenticated: boolean
  /** Values refused for want of a valid MAC (no MAC, or one that does not verify), deleted. */
  readonly unauthenticated_values: number
  readonly breaker_opened: number
  readonly breaker_closed: number
}

/** The L2 tier as L1, LOOKUP and the transfers use it. */
export interface L2TierShape {
  /** Whether an L2 is configured. */
  readonly enabled: boolean
  /**
   * Queues the committed L1 object `key` (of `layout`) for L2 and returns at
   * once (issue 15 item 4). No-op when L2 is off, the breaker open, the key
   * already in flight, the object gone, or the in-flight bytes full (counted).
   * When the write ends with the value in L2, the KV event log hears of it
   * (`STORAGE`, with `origin`'s tokens and parent; kvevents/L2EventSink.ts).
   */
  readonly writeThrough: (key: ObjectKey, layout: KvLayout, origin?: ChunkOrigin) => Effect.Effect<void>
  /**
   * How many leading chunks exist in L2 for every rank: `chunks[i]` lists
   * chunk i's object keys (one per rank). One pipelined EXISTS per key
   * under `--l2-lookup-timeout-ms`; 0 on a timeout, a failure or an open breaker.
   */
  readonly existsPrefix: (chunks: ReadonlyArray<ReadonlyArray<ObjectKey>>, layout: KvLayout) => Effect.Effect<number>
  /**
   * `key` as a read-locked L1 object, the lock held by the current Scope
   * (L1Handles): the L1 one when it is already there, else GET from L2 into
   * a fresh L1 object (reserved in a scope of its own, filled, committed,
   * then locked: a fetch interrupted or dead at any step leaves nothing
   * reserved). Undefined (nothing held) when absent, corrupt or (with a
   * secret) without a valid MAC (deleted, counted), failed, past
   * `--l2-transfer-timeout-ms`, or L1 has no room. `inTurn`, when given, is
   * awaited between the GET and the L1 reservation: a caller fetching a
   * prompt's chunks side by side commits (and so announces, docs/kv-events.md)
   * them in prompt order, a parent before its child.
   */
  readonly fetch: (
    key: ObjectKey,
    layout: KvLayout,
    origin?: ChunkOrigin,
    inTurn?: Effect.Effect<void>
  ) => Effect.Effect<ReadLock | undefined, never, Scope.Scope>
  readonly status: () => L2Status | null
}

const off: L2TierShape = {
  enabled: false,
  writeThrough: () => Effect.void,
  existsPrefix: () => Effect.succeed(0),
  fetch: () => Effect.succeed(undefined),
  status: () => null
}

/**
 * The L2 tier service. A Reference whose default is "no L2" (`--l2-url` not
 * given), so modules and tests that never configure L2 need not provide it;
 * `layerL2Tier` replaces it when L2 is on.
 */
export const L2Tier = Context.Reference<L2TierShape>("mpcache/services/server/l2/L2Tier", { defaultValue: () => off })

/**
 * The tier over L2Store for `config.l2` (off when absent); its writes and prober live in the layer's
 * scope. With `--l2-secret-file` it reads the secret first and fails with L2SecretInvalid when it
 * cannot be used (`mpcache serve` exits 2); without it, it logs a WARNING that anyone who can write
 * to the store can feed these engines (issue 24 item 14).
 */
export const layerL2Tier: Layer.Layer<never, L2SecretInvalid, ServerConfig | L1Store | L2Store> = Layer.effect(
  L2Tier,
  Effect.gen(function*() {
    const config = yield* ServerConfig
    if (config.l2 === undefined) return off
    const format = yield* valueFormatOf(config.l2)
    const l1 = yield* L1Store
    const store = yield* L2Store
    const events = Option.getOrUndefined(yield* Effect.serviceOption(KvEvents))?.l2
    return yield* makeTier(config.l2, config.chunkSizeTokens, format, l1, store, events)
  })
)

/**
 * The value format of `l2`: authenticated under `--l2-secret-file`'s key, else checksummed (and a WARNING).
 * The INFO line of an authenticated one says where its MACs run: on the libuv pool, or on the JS thread with
 * node:crypto and why (src/native/Hmac.ts).
 */
const valueFormatOf = (l2: L2Config): Effect.Effect<ValueFormat, L2SecretInvalid> => {
  const secretFile = l2.secretFile
  if (secretFile === undefined) {
    return Effect.logWarning(
      `L2 values are not authenticated: anyone who can write to ${l2.url.display} can serve KV to these engines; set --l2-secret-file`
    ).pipe(Effect.as(checksummed))
  }
  return Effect.gen(function*() {
    const key = yield* readL2Secret(secretFile)
    const hmac = makeHmacSha256Unsafe()
    yield* Effect.logInfo(`L2 values are authenticated with HMAC-SHA256 under the secret in ${secretFile}, ${hmac.description}`)
    return authenticated(key, hmac)
  })
}

/** The `l2` block of `/api/status` as a module record without ops (null when L2 is off). */
export const l2Module: Effect.Effect<ServerModule> = Effect.gen(function*() {
  const tier = yield* L2Tier
  return { name: "l2", rows: [], status: () => Effect.sync(() => ({ l2: tier.status() })) }
})

/** Runs `effect` and records its latency under `op` (seconds). */
const timed = <A, E>(op: string, effect: Effect.Effect<A, E>): Effect.Effect<A, E> =>
  Effect.timed(effect).pipe(
    Effect.tap(([d]) => Metric.update(Metric.withAttributes(l2CommandSeconds, { op }), Duration.toMillis(d) / 1000)),
    Effect.map(([, a]) => a)
  )

const makeTier = (
  l2: L2Config,
  chunkSizeTokens: number,
  format: ValueFormat,
  l1: L1Store["Service"],
  store: L2Store["Service"],
  events: L2EventSink | undefined
) =>
  Effect.gen(function*() {
    const scope = yield* Effect.scope
    const breaker: L2Breaker = yield* makeBreaker(l2, store.ping(l2.transferTimeoutMs))
    // Weak: LMCache-driven STOREs make a layout object per request; a registered layout lives as long as its registrations.
    const fingerprints = new WeakMap<KvLayout, string>()
    const fingerprintOf = (layout: KvLayout) => {
      let fp = fingerprints.get(layout)
      if (fp === undefined) {
        fp = layoutFingerprint(layout, chunkSizeTokens)
        fingerprints.set(layout, fp)
      }
      return fp
    }
    const keyOf = (key: ObjectKey, layout: KvLayout) => l2KeyOf(l2.keyPrefix, fingerprintOf(layout), key)
    const inflight = new Map<string, number>() // L2 key → value bytes
    let inflightBytes = 0
    const totals = { writes: 0, droppedWrites: 0, failedWrites: 0, hitChunks: 0, corruptValues: 0, unauthenticatedValues: 0 }
    const failed = (e: L2Error) => breaker.onFailure(e)
    const dropped = (reason: string) => {
      totals.droppedWrites++
      return Metric.update(Metric.withAttributes(l2DroppedWritesTotal, { reason }), 1)
    }

    // Uninterruptible from the lock to the fork (started at once, so its `ensuring` is in place): a STORE
    // interrupted meanwhile never leaves the lock behind (issue 25 item 2).
    const writeThrough = (key: ObjectKey, layout: KvLayout, origin?: ChunkOrigin) =>
      Effect.uninterruptible(Effect.suspend(() => {
        if (!breaker.isClosed()) return dropped("open")
        const k = keyOf(key, layout)
        if (inflight.has(k)) return Effect.void // joined: the same bytes are on their way
        const valueBytes = format.headerBytes + layout.chunkBytes
        if (inflightBytes + valueBytes > l2.maxInflightBytes) return dropped("inflight")
        const handle = l1.lockRead(key)
        if (handle === undefined) return Effect.void
        inflight.set(k, valueBytes)
        inflightBytes += valueBytes
        // The header goes into the object's headroom and the value is a view of L1, sent without a copy;
        // the read lock keeps the bytes until the write ends (even a CLEAR force leaves a locked extent
        // alone until then), so the checksum can wait for the write's own fiber: each of a STORE's
        // objects starts its SET as soon as its own checksum is done. An L1 without headroom (unit
        // tests) gets a copy. With a secret the MAC takes the checksum's place: still one pass over the
        // bytes, on the libuv pool (src/native/Hmac.ts) while this fiber waits, the lock held until it
        // ends (the hash is uninterruptible, and the lock is released only in the `ensuring` below).
        const fp = fingerprintOf(layout)
        // The fiber yields first, so its checksum runs after the STORE's step, not inside it.
        const write = Effect.yieldNow.pipe(
          Effect.andThen(format.seal(k, fp, handle.extent, handle.bytes)),
          Effect.flatMap((value) =>
            timed("SET", store.setNx(k, value, l2.ttlSeconds, l2.transferTimeoutMs)).pipe(
              Effect.tap(() => Metric.update(l2BytesOutTotal, value.length))
            )
          ),
          // Written, or the key was there already: L2 holds the chunk either way.
          Effect.tap(() =>
            Effect.sync(() => {
              totals.writes++
              events?.written(key, handle.saltGroup, origin)
            })
          ),
          Effect.catch((e: L2Error) => {
            totals.failedWrites++
            return Metric.update(l2FailedWritesTotal, 1).pipe(Effect.andThen(failed(e)))
          }),
          Effect.ensuring(Effect.suspend(() => {
            l1.unlockRead(handle)
            inflight.delete(k)
            inflightBytes -= valueBytes
            return Metric.update(l2InflightBytes, inflightBytes)
          }))
        )
        return Metric.update(l2InflightBytes, inflightBytes).pipe(
          Effect.andThen(Effect.forkIn(write, scope, { startImmediately: true })),
          Effect.asVoid
        )
      }))

    const existsPrefix = (chunks: ReadonlyArray<ReadonlyArray<ObjectKey>>, layout: KvLayout) =>
      Effect.gen(function*() {
        if (chunks.length === 0 || !breaker.isClosed()) return 0
        const ranks = chunks[0]!.length
        const keys = chunks.flatMap((perRank) => perRank.map((k) => keyOf(k, layout)))
        const found = yield* timed("EXISTS", store.exists(keys, l2.lookupTimeoutMs)).pipe(
          Effect.catch((e: L2Error) => failed(e).pipe(Effect.as(undefined)))
        )
        if (found === undefined) return 0
        let n = 0
        while (n < chunks.length && found.slice(n * ranks, (n + 1) * ranks).every((x) => x)) n++
        totals.hitChunks += n * ranks
        yield* Metric.update(l2HitsTotal, n * ranks)
        yield* Metric.update(l2MissesTotal, n < chunks.length ? ranks : 0)
        return n
      })

    const fetch = (key: ObjectKey, layout: KvLayout, origin?: ChunkOrigin, inTurn: Effect.Effect<void> = Effect.void) =>
      Effect.gen(function*() {
        const cached = yield* L1Handles.readLock(l1, key)
        if (cached !== undefined) return cached
        if (!breaker.isClosed()) return undefined
        const k = keyOf(key, layout)
        const value = yield* timed("GET", store.get(k, l2.transferTimeoutMs)).pipe(
          Effect.catch((e: L2Error) => failed(e).pipe(Effect.as(undefined)))
        )
        if (value === undefined) return undefined // absent (evicted, expired) or failed: a miss
        yield* Metric.update(l2BytesInTotal, value.length)
        // With a secret the MAC is checked on the libuv pool; `value` (the GET reply, nobody else's) is held until then.
        const decoded = yield* format.check(k, value, fingerprintOf(layout), layout.chunkBytes)
        if ("refused" in decoded) {
          const reason = decoded.refused
          if (isUnauthenticated(reason)) {
            totals.unauthenticatedValues++
            yield* Metric.update(Metric.withAttributes(l2UnauthenticatedTotal, { reason }), 1)
            yield* Effect.logWarning(
              `L2 value ${k} is not authenticated (${reason === "no_mac" ? "no MAC" : "its MAC does not verify under --l2-secret-file"}); deleted, treated as a miss`
            )
          } else {
            totals.corruptValues++
            yield* Metric.update(Metric.withAttributes(l2CorruptTotal, { reason }), 1)
            yield* Effect.logWarning(`L2 value ${k} is corrupt (${reason}); deleted, treated as a miss`)
          }
          yield* store.del(k, l2.transferTimeoutMs).pipe(Effect.catch(failed))
          // Refused whether or not the DEL got through: no LOOKUP is served this chunk from L2.
          events?.deleted(key, l1.saltGroupOf(key.cacheSalt))
          return undefined
        }
        yield* inTurn
        // The reservation lives in a scope of its own: aborted unless committed, whatever ends the fill.
        const placed = yield* Effect.scoped(Effect.gen(function*() {
          const r = yield* L1Handles.reserve(l1, key, layout.chunkBytes, origin)
          if (r._tag === "Full") return false
          if (r._tag === "Reserved") {
            yield* l1.fill(r.hold.reservation, decoded.payload)
            yield* L1Handles.commit(l1, r.hold)
          }
          return true
        }))
        return placed ? yield* L1Handles.readLock(l1, key) : undefined
      })

    const status = (): L2Status => {
      const t = breaker.transitions()
      const down = store.connectionError()
      return {
        url: l2.url.display,
        state: breaker.state(),
        connected: down === null,
        inflight_bytes: inflightBytes,
        queue_depth: inflight.size,
        last_error: breaker.lastError() ?? down,
        writes: totals.writes,
        dropped_writes: totals.droppedWrites,
        failed_writes: totals.failedWrites,
        hit_chunks: totals.hitChunks,
        corrupt_values: totals.corruptValues,
        authenticated: format.authenticated,
        unauthenticated_values: totals.unauthenticatedValues,
        breaker_opened: t.opened,
        breaker_closed: t.closed
      }
    }
    return { enabled: true, writeThrough, existsPrefix, fetch, status } satisfies L2TierShape
  }) satisfies Effect.Effect<L2TierShape, never, Scope.Scope>
