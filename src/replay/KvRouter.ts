/**
 * The replay's KV-aware router (issue 28 item 6): fed only by each server's KV event stream (its PUB and replay
 * ROUTER, through mpcache/client's `subscribeKvIndexUpdates`), it keeps per server the set of chunk hashes that
 * server holds in L1 (`CPU`) and sends each request to the server holding the longest cached prefix of it —
 * the first chunks of the request's own hashes (docs/kv-events.md gives the algorithm; the router computes them
 * with the server's hasher) — ties going to the server with the fewest requests in flight, then to the one sent the
 * fewest requests so far (new conversations spread over the servers), then the lowest index.
 *
 * `audit` compares the router's view of a server with that server's actual L1 (`GET /api/l1/chunks`): after the
 * run quiesces both must be the same set — 0 chunks missing, 0 extra — or the stream lied or lost something.
 */
import { Effect, Stream } from "effect"
import { chunkHashes, hashHex } from "../services/kv/TokenHasher.ts"
import { makeKvIndex, subscribeKvIndexUpdates } from "../services/client/KvEventSubscriber.ts"
import type { DealerCurve } from "../services/zmq/Sockets.ts"
import { getJson } from "./internal/ServerHttp.ts"
import type { ReplayError } from "./ReplayOptions.ts"
import type { ReplayAudit } from "./ReplaySummary.ts"
import { tokensFor } from "./Synth.ts"
import type { TraceRequest } from "./Trace.ts"

/** Where a server publishes its KV events. */
export interface KvEventsPlace {
  readonly endpoint: string
  readonly replayEndpoint: string
}

/** The router over the servers `places` (index = server index). */
export interface KvRouter {
  /** The server for `r`, given each server's requests in flight. */
  readonly route: (r: TraceRequest, inflight: ReadonlyArray<number>) => number
  /**
   * The index audit of server `i` against its HTTP frontend `httpUrl` (with its bearer token, if any): waits (bounded: 10 s, a bound on a hang)
   * until the router's view equals L1's listing, then answers the difference (0 and 0 when it caught up).
   */
  readonly audit: (i: number, httpUrl: string, httpToken: string | undefined, model: string) => Effect.Effect<ReplayAudit, ReplayError>
}

/** Subscribes to every server's stream for the life of the scope; the router reads the indexes they keep. */
export const makeKvRouter = (
  places: ReadonlyArray<KvEventsPlace>,
  chunk: number,
  curve: DealerCurve | undefined
) =>
  Effect.gen(function*() {
    // Per server, the chunks it holds as its stream said (mpcache/client's index; the router reads CPU).
    const indexes = places.map(() => makeKvIndex())
    yield* Effect.forEach(places, (p, i) =>
      Effect.forkScoped(
        Stream.runForEach(
          subscribeKvIndexUpdates({ endpoint: p.endpoint, replayEndpoint: p.replayEndpoint, ...(curve === undefined ? {} : { curve }) }),
          (u) => Effect.sync(() => indexes[i]!.apply(u))
        ).pipe(Effect.ignore)
      ), { discard: true })
    // Requests sent to each server so far: the last tie-break, so new conversations spread over the servers.
    const sent = places.map(() => 0)
    const route = (r: TraceRequest, inflight: ReadonlyArray<number>): number => {
      const hashes = chunkHashes(tokensFor(r.hashIds, r.inputLength), chunk).map(hashHex)
      let best = 0
      let bestPrefix = -1
      for (let i = 0; i < indexes.length; i++) {
        let n = 0
        while (n < hashes.length && indexes[i]!.has(hashes[n]!)) n++
        const better = n > bestPrefix ||
          (n === bestPrefix && (inflight[i]! < inflight[best]! || (inflight[i] === inflight[best] && sent[i]! < sent[best]!)))
        if (better) {
          best = i
          bestPrefix = n
        }
      }
      sent[best]!++
      return best
    }
    const audit = (i: number, httpUrl: string, httpToken: string | undefined, model: string) =>
      Effect.gen(function*() {
        const url = `${httpUrl}/api/l1/chunks?model=${encodeURIComponent(model)}`
        const deadline = Date.now() + 10_000
        for (;;) {
          const listing = yield* getJson(url, httpToken)
          const actual = new Set(((listing["chunks"] ?? []) as ReadonlyArray<{ readonly hash: string }>).map((c) => c.hash))
          const view = indexes[i]!
          const missing = [...actual].filter((h) => !view.has(h)).length
          const extra = view.hashes().filter((h) => !actual.has(h)).length
          if ((missing === 0 && extra === 0) || Date.now() > deadline) {
            return { server: i + 1, l1_chunks: actual.size, router_chunks: view.size(), missing, extra } satisfies ReplayAudit
          }
          yield* Effect.sleep("200 millis") // a listing of a large L1 is not free
        }
      })
    return { route, audit } satisfies KvRouter
  })
