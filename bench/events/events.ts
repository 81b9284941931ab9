/**
 * `npm run bench:events [-- --quick | --full]`
 *
 * What KV events cost (issue 28, "Benchmark"), over real ZeroMQ sockets:
 *
 * 1. STORE throughput with events on (the log at its default size, the PUB and its replay ROUTER bound, a
 *    subscriber attached that never reads) against events off (`--kv-event-log-size 0`), rounds alternating
 *    which goes first. The server is `mpcache serve` in a process of its own, the stalled subscriber in another
 *    (stalled.ts), the client (an engine worker) here: as deployed. Beside the rates, the server's CPU time a
 *    STORE, all threads (/proc), which the host's noise moves less. Target: on ≥ 0.95× off (events cost ≤ 5 %).
 * 2. Records per second through the PUB: `stored` records of 256-token chunks appended to the log of a server in
 *    this process as fast as L1 could commit them, counted as a fast subscriber in a process of its own
 *    (subscriber.ts, as a router is) decodes them, while the stalled one is attached. Target ≥ 100,000 records/s
 *    on this machine.
 *
 * `--check` exits 1 when a target is missed; `--write-docs` rewrites its section of docs/benchmarks.md. A
 * benchmark, never a test.
 */
import { type ChildProcess, fork } from "node:child_process"
import { randomUUID } from "node:crypto"
import { mkdtempSync, rmSync } from "node:fs"
import { loadavg, tmpdir } from "node:os"
import { join } from "node:path"
import { fileURLToPath } from "node:url"
import { Effect } from "effect"
import * as zmq from "zeromq"
import { ClientLive } from "../../src/layers/Client.ts"
import { makeInstanceId } from "../../src/schema/InstanceId.ts"
import { RegisterKvCache, Store } from "../../src/schema/Op.ts"
import { MqClient } from "../../src/services/client/MqClient.ts"
import { makePagedKvCache } from "../../src/services/client/PagedKvCache.ts"
import { chunkHashes } from "../../src/services/kv/TokenHasher.ts"
import { KvEvents } from "../../src/services/server/kvevents/KvEvents.ts"
import { testServer } from "../../test/support/TestServer.ts"
import { bundleServe, LAUNCHER } from "../../scripts/bundle-serve.mjs"
import { parseBenchArgs } from "../lib/args.ts"
import { spawnReady, stopChild } from "../lib/children.ts"
import { threadCpu } from "../lib/machine.ts"
import { finishBench } from "../lib/outcome.ts"
import { SERVE_FLAGS } from "../ping/serveFlags.ts"
import { median } from "../lib/stats.ts"

const HEADING = "## KV events (bench:events)"
const args = parseBenchArgs({})
const ROUNDS = args.quick === true ? 3 : args.full === true ? 9 : 5
const STORES = args.quick === true ? 600 : args.full === true ? 5000 : 3000
/**
 * STOREs before each round's counted ones, on each fresh server: the JIT tiers the STORE path (and, with events
 * on, the log, the drain and the encoder) up meanwhile, so the counted ones measure a server's steady state (it
 * runs for days), and rounds this long move less with the machine's noise than the 200 + 800 they once were.
 */
const WARMUP = args.quick === true ? 500 : 2000
const RECORDS = args.quick === true ? 50_000 : args.full === true ? 400_000 : 150_000
const CHUNK = 256
const geometry = { numLayers: 2, numBlocks: 64, blockSizeTokens: 16, numHeads: 2, headSize: 8, dtype: "float16" as const }
const log = (line: string) => process.stdout.write(`${line}\n`)

const dir = mkdtempSync(join(tmpdir(), "mpcache-bench-events-"))
process.once("exit", () => rmSync(dir, { recursive: true, force: true }))
const pub = `ipc://${join(dir, "pub")}`
const replay = `ipc://${join(dir, "replay")}`

const children = new Set<ChildProcess>()
process.once("exit", () => children.forEach((c) => c.kill("SIGKILL")))

/** The STORE part's stalled subscriber: a process of its own (stalled.ts) that connects, subscribes and never reads. */
const stalledSubscriber = Effect.acquireRelease(
  Effect.promise(() =>
    new Promise<ChildProcess>((resolve, reject) => {
      const child = fork(fileURLToPath(new URL("./stalled.ts", import.meta.url)), [pub], { stdio: "inherit" })
      children.add(child)
      child.once("message", () => resolve(child))
      child.once("exit", (code) => reject(new Error(`the stalled subscriber exited (${code}) before it connected`)))
    })
  ),
  (child) => Effect.sync(() => void child.kill("SIGKILL"))
)

/**
 * `mpcache serve` (npm start's bundled entry) in a process of its own, as an engine's server is: with events on, the
 * log at its default size, the PUB and its replay ROUTER bound; off, `--kv-event-log-size 0`. Stopped with SIGTERM.
 */
const servedStore = (on: boolean, endpoint: string) =>
  Effect.acquireRelease(
    Effect.promise(() =>
      spawnReady(
        `mpcache serve (events ${on ? "on" : "off"})`,
        [
          LAUNCHER,
          ...SERVE_FLAGS(endpoint),
          "--chunk-size",
          String(CHUNK),
          "--l1-size-gb",
          "0.25",
          ...(on ? ["--kv-events-endpoint", pub, "--kv-events-replay-endpoint", replay] : ["--kv-event-log-size", "0"])
        ],
        "MQ server listening on",
        60_000,
        children
      )
    ),
    (child) => Effect.promise(() => stopChild(child, 10_000))
  )

/**
 * STOREs per second of `STORES` distinct 1-chunk prompts (each chunk 2 × 2 layers × 256 tokens × 16 × 2 bytes), from
 * one client in this process (an engine worker) to a server in its own: the drain's work after each answer overlaps
 * the client's, as it does in a deployment, instead of sitting on one event loop with it.
 */
const storeRate = (on: boolean) =>
  Effect.gen(function*() {
    const endpoint = `ipc://${join(dir, `mq-${randomUUID()}`)}`
    const server = yield* servedStore(on, endpoint)
    if (on) yield* stalledSubscriber
    return yield* Effect.gen(function*() {
      const client = yield* MqClient
      const cache = yield* makePagedKvCache({ backing: "cpu_shm", namePrefix: `mpcache-bench-${randomUUID()}`, ...geometry })
      yield* client.request(RegisterKvCache, [makeInstanceId(1n), cache.descriptors, "bench", 1, "vllm", {}, []])
      const blocks = Array.from({ length: CHUNK / 16 }, (_, i) => i + 1)
      const store = (n: number) =>
        client.request(Store, [
          {
            model_name: "bench",
            world_size: 1,
            worker_id: 0,
            token_ids: Array.from({ length: CHUNK }, (_, i) => (n * CHUNK + i) % 2 ** 31),
            start: 0,
            end: CHUNK,
            request_id: `r${n}`,
            cache_salt: ""
          },
          makeInstanceId(1n),
          [blocks],
          new Uint8Array(0)
        ])
      for (let n = 0; n < WARMUP; n++) yield* store(STORES + n) // the JIT and the pool warmed, not counted
      const started = performance.now()
      const cpu0 = threadCpu(server.pid!) // CPU seconds so far: its JS thread's and the others' (bench/lib/machine.ts)
      for (let n = 0; n < STORES; n++) yield* store(n)
      const seconds = (performance.now() - started) / 1000
      const cpu1 = threadCpu(server.pid!)
      const us = (s: number) => s * 1e6 / STORES
      return {
        rate: STORES / seconds,
        serverCpuUs: us(cpu1.js + cpu1.other - cpu0.js - cpu0.other),
        jsUs: us(cpu1.js - cpu0.js),
        otherUs: us(cpu1.other - cpu0.other)
      }
    }).pipe(Effect.provide(MqClient.layer({ endpoint, requestTimeoutMs: 30_000 })))
  }).pipe(Effect.scoped)

/**
 * Records per second a fast subscriber decodes, in a process of its own as a router is (subscriber.ts), while a slow
 * one is attached: from the first record appended to the subscriber's word that it decoded the last.
 */
const pubRate = Effect.gen(function*() {
  const { log: events } = yield* KvEvents
  yield* stalledSubscriber
  const child = yield* Effect.acquireRelease(
    Effect.sync(() => fork(fileURLToPath(new URL("./subscriber.ts", import.meta.url)), [pub, String(RECORDS), String(CHUNK)], { stdio: "inherit" })),
    (c) => Effect.sync(() => void (c.exitCode === null && c.kill("SIGKILL")))
  )
  const word = (w: string) => new Promise<void>((resolve, reject) => {
    const onMessage = (m: unknown) => m === w && (child.off("message", onMessage), resolve())
    child.on("message", onMessage)
    child.once("exit", (code) => reject(new Error(`the subscriber exited (${code}) before saying ${w}`)))
  })
  const tokens = new Uint32Array(CHUNK).map((_, i) => i)
  const hashes = chunkHashes(Array.from(tokens), CHUNK, 1)
  const record = (t: Uint32Array) =>
    events.append({ kind: "stored", model: "bench", medium: "CPU", saltGroup: "", chunkHash: hashes[0]!, parentHash: null, tokenIds: t })
  // Probes (one token each, not counted) until the subscriber hears one: its subscription is in place.
  const heard = word("heard")
  let ready = false
  void heard.then(() => (ready = true))
  while (!ready) {
    record(tokens.subarray(0, 1))
    yield* Effect.sleep(20)
  }
  child.send("start")
  yield* Effect.sleep(50) // the word reaches the child before the first counted record
  const done = word("done")
  const started = performance.now()
  for (let n = 0; n < RECORDS; n++) {
    record(tokens)
    // L1 commits come from requests: let the drain run between bursts as it would between them.
    if (n % 512 === 511) yield* Effect.yieldNow
  }
  yield* Effect.promise(() => done)
  return RECORDS / ((performance.now() - started) / 1000)
}).pipe(
  Effect.scoped,
  Effect.provide(testServer({ config: { chunkSize: CHUNK, kvEventLogSize: 1 << 20, kvEventsEndpoint: pub, kvEventsReplayEndpoint: replay } }))
)

const main = Effect.gen(function*() {
  process.stderr.write(`bundle-serve: ${yield* Effect.promise(() => bundleServe())}\n`)
  log(`bench:events — ${ROUNDS} rounds of ${STORES} STOREs with events on and off; ${RECORDS} records through the PUB`)
  type Round = { rate: number; serverCpuUs: number; jsUs: number; otherUs: number }
  const on: Array<Round> = []
  const off: Array<Round> = []
  for (let round = 1; round <= ROUNDS; round++) {
    const order = round % 2 === 1 ? [true, false] : [false, true]
    for (const o of order) (o ? on : off).push(yield* storeRate(o))
    const [a, b] = [on.at(-1)!, off.at(-1)!]
    log(
      `  round ${round}: on ${a.rate.toFixed(0)}/s (server ${a.serverCpuUs.toFixed(0)} µs CPU a STORE: JS thread ${a.jsUs.toFixed(0)}, others ${
        a.otherUs.toFixed(0)
      }), off ${b.rate.toFixed(0)}/s (${b.serverCpuUs.toFixed(0)} µs: ${b.jsUs.toFixed(0)}, ${b.otherUs.toFixed(0)}); load ${
        loadavg().map((x) => x.toFixed(2)).join(" ")
      }`
    )
  }
  const rates: Array<number> = []
  for (let round = 1; round <= Math.max(1, Math.floor(ROUNDS / 2)); round++) {
    rates.push(yield* pubRate)
    log(`  PUB round ${round}: ${rates.at(-1)!.toFixed(0)} records/s`)
  }
  return {
    on: median(on.map((x) => x.rate)),
    off: median(off.map((x) => x.rate)),
    onCpu: median(on.map((x) => x.serverCpuUs)),
    offCpu: median(off.map((x) => x.serverCpuUs)),
    pub: median(rates)
  }
})

const r = await Effect.runPromise(main.pipe(Effect.provide(ClientLive)))
const ratio = r.off > 0 ? r.on / r.off : 0
process.exitCode = finishBench(args, {
  heading: HEADING,
  body: [
    HEADING,
    "",
    `\`npm run bench:events\`: ${ROUNDS} rounds alternating events on (log 32,768, PUB and replay ROUTER bound, a`,
    `subscriber that never reads) and off, each of ${STORES} one-chunk STOREs (256 tokens) counted after ${WARMUP}`,
    "uncounted ones (the JIT's warm-up) on a fresh `mpcache serve` in a process of its own (the stalled subscriber in",
    `another, the client in the bench's); then ${RECORDS} records through the PUB to a fast subscriber in a process of`,
    "its own (as a router is) that decodes every batch, while the stalled one (receive HWM 1, never reading) is attached.",
    "",
    "```",
    `STORE rate, events on:  median ${r.on.toFixed(0)}/s`,
    `STORE rate, events off: median ${r.off.toFixed(0)}/s  (on/off ${ratio.toFixed(3)})`,
    `server CPU a STORE (all threads, /proc): on ${r.onCpu.toFixed(0)} µs, off ${r.offCpu.toFixed(0)} µs (on/off ${(r.onCpu / r.offCpu).toFixed(3)})`,
    `PUB: median ${r.pub.toFixed(0)} records/s decoded by the fast subscriber`,
    "```",
    "",
    "Where an events-on STORE's extra CPU goes (2026-12-04, each server's `--cpu-prof` over 25,000 counted STOREs a",
    "side): about 56 µs a STORE on the JS thread, of which garbage collection 6.6 µs, the drain's PUB send 3.3,",
    "L1EventSink's `committed` 3.1, the batch encoder 2.9 and its copy out 2.8, the drain's timers 2.2, the rest spread",
    "thinly. In shorter rounds a log without the PUB read 1.00×, a 20 ms batch interval instead of 5 ms and one token",
    "array shared by every record moved the ratio by less than the rounds' noise (about ±5 %); five runs of rounds of",
    "3,000–5,000 STOREs read 0.87–1.00×.",
    ""
  ].join("\n"),
  rows: [
    {
      bench: "events",
      figure: "STORE rate with KV events on (log, PUB, a stalled subscriber)",
      measured: `${r.on.toFixed(0)}/s`,
      reference: `${r.off.toFixed(0)}/s with events off`,
      ratio,
      target: "≥ 0.95×",
      met: ratio >= 0.95
    },
    {
      bench: "events",
      figure: "records/s through the PUB with a stalled subscriber attached",
      measured: `${r.pub.toFixed(0)}/s`,
      reference: "100000/s",
      ratio: r.pub / 100_000,
      target: "≥ 1×",
      met: r.pub >= 100_000
    }
  ]
})
