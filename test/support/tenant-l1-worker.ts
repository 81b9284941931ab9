/**
 * A child process for the L1 shares e2e test (issue 27 item 2): two engine workers of two tenants (their own
 * CURVE keys, or none) in one process, so their turns are in a fixed order. Worker B stores a working set of
 * `setRequests` requests; then each round worker A stores `aStoresPerRound` fresh requests and B LOOKUPs its whole
 * set again (ending each session). Prints one JSON line: B's chunks looked up and found (`hits`, `reads`) over the
 * rounds, and A's chunks stored.
 *
 *   node test/support/tenant-l1-worker.ts '{"endpoint":…,"namePrefix":…,"rounds":…,"aStoresPerRound":…,"setRequests":…,"tokensPerRequest":…,"curveA":…,"curveB":…}'
 */
import { Effect } from "effect"
import { ClientLive } from "../../src/layers/Client.ts"
import { makePagedKvCache } from "../../src/services/client/PagedKvCache.ts"
import { makeSchedulerAdapter } from "../../src/services/client/SchedulerAdapter.ts"
import { makeWorkerAdapter } from "../../src/services/client/WorkerAdapter.ts"
import type { DealerCurve } from "../../src/services/zmq/Sockets.ts"
import { writeTokens } from "./KvData.ts"

interface Args {
  readonly endpoint: string
  readonly namePrefix: string
  readonly rounds: number
  readonly aStoresPerRound: number
  readonly setRequests: number
  readonly tokensPerRequest: number
  readonly curveA?: DealerCurve
  readonly curveB?: DealerCurve
}

const args = JSON.parse(process.argv[2] ?? "{}") as Args
/** 8 KiB of KV per token (4 layers × K, V × 8 heads × 64 × bf16): a chunk of 64 tokens is 512 KiB of L1. */
const geometry = { numLayers: 4, blockSizeTokens: 16, numHeads: 8, headSize: 64, dtype: "bfloat16" as const }
const blocks = args.tokensPerRequest / geometry.blockSizeTokens
const blockIds = Array.from({ length: blocks }, (_, i) => i)
/** Token ids of request `n` of `who`: distinct from every other request's from the first token. */
const tokensOf = (who: number, n: number) => Array.from({ length: args.tokensPerRequest }, (_, i) => (who * 1_000_003 + n * 7_919 + i * 31) % 32_000)

const tenant = (name: string, curve: DealerCurve | undefined) =>
  Effect.gen(function*() {
    const c = curve === undefined ? {} : { curve }
    const cache = yield* makePagedKvCache({ namePrefix: `${args.namePrefix}-${name}`, backing: "cpu_memfd", numBlocks: blocks, ...geometry })
    const worker = yield* makeWorkerAdapter({ endpoint: args.endpoint, modelName: "shares-e2e", worldSize: 1, kvRank: 0, heartbeatIntervalMs: 5_000, requestTimeoutMs: 30_000, ...c })
    yield* worker.registerPagedKvCache(cache)
    const scheduler = yield* makeSchedulerAdapter({ endpoint: args.endpoint, modelName: "shares-e2e", worldSize: 1, ...c })
    yield* writeTokens(cache, 1, blockIds)
    const store = (who: number, n: number) =>
      worker.store({ requestId: `${name}-s${n}`, tokenIds: tokensOf(who, n), start: 0, end: args.tokensPerRequest, blockIds })
    const lookup = (who: number, n: number, round: number) =>
      Effect.gen(function*() {
        const id = `${name}-l${round}-${n}`
        const hit = yield* scheduler.lookup(id, tokensOf(who, n))
        yield* scheduler.endSession(id)
        return hit
      })
    return { worker, store, lookup, chunkTokens: worker.chunkSizeTokens }
  })

const program = Effect.gen(function*() {
  const a = yield* tenant("a", args.curveA)
  const b = yield* tenant("b", args.curveB)
  for (let n = 0; n < args.setRequests; n++) if (!(yield* b.store(2, n))) return yield* Effect.die(new Error(`B's store ${n} failed`))
  let hits = 0
  let reads = 0
  let aStored = 0
  let aNext = 0
  for (let round = 0; round < args.rounds; round++) {
    for (let i = 0; i < args.aStoresPerRound; i++) {
      if (yield* a.store(1, aNext++)) aStored += args.tokensPerRequest / a.chunkTokens
    }
    for (let n = 0; n < args.setRequests; n++) {
      hits += (yield* b.lookup(2, n, round)) / b.chunkTokens
      reads += args.tokensPerRequest / b.chunkTokens
    }
  }
  return { hits, reads, aStored }
})

Effect.runPromise(program.pipe(Effect.scoped, Effect.provide(ClientLive))).then(
  (result) => process.stdout.write(`${JSON.stringify(result)}\n`),
  (error: unknown) => {
    process.stderr.write(`tenant-l1-worker failed: ${String(error)}\n`)
    process.exitCode = 1
  }
)
