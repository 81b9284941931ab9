/**
 * `npm run bench:l2 [-- --quick | --full] [-- --chunks N] [-- --rounds N] [-- --requests N] [-- --only transfer] [-- --mac]`
 *
 * The L2 tier on Redis (issue 15 "Benchmark"), against a real redis-server
 * started for the run (test/support/RedisFleet.ts: loopback port, temporary
 * folder, `--save '' --appendonly no`, stopped by pid at the end):
 *
 * 1. Reference: the Redis client's own SET and GET (node-redis, Buffer
 *    values) of `chunks` values of one 256-token chunk of a 32-layer
 *    8 × 128 float16 model (32 MiB), in parts 2–3's pattern: after a warm-up
 *    of 4 values each way, 4 commands in flight at a time.
 * 2. STORE → L2: a worker in this process STOREs the same number of chunks
 *    (4 per request) into server A (`--l2-url`); timed from the first STORE
 *    to the moment Redis holds a key for every chunk (DBSIZE, polled every
 *    5 ms): the write-through is asynchronous, so the STOREs' own answers
 *    say nothing about L2. GB/s, and the ratio to the client's SET (target
 *    ≥ 0.8×).
 * 3. L2 → RETRIEVE: server B (its own empty L1, the same L2) gets LOOKUP
 *    (the prefix is found in L2 and prefetched into L1) and RETRIEVE of every
 *    request into the worker's blocks; the last one is checked byte for byte
 *    against the source blocks. GB/s, and the ratio to the client's GET.
 *    Parts 1–3 run `--rounds` times (3 quick, 5 default, 7 full), each
 *    phase after an untimed ballast (`ballast`: the phase's bytes SET, GET
 *    and flushed, so Redis's allocator is in the same state for both), the
 *    reference first in odd rounds and last in even ones; each ratio is the
 *    median of the rounds' ratios, with their range.
 * 4. LOOKUP p99 of prefixes found nowhere (every chunk asked of L2) on a
 *    server with `--l2-url`, against the same on a server without L2.
 * 5. `mpcache replay --servers 2 --max-rate` on the conversation trace,
 *    without L2 (each server alone) and with one shared L2 (servers'
 *    `--l2-lookup-timeout-ms 1000`): hit ratio of each, the L1/L2 split and
 *    the perfect LRU of the combined capacity.
 *
 * `--only transfer`: parts 1–3 only (the figures a change to the write or
 * read path moves; `MPCACHE_BENCH_SERVER_NODE_OPTIONS` is given to the
 * servers' node, e.g. `--cpu-prof --cpu-prof-dir DIR` to profile them).
 *
 * `--mac`: servers A and B of parts 2–4 share a `--l2-secret-file` (a fresh
 * random secret, mode 0600, removed at the end), so every value is
 * authenticated with HMAC-SHA256 instead of checksummed (issue 24 item 14):
 * what the MAC costs the write-through and the fetch. The replay of part 5
 * runs without it.
 *
 * Parts 2–4 and the L2 half of 5 need `mpcache serve --l2-url` (issue 15's
 * L2 tier); a build without it runs the rest, says which parts it could not
 * run and why, and exits 1. It writes no tracked file; `--summary FILE`
 * writes the two ratio rows, and `--check` exits 1 when either is under its
 * target. A benchmark, never a test: ratios against a reference measured in
 * the same run.
 */
import { spawnSync } from "node:child_process"
import { randomBytes } from "node:crypto"
import { mkdtempSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Effect, Exit, Layer, ManagedRuntime, References, Scope } from "effect"
import { loggerLayer } from "../../src/layers/Logging.ts"
import { ClientLive } from "../../src/layers/Client.ts"
import type { NativeMemory } from "../../src/native/Native.ts"
import type { ReplaySummary } from "../../src/replay/Driver.ts"
import { promSum } from "../../src/replay/Stats.ts"
import type { PagedKvCache } from "../../src/services/client/PagedKvCache.ts"
import { makeSchedulerAdapter, type SchedulerAdapterShape } from "../../src/services/client/SchedulerAdapter.ts"
import { makeWorkerAdapter, type WorkerAdapterShape } from "../../src/services/client/WorkerAdapter.ts"
import type { ZmqSockets } from "../../src/services/zmq/Sockets.ts"
import { REDIS_CLI, REDIS_SERVER, redisAvailable, startRedis, type RedisFleet } from "../../test/support/RedisFleet.ts"
import { parseBenchArgs, usageError } from "../lib/args.ts"
import { verdict } from "../lib/outcome.ts"
import { writeSummary, type SummaryRow } from "../lib/summary.ts"
import { BLOCK_BYTES, BLOCKS_PER_CHUNK, CHUNK_BYTES, CHUNK_TOKENS, makeFilledCache, NUM_LAYERS, segmentNamesOf, unlinkSegments } from "../lib/kvChunks.ts"
import { ROOT, runNode, startLineChild } from "../lib/children.ts"
import { makeResources, runBench } from "../lib/resources.ts"
import { awaitL1Prefault } from "../lib/l1Prefault.ts"
import { SERVER_NODE_OPTIONS } from "../lib/serverNodeOptions.ts"
import { ascending, median, percentile } from "../lib/stats.ts"
import { secondsSince, sleep } from "../lib/time.ts"

// Geometry of bench:transfer (bench/lib/kvChunks.ts): one chunk of one rank = 32 MiB.
const MODEL = "bench-l2-32l-8x128-f16"
const CHUNKS_PER_REQUEST = 4
const REQUEST_TOKENS = CHUNKS_PER_REQUEST * CHUNK_TOKENS
const BLOCKS_PER_REQUEST = CHUNKS_PER_REQUEST * BLOCKS_PER_CHUNK
/** Block 0 (vLLM's null block) + one request's source blocks + one request's destination blocks. */
const NUM_BLOCKS = 1 + 2 * BLOCKS_PER_REQUEST
const L1_SIZE_GB = 1
const READY_TIMEOUT_MS = 30_000
const REQUEST_TIMEOUT_MS = 30_000
const L2_WAIT_TIMEOUT_MS = 120_000
/** LOOKUPs of prefixes found nowhere, per server (16 chunks each). */
const MISS_LOOKUPS = 300
const MISS_TOKENS = 16 * CHUNK_TOKENS
/**
 * The replay's servers' L2 lookup limit: on a shared 2-core machine the default 50 ms turns many
 * L2 steps into misses, and the replay measures reuse across servers, not that limit.
 */
const REPLAY_L2_LOOKUP_TIMEOUT_MS = 1000
/** The ratio issue 15 asks of STORE → L2 and L2 → RETRIEVE against the client's own SET and GET. */
const TARGET_RATIO = 0.8

const args = parseBenchArgs({
  chunks: { type: "string" },
  requests: { type: "string" },
  rounds: { type: "string" },
  only: { type: "string" },
  mac: { type: "boolean", default: false }
})
if (args.only !== undefined && args.only !== "transfer") usageError(`--only takes "transfer", got ${args.only}`)
const TRANSFER_ONLY = args.only === "transfer"
const count = (flag: string, text: string | undefined, fallback: number, multipleOf = 1): number => {
  if (text === undefined) return fallback
  const n = Number(text)
  return Number.isInteger(n) && n > 0 && n % multipleOf === 0 ? n : usageError(`--${flag} must be a positive multiple of ${multipleOf}, got ${text}`)
}
const CHUNKS = count("chunks", args.chunks, args.quick ? 8 : args.full ? 32 : 16, CHUNKS_PER_REQUEST)
/** Rounds of parts 1–3 (`--rounds`). */
const ROUNDS = count("rounds", args.rounds, args.quick ? 3 : args.full ? 7 : 5)
const REPLAY_REQUESTS = count("requests", args.requests, args.quick ? 200 : args.full ? 1000 : 300)
const REQUESTS = CHUNKS / CHUNKS_PER_REQUEST

const log = (line: string): void => void process.stderr.write(`${line}\n`)
const gbps = (bytes: number, seconds: number) => bytes / seconds / 1e9
const f2 = (x: number) => (Number.isFinite(x) ? x.toFixed(2) : "n/a")
const pct = (x: number) => `${(100 * x).toFixed(2)}%`

const resources = makeResources(`mpcache-bench-l2-${process.pid}-${Date.now().toString(36)}`, { stopTimeoutMs: 10_000, onSignal: "kill" })
const segmentNames = segmentNamesOf(resources.tag)
resources.onCleanup(() => unlinkSegments(segmentNames))

/** With `--mac`: the `--l2-secret-file` flags of servers A and B (one fresh secret, mode 0600, removed at the end). */
const macFlags: ReadonlyArray<string> = args.mac === true
  ? (() => {
    const dir = mkdtempSync(join(tmpdir(), `${resources.tag}-secret-`))
    resources.onCleanup(() => rmSync(dir, { recursive: true, force: true }))
    const file = join(dir, "l2.secret")
    writeFileSync(file, `${randomBytes(32).toString("hex")}\n`, { mode: 0o600 })
    return ["--l2-secret-file", file]
  })()
  : []

/** What could not be measured, and why: printed at the end; the exit status is then 1. */
const notRun: Array<string> = []

/** Whether this build's `mpcache serve` has the L2 tier (issue 15's `--l2-url`). */
const serveHasL2 = (): boolean =>
  spawnSync(process.execPath, ["src/cli/main.ts", "serve", "--help"], { cwd: ROOT, encoding: "utf8" }).stdout.includes("--l2-url")
const NO_L2 = "this build's mpcache serve has no --l2-url (issue 15's L2 tier, src/services/server/l2, is not in it yet)"

// ------------------------------------------------------------------ redis

/** The part of node-redis (`redis`) the reference uses; Buffer values through its type mapping. */
interface ReferenceClient {
  readonly connect: () => Promise<unknown>
  readonly set: (key: string, value: Buffer) => Promise<unknown>
  readonly get: (key: string) => Promise<Buffer | null>
  readonly dbSize: () => Promise<number>
  readonly flushAll: () => Promise<unknown>
  readonly close: () => Promise<void>
}
interface RedisModule {
  readonly createClient: (options: { readonly url: string }) => {
    readonly withTypeMapping: (mapping: Record<number, unknown>) => ReferenceClient
  }
  readonly RESP_TYPES: { readonly BLOB_STRING: number }
}

/**
 * The Redis client mpcache's L2 uses (node-redis), connected to `url` with Buffer replies. Loaded at
 * run time: the package comes with issue 15's L2 tier, and without it this fails naming it.
 */
const connectReference = async (url: string): Promise<ReferenceClient> => {
  const specifier = "redis"
  const mod = (await import(specifier).catch((e: unknown) => {
    throw new Error(`bench:l2 needs the Redis client package \`redis\` (node-redis; issue 15's L2 tier adds it): ${e instanceof Error ? e.message : String(e)}`)
  })) as RedisModule
  const client = mod.createClient({ url }).withTypeMapping({ [mod.RESP_TYPES.BLOB_STRING]: Buffer })
  await client.connect()
  return client
}

let fleetScope: Scope.Closeable | undefined
const startFleet = async (): Promise<RedisFleet> => {
  if (!redisAvailable()) throw new Error(`bench:l2 needs ${REDIS_SERVER} and ${REDIS_CLI} (apt-get install -y redis-server)`)
  fleetScope = await Effect.runPromise(Scope.make())
  return Effect.runPromise(Scope.provide(fleetScope)(startRedis()))
}

/** The L2 tier's counters of writes it did not make (src/services/server/l2/L2Metrics.ts). */
const LOST_WRITES = ["mpcache_l2_dropped_writes_total", "mpcache_l2_failed_writes_total"] as const

/** Sum of every sample of `name` in the server's /metrics (0 while absent). */
const metricSum = async (s: Server, name: string): Promise<number> => promSum(await (await fetch(`${s.httpUrl}/metrics`)).text(), name) ?? 0

/**
 * Polls DBSIZE every 5 ms until it is at least `keys`. Fails, naming the server's dropped and failed
 * L2 writes, as soon as those make `keys` unreachable, or after L2_WAIT_TIMEOUT_MS.
 */
const waitForKeys = async (client: ReferenceClient, s: Server, keys: number): Promise<void> => {
  const t0 = performance.now()
  for (let polls = 0;; polls++) {
    const n = await client.dbSize()
    if (n >= keys) return
    if (polls % 20 === 19 || performance.now() - t0 > L2_WAIT_TIMEOUT_MS) {
      const [dropped, failed] = await Promise.all(LOST_WRITES.map((m) => metricSum(s, m)))
      if (n + dropped! + failed! >= keys || performance.now() - t0 > L2_WAIT_TIMEOUT_MS) {
        throw new Error(`L2 holds ${n} of the ${keys} chunks stored (the server dropped ${dropped} and failed ${failed} L2 writes) after ${f2((performance.now() - t0) / 1000)} s`)
      }
    }
    await sleep(5)
  }
}

// ------------------------------------------------------------------ servers

interface Server {
  readonly endpoint: string
  readonly httpUrl: string
}

/**
 * The L2 flags of the measured servers: throughput, not the limits, is measured, so nothing of a
 * phase may be dropped for the in-flight cap (twice the phase's bytes) or time out on a loaded machine.
 */
const l2Flags = (url: string): Array<string> => [
  "--l2-url", url,
  "--l2-max-inflight-bytes", String(2 * CHUNKS * CHUNK_BYTES + 2 ** 20),
  "--l2-transfer-timeout-ms", "60000",
  "--l2-lookup-timeout-ms", "5000",
  ...macFlags
]

/** `mpcache serve` (chunk 256, L1 1 GiB, JSON logs) with `flags`, once its MQ and HTTP frontends listen. */
const startServer = async (name: string, flags: ReadonlyArray<string>): Promise<Server> => {
  const endpoint = resources.ipcEndpoint(name)
  const child = startLineChild(`mpcache server ${name}`, [
    ...SERVER_NODE_OPTIONS, "src/cli/main.ts", "serve", "--endpoint", endpoint, "--http-port", "0", "--l1-size-gb", String(L1_SIZE_GB),
    "--chunk-size", String(CHUNK_TOKENS), "--log-format", "json", ...flags
  ], resources.children)
  const [, http] = await Promise.all([
    child.waitFor(/MQ server listening on/, READY_TIMEOUT_MS),
    child.waitFor(/HTTP frontend listening on (http:\/\/[^\s"]+)/, READY_TIMEOUT_MS)
  ])
  const server = { endpoint, httpUrl: http[1]! }
  // The background prefault takes a core for about a second: no measured phase shares the machine with it.
  await awaitL1Prefault(server.httpUrl, READY_TIMEOUT_MS, 20)
  return server
}


// ------------------------------------------------------------------ worker

const runtime = ManagedRuntime.make(Layer.mergeAll(ClientLive, loggerLayer("pretty"), Layer.succeed(References.MinimumLogLevel, "Warn")))
let workerScope: Scope.Closeable | undefined
const run = <A, E>(effect: Effect.Effect<A, E, NativeMemory | ZmqSockets | Scope.Scope>): Promise<A> =>
  workerScope === undefined ? Promise.reject(new Error("the worker is not started")) : runtime.runPromise(Scope.provide(workerScope)(effect))

/** One KV cache in POSIX shm (every block non-zero and distinct), registered with each server it is given. */
const makeCache = async (): Promise<PagedKvCache> => {
  workerScope = await runtime.runPromise(Scope.make())
  return run(makeFilledCache(resources.tag, NUM_BLOCKS))
}

interface Attached {
  readonly server: Server
  readonly adapter: WorkerAdapterShape
  readonly scheduler: SchedulerAdapterShape
}
const attach = async (cache: PagedKvCache, s: Server): Promise<Attached> => {
  const adapter = await run(makeWorkerAdapter({ endpoint: s.endpoint, modelName: MODEL, worldSize: 1, kvRank: 0, requestTimeoutMs: REQUEST_TIMEOUT_MS }))
  await run(adapter.registerKvCaches(cache.descriptors))
  const scheduler = await run(makeSchedulerAdapter({ endpoint: s.endpoint, modelName: MODEL, worldSize: 1, requestTimeoutMs: REQUEST_TIMEOUT_MS }))
  return { server: s, adapter, scheduler }
}

const SOURCE = Array.from({ length: BLOCKS_PER_REQUEST }, (_, i) => 1 + i)
const DEST = Array.from({ length: BLOCKS_PER_REQUEST }, (_, i) => 1 + BLOCKS_PER_REQUEST + i)
/** Token ids of request `n` of a set: the first token makes every chunk hash of it unique to the run. */
const tokensFor = (set: number, n: number, length = REQUEST_TOKENS): Array<number> =>
  Array.from({ length }, (_, i) => (i === 0 ? set * 1_000_000 + n : (i * 31 + 7) % 32_000))

// ------------------------------------------------------------------ parts

interface Reference {
  readonly setGbps: number
  readonly getGbps: number
}

/** The reference's values: CHUNKS of CHUNK_BYTES, each a random pattern repeated, made once for every round. */
const referenceValues = (): Array<Buffer> => Array.from({ length: CHUNKS }, () => Buffer.alloc(CHUNK_BYTES).fill(randomBytes(4099)))

/** Runs `op` on 0 … count − 1, `batch` of them in flight at a time (as the measured path asks, request by request); seconds. */
const timedBatches = async (count: number, batch: number, op: (i: number) => Promise<unknown>): Promise<number> => {
  const t0 = process.hrtime.bigint()
  for (let i = 0; i < count; i += batch) await Promise.all(Array.from({ length: Math.min(batch, count - i) }, (_, k) => op(i + k)))
  return secondsSince(t0)
}

/**
 * Brings Redis's allocator to the state a phase of `values` leaves (SET and GET of all of them, 4 in
 * flight at a time, then FLUSHALL), untimed, before each measured phase. Most of Redis's time in
 * these phases is first-touch page faults of the memory it takes (on this VM ~4 ms per MiB), and
 * which memory it can reuse depends on what ran before: measured from a cold allocator, whichever
 * phase ran second in a round reused the first one's pages and looked up to 3× faster. A Redis in
 * service has been through this many times; this gives both sides of every ratio that state.
 */
const ballast = async (client: ReferenceClient, values: ReadonlyArray<Buffer>): Promise<void> => {
  await client.flushAll()
  const keys = values.map((_, i) => `bench:ballast:${i}`)
  await timedBatches(keys.length, CHUNKS_PER_REQUEST, (i) => client.set(keys[i]!, values[i]!))
  await timedBatches(keys.length, CHUNKS_PER_REQUEST, (i) => client.get(keys[i]!))
  await client.flushAll()
}

/**
 * The client's own SET, then GET, of `values` under round `round`'s keys, in the measured path's
 * pattern: on an emptied Redis, a warm-up of one request's worth each way (as parts 2–3 get), then
 * CHUNKS_PER_REQUEST commands in flight at a time. Redis's own cost here is mostly first-touch
 * page faults of its buffers (on this VM ~4 ms per MiB), and which buffers its allocator can reuse
 * depends on what ran just before; the same pattern gives both sides the same.
 */
const reference = async (client: ReferenceClient, values: ReadonlyArray<Buffer>, round: number): Promise<Reference> => {
  await client.flushAll()
  const warm = values.slice(0, CHUNKS_PER_REQUEST).map((_, i) => `bench:warm:${round}:${i}`)
  await Promise.all(warm.map((k, i) => client.set(k, values[i]!)))
  await Promise.all(warm.map((k) => client.get(k)))
  await client.flushAll()
  const keys = values.map((_, i) => `bench:ref:${round}:${i}`)
  const setSeconds = await timedBatches(keys.length, CHUNKS_PER_REQUEST, (i) => client.set(keys[i]!, values[i]!))
  // Each reply is checked as it comes and dropped (as the measured server drops its own once in L1):
  // keeping every reply until the end would grow this process by the whole phase's bytes.
  let wrong: string | undefined
  const getSeconds = await timedBatches(keys.length, CHUNKS_PER_REQUEST, async (i) => {
    const g = await client.get(keys[i]!)
    if (g === null || !g.equals(values[i]!)) wrong ??= keys[i]
  })
  if (wrong !== undefined) throw new Error(`the reference GET of ${wrong} returned other bytes`)
  await client.flushAll()
  return { setGbps: gbps(CHUNKS * CHUNK_BYTES, setSeconds), getGbps: gbps(CHUNKS * CHUNK_BYTES, getSeconds) }
}

/**
 * p99 (ms), per scheduler, of MISS_LOOKUPS LOOKUPs each of prefixes no tier holds, each session ended
 * after; the schedulers take turns lookup by lookup, so a busy moment of the machine falls on all alike.
 */
const missLookupP99s = async (schedulers: ReadonlyArray<SchedulerAdapterShape>, set: number): Promise<Array<number>> => {
  const ms = schedulers.map((): Array<number> => [])
  for (let i = 0; i < MISS_LOOKUPS; i++) {
    for (const [k, scheduler] of schedulers.entries()) {
      const requestId = `miss-${set}-${k}-${i}`
      const t0 = performance.now()
      const hit = await run(scheduler.lookup(requestId, tokensFor(set, k * MISS_LOOKUPS + i, MISS_TOKENS)))
      ms[k]!.push(performance.now() - t0)
      if (hit !== 0) throw new Error(`a LOOKUP of a prefix stored nowhere answered ${hit} tokens`)
      await run(scheduler.endSession(requestId))
    }
  }
  return ms.map((m) => percentile(ascending(m), 99))
}

/** STOREs every request into `a`; seconds until L2 holds a key for every chunk. */
/** STOREs `requests` requests of `set` into `s`, one after another, each asserted ok. */
const storeRequests = async (s: Attached, set: number, requests: number): Promise<void> => {
  for (let r = 0; r < requests; r++) {
    const ok = await run(s.adapter.store({ requestId: `store-${set}-${r}`, tokenIds: tokensFor(set, r), start: 0, end: REQUEST_TOKENS, blockIds: SOURCE }))
    if (!ok) throw new Error(`STORE of request ${r} of set ${set} through ${s.server.endpoint} answered ok = false`)
  }
}

const storeToL2 = async (a: Attached, client: ReferenceClient, set: number, requests = REQUESTS): Promise<number> => {
  const t0 = process.hrtime.bigint()
  await storeRequests(a, set, requests)
  log(`     (the STOREs answered after ${f2(secondsSince(t0))} s)`)
  await waitForKeys(client, a.server, requests * CHUNKS_PER_REQUEST)
  return secondsSince(t0)
}

/** LOOKUP (found in L2, prefetched) and RETRIEVE of every request through `b`; the last checked byte for byte. Seconds. */
const retrieveFromL2 = async (cache: PagedKvCache, b: Attached, set: number, requests = REQUESTS): Promise<number> => {
  const zero = Buffer.alloc(BLOCK_BYTES)
  for (let l = 0; l < NUM_LAYERS; l++) for (const kv of [0, 1] as const) for (const blk of DEST) await run(cache.writeBlock(l, kv, blk, zero))
  const t0 = process.hrtime.bigint()
  for (let r = 0; r < requests; r++) {
    const requestId = `retrieve-${set}-${r}`
    const tokenIds = tokensFor(set, r)
    const hit = await run(b.scheduler.lookup(requestId, tokenIds))
    if (hit !== REQUEST_TOKENS) throw new Error(`LOOKUP of request ${r} on the second server found ${hit} of ${REQUEST_TOKENS} tokens in L2`)
    const ok = await run(b.adapter.retrieve({ requestId, tokenIds, start: 0, end: hit, blockIds: DEST }))
    if (!ok) throw new Error(`RETRIEVE of request ${r} answered ok = false`)
    await run(b.scheduler.endSession(requestId))
  }
  const seconds = secondsSince(t0)
  for (let l = 0; l < NUM_LAYERS; l++) {
    for (const kv of [0, 1] as const) {
      for (let j = 0; j < BLOCKS_PER_REQUEST; j++) {
        const expected = await run(cache.readBlock(l, kv, SOURCE[j]!))
        const actual = await run(cache.readBlock(l, kv, DEST[j]!))
        if (!expected.equals(actual)) throw new Error(`L2 → RETRIEVE wrote wrong bytes: layer ${l}, kv ${kv}, block ${DEST[j]}`)
      }
    }
  }
  return seconds
}

/** `mpcache replay --servers 2 --max-rate --json` on the conversation trace, with `extra` flags. */
const replay2 = async (extra: ReadonlyArray<string>): Promise<ReplaySummary> => {
  const argv = ["src/cli/main.ts", "replay", "--servers", "2", "--workers", "1", "--requests", String(REPLAY_REQUESTS), "--max-rate", "--json", ...extra]
  const { code, stdout } = await runNode(argv, true)
  if (!stdout.trimStart().startsWith("{")) throw new Error(`mpcache replay ${argv.slice(2).join(" ")} exited ${code} without a summary`)
  const s = JSON.parse(stdout) as ReplaySummary
  if (code !== 0) throw new Error(`mpcache replay ${argv.slice(2).join(" ")} exited ${code}: failed its checks`)
  return s
}
const serverRatios = (s: ReplaySummary) => s.per_server.map((p) => (p.looked_up === 0 ? 0 : p.hit / p.looked_up))

interface Round {
  readonly ref: Reference
  readonly storeGbps: number
  readonly retrieveGbps: number
  /** The same STOREs into the server without L2: what part 2 does besides the SETs, on the same cores. */
  readonly storeL1Gbps: number
}

/** STOREs every request of `set` into `s` (no L2 behind it); seconds until the last one answered. */
const storeOnly = async (s: Attached, set: number): Promise<number> => {
  const t0 = process.hrtime.bigint()
  await storeRequests(s, set, REQUESTS)
  return secondsSince(t0)
}

/**
 * ROUNDS rounds of the reference (part 1) and of STORE → L2 then L2 → RETRIEVE (parts 2–3) of the same
 * bytes, each phase after a ballast (above), the order alternating round by round: the machine's
 * speed drifts over a run, so each ratio compares figures taken side by side. Each round ends with
 * the same STOREs into the server without L2, for the row that says what the STOREs alone cost.
 */
const transferRounds = async (
  client: ReferenceClient,
  values: ReadonlyArray<Buffer>,
  cache: PagedKvCache,
  a: Attached,
  b: Attached,
  plain: Attached
): Promise<Array<Round>> => {
  const rounds: Array<Round> = []
  for (let round = 0; round < ROUNDS; round++) {
    const refFirst = round % 2 === 0
    const measureRef = async () => {
      await ballast(client, values)
      return await reference(client, values, round)
    }
    const measureOurs = async () => {
      // The same warm-up as the reference's (one request each way, after the ballast): one request
      // through both servers.
      await ballast(client, values)
      await storeToL2(a, client, 500 + round, 1)
      await retrieveFromL2(cache, b, 500 + round, 1)
      await client.flushAll()
      const storeGbps = gbps(CHUNKS * CHUNK_BYTES, await storeToL2(a, client, 10 + round))
      const retrieveGbps = gbps(CHUNKS * CHUNK_BYTES, await retrieveFromL2(cache, b, 10 + round))
      await client.flushAll()
      return { storeGbps, retrieveGbps }
    }
    const ref = refFirst ? await measureRef() : undefined
    const ours = await measureOurs()
    const measured = { ref: ref ?? await measureRef(), ...ours }
    const r = { ...measured, storeL1Gbps: gbps(CHUNKS * CHUNK_BYTES, await storeOnly(plain, 10 + round)) }
    log(
      `  round ${round + 1}: client SET ${f2(r.ref.setGbps)} GB/s · GET ${f2(r.ref.getGbps)} GB/s; ` +
        `STORE → L2 ${f2(r.storeGbps)} GB/s = ${f2(r.storeGbps / r.ref.setGbps)}× SET; ` +
        `L2 → RETRIEVE ${f2(r.retrieveGbps)} GB/s = ${f2(r.retrieveGbps / r.ref.getGbps)}× GET; STORE alone ${f2(r.storeL1Gbps)} GB/s`
    )
    rounds.push(r)
  }
  return rounds
}

/** `GB/s = ratio× OP` from per-round [ours, reference] pairs: medians, with the rounds' range of ratios. */
const ratioRow = (pairs: ReadonlyArray<readonly [number, number]>, op: string): string => {
  const ratios = pairs.map(([x, ref]) => x / ref)
  return `${f2(median(pairs.map(([x]) => x)))} GB/s = ${f2(median(ratios))}× ${op} (rounds ${f2(Math.min(...ratios))}–${f2(Math.max(...ratios))}; target ≥ ${TARGET_RATIO}×)`
}

/** The summary row of one ratio (median of the rounds') against its target. */
const targetRow = (figure: string, pairs: ReadonlyArray<readonly [number, number]>): SummaryRow => {
  const ratio = median(pairs.map(([x, ref]) => x / ref))
  return {
    bench: "l2",
    figure,
    measured: `${f2(median(pairs.map(([x]) => x)))} GB/s`,
    reference: `${f2(median(pairs.map(([, ref]) => ref)))} GB/s`,
    ratio,
    target: `≥ ${TARGET_RATIO}×`,
    met: ratio >= TARGET_RATIO
  }
}

// ------------------------------------------------------------------ main

const main = async (): Promise<void> => {
  const hasL2 = serveHasL2()
  log(`bench:l2 — ${CHUNKS} chunks of ${CHUNK_BYTES / 2 ** 20} MiB (256 tokens, ${MODEL}); replay ${REPLAY_REQUESTS} requests over 2 servers`)
  if (!hasL2) log(`  note: ${NO_L2}; parts 2–4 and the L2 replay are not run`)
  if (macFlags.length > 0) log("  --mac: servers A and B authenticate every value with HMAC-SHA256 (--l2-secret-file)")
  const fleet = await startFleet()
  const client = await connectReference(fleet.url)
  const rows: Array<[string, string]> = []
  const targets: Array<SummaryRow> = []
  try {
    const values = referenceValues()
    const l1Only = await startServer("l1only", [])
    const cache = await makeCache()
    const plain = await attach(cache, l1Only)

    if (hasL2) {
      const a = await attach(cache, await startServer("a", l2Flags(fleet.url)))
      const b = await attach(cache, await startServer("b", l2Flags(fleet.url)))
      const r = await transferRounds(client, values, cache, a, b, plain)
      rows.push(["client SET / GET (reference)", `${f2(median(r.map((x) => x.ref.setGbps)))} / ${f2(median(r.map((x) => x.ref.getGbps)))} GB/s (median of ${ROUNDS} rounds)`])
      const store = r.map((x) => [x.storeGbps, x.ref.setGbps] as const)
      const retrieve = r.map((x) => [x.retrieveGbps, x.ref.getGbps] as const)
      rows.push(["STORE → L2", ratioRow(store, "SET")])
      rows.push(["L2 → RETRIEVE", ratioRow(retrieve, "GET")])
      targets.push(targetRow("STORE → L2 against the client's SET", store), targetRow("L2 → RETRIEVE against the client's GET", retrieve))
      rows.push(["STORE alone (server without L2)", `${f2(median(r.map((x) => x.storeL1Gbps)))} GB/s (the copy into L1 part 2 also makes, on the same cores)`])
      if (TRANSFER_ONLY) return printRows(rows)
      await client.flushAll()
      const [p99L1, p99L2] = await missLookupP99s([plain.scheduler, a.scheduler], 1000)
      log(`  4. LOOKUP p99 with the L2 step: ${f2(p99L2!)} ms; L1 only: ${f2(p99L1!)} ms`)
      rows.push(["LOOKUP p99, 16 chunks found nowhere", `${f2(p99L2!)} ms with the L2 step vs ${f2(p99L1!)} ms L1 only`])
    } else {
      const ref = await reference(client, values, 0)
      log(`  1. client SET ${f2(ref.setGbps)} GB/s · GET ${f2(ref.getGbps)} GB/s`)
      rows.push(["client SET / GET (reference)", `${f2(ref.setGbps)} / ${f2(ref.getGbps)} GB/s`])
      notRun.push(`2. STORE → L2 GB/s: ${NO_L2}`, `3. L2 → RETRIEVE GB/s: ${NO_L2}`, `4. LOOKUP p99 with the L2 step: ${NO_L2}`)
      const [p99L1] = await missLookupP99s([plain.scheduler], 1)
      log(`  4. LOOKUP p99, L1 only: ${f2(p99L1!)} ms`)
      rows.push(["LOOKUP p99, 16 chunks found nowhere", `${f2(p99L1!)} ms L1 only (with L2: not run)`])
    }
    await closeWorker()

    const alone = await replay2([])
    const each = serverRatios(alone)
    log(`  5. replay, 2 servers without L2: hit ${pct(alone.hit_ratio)} (server 1 ${pct(each[0]!)}, server 2 ${pct(each[1]!)}); perfect LRU of the combined capacity ${pct(alone.perfect_lru_combined_hit_ratio)}`)
    rows.push(["replay, 2 servers, each alone", `${pct(alone.hit_ratio)} (${each.map(pct).join(", ")}); perfect LRU combined ${pct(alone.perfect_lru_combined_hit_ratio)}`])
    if (hasL2) {
      await client.flushAll()
      const shared = await replay2(["--l2-url", fleet.url, "--l2-lookup-timeout-ms", String(REPLAY_L2_LOOKUP_TIMEOUT_MS)])
      log(`  5. replay, 2 servers sharing L2: hit ${pct(shared.hit_ratio)} (L1 ${pct(shared.hit_ratio_l1)}, L2 ${pct(shared.hit_ratio_l2)})`)
      rows.push(["replay, 2 servers sharing L2", `${pct(shared.hit_ratio)} (L1 ${pct(shared.hit_ratio_l1)} + L2 ${pct(shared.hit_ratio_l2)})`])
    } else {
      notRun.push(`5. replay across 2 servers with L2: ${NO_L2}`)
    }
  } finally {
    await closeWorker()
    await client.close().catch(() => undefined)
    if (fleetScope !== undefined) await Effect.runPromise(Scope.close(fleetScope, Exit.void))
  }
  printRows(rows)
  writeSummary(args.summary, targets)
  process.exitCode = verdict(args, targets, log)
  if (notRun.length > 0) {
    process.stdout.write(`\nNOT RUN (exit status 1):\n${notRun.map((n) => `  ${n}`).join("\n")}\n`)
    process.exitCode = 1
  }
}

const printRows = (rows: ReadonlyArray<readonly [string, string]>): void => {
  const width = Math.max(...rows.map(([k]) => k.length))
  process.stdout.write(`\n${rows.map(([k, v]) => `${k.padEnd(width)}  ${v}`).join("\n")}\n`)
}

const closeWorker = async (): Promise<void> => {
  const scope = workerScope
  workerScope = undefined
  if (scope !== undefined) await runtime.runPromise(Scope.close(scope, Exit.void))
}

await runBench("bench:l2", async () => {
  await main()
  await runtime.dispose()
}, resources)
