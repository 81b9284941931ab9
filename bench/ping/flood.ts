/**
 * `npm run bench:ping -- --flood [--quick | --full] [--rounds R] [--summary FILE]` (issue 27 item 1): one peer
 * must not starve the others. In one run, against one `mpcache serve` (npm start's bundled entry), alternating
 * round by round so that the machine's load hits every scenario alike:
 *
 * - **none**: no flood;
 * - **1 flooder** / **8 flooders**: that many DEALERs (bench/ping/flooder.ts, one child process), each with a
 *   receive high-water mark of 1 and a 4 KiB receive buffer, sending 50,000 nil PINGs as fast as they can and
 *   never reading a reply.
 *
 * In each round, while the flood runs, two well-behaved peers are timed:
 *
 * - a **fresh client**: a new DEALER, 30 nil PINGs 50 ms apart (open loop), each with a 1 s timeout;
 * - a **worker's heartbeat**: PING_REGISTERED [id, ["kv_cache"]] (what the WorkerAdapter sends) every second
 *   with a 500 ms timeout, naming a worker registered for the run (bench/ping/worker.ts), on one DEALER kept for
 *   the whole run; its round trips go to the scenario they were sent in.
 *
 * Target: 0 timeouts for both in every scenario, and their p99 under a flood at most 2× their p99 with none.
 * With `--write-docs` rewrites "## PING under a flood (bench:ping --flood)" of docs/benchmarks.md; the target
 * rows as JSON with `--summary FILE`. A benchmark, never a test: exits 0 on success, 1 on failure (a target
 * missed is a figure, not a failure, unless `--check`).
 */
import { Dealer } from "zeromq"
import { decodeReplyHeader, encodeRequest, pack, unpack } from "../../src/schema/Frame.ts"
import type { InstanceId } from "../../src/schema/InstanceId.ts"
import { makeInstanceId } from "../../src/schema/InstanceId.ts"
import { Ping, PingRegistered } from "../../src/schema/Op.ts"
import { LAUNCHER } from "../../scripts/bundle-serve.mjs"
import { startLineChild, stopChild } from "../lib/children.ts"
import { int } from "../lib/format.ts"
import { measuredDate, nodeAndCpu } from "../lib/machine.ts"
import { pingTail } from "../lib/pingClient.ts"
import { finishBench, type OutcomeFlags } from "../lib/outcome.ts"
import type { Resources } from "../lib/resources.ts"
import { summarizeUs, type LatencySummary } from "../lib/stats.ts"
import type { SummaryRow } from "../lib/summary.ts"
import { sleep } from "../lib/time.ts"
import { SERVE_FLAGS } from "./serveFlags.ts"

export const FLOOD_HEADING = "## PING under a flood (bench:ping --flood)"
const FLOOD_PINGS = 50_000
const FRESH_PINGS = 30
const FRESH_INTERVAL_MS = 50
const FRESH_TIMEOUT_MS = 1_000
const HEARTBEAT_INTERVAL_MS = 1_000
const HEARTBEAT_TIMEOUT_MS = 500
/** The target: p99 under a flood ≤ 2 × p99 with none. */
const P99_TARGET = 2
const READY_TIMEOUT_MS = 30_000
const STOP_TIMEOUT_MS = 5_000

/** A scenario: how many flooding DEALERs. */
interface Scenario {
  readonly name: string
  readonly flooders: number
}
const SCENARIOS: ReadonlyArray<Scenario> = [
  { name: "none", flooders: 0 },
  { name: "1 flooder", flooders: 1 },
  { name: "8 flooders", flooders: 8 }
]

/** Round trips (µs) answered in time, and requests that were not. */
interface Tally {
  readonly latenciesUs: Array<number>
  timeouts: number
}
const tally = (): Tally => ({ latenciesUs: [], timeouts: 0 })

/**
 * An open-loop client on `dealer`: `frames(uid)` sent every `intervalMs` (`count` times, or until `until()`),
 * each answered within `timeoutMs` or counted as a timeout in the tally `into()` returns at its send; replies
 * are matched by uid and checked by `ok`. Resolves once every request is answered or timed out.
 */
const openLoop = async (options: {
  readonly dealer: Dealer
  readonly frames: (uid: number) => Array<Buffer>
  readonly ok: (reply: ReadonlyArray<Uint8Array>) => number | undefined
  readonly intervalMs: number
  readonly timeoutMs: number
  readonly count?: number
  readonly until?: () => boolean
  readonly into: () => Tally | undefined
}): Promise<void> => {
  const pending = new Map<number, { readonly at: bigint; readonly into: Tally | undefined; readonly timer: NodeJS.Timeout }>()
  let uid = 0
  let sending = true
  let wake: (() => void) | undefined
  const settle = () => {
    if (!sending && pending.size === 0) wake?.()
  }
  const receiving = (async () => {
    for (;;) {
      let reply: Array<Buffer>
      try {
        reply = await options.dealer.receive()
      } catch {
        return // closed
      }
      const at = process.hrtime.bigint()
      const id = options.ok(reply)
      const p = id === undefined ? undefined : pending.get(id)
      if (p === undefined) continue // late (already counted as a timeout) or not ours
      clearTimeout(p.timer)
      pending.delete(id!)
      p.into?.latenciesUs.push(Number(at - p.at) / 1000)
      settle()
    }
  })()
  for (;;) {
    if (options.count !== undefined ? uid >= options.count : options.until!()) break
    const id = uid++
    const into = options.into()
    const timer = setTimeout(() => {
      if (!pending.delete(id)) return
      if (into !== undefined) into.timeouts++
      settle()
    }, options.timeoutMs)
    pending.set(id, { at: process.hrtime.bigint(), into, timer })
    await options.dealer.send(options.frames(id))
    await sleep(options.intervalMs)
  }
  sending = false
  if (pending.size > 0) await new Promise<void>((resolve) => (wake = resolve))
  void receiving
}

/** The uid of a success reply of op `opId`, else undefined. */
const okUid = (opId: number) => (reply: ReadonlyArray<Uint8Array>): number | undefined => {
  const h = decodeReplyHeader(reply)
  return h !== undefined && h._tag === "Ok" && h.opId === opId ? h.uid : undefined
}

const heartbeatFrames = (instanceId: InstanceId) => {
  const frames = encodeRequest(PingRegistered, 0, [instanceId, ["kv_cache"]])
  if (frames._tag === "Failure") throw new Error("cannot encode PING_REGISTERED")
  const tail = frames.value.slice(1)
  return (uid: number) => [pack(uid), ...tail]
}

const status = async (httpUrl: string): Promise<Record<string, unknown>> =>
  (await (await fetch(`${httpUrl}/api/status`)).json()) as Record<string, unknown>

/** Resolves once the server holds `peers` connections and nothing waits in its inbound queues (at most 120 s). */
const idle = async (httpUrl: string, peers: number): Promise<void> => {
  for (let i = 0; i < 1200; i++) {
    const s = await status(httpUrl)
    if (Number(s["connected_peers"]) <= peers && (s["inbound"] as { queued: number }).queued === 0) return
    await sleep(100)
  }
  throw new Error(`the server did not go idle within 120 s after a flood (connected peers, inbound queue)`)
}

interface ScenarioResult {
  readonly scenario: Scenario
  readonly fresh: Tally
  readonly heartbeat: Tally
  /** Seconds the flooders took to send their PINGs (as many as rounds; none for "none"). */
  readonly floodSeconds: Array<number>
}

/** What the server counted over the run (its /api/status at the end). */
interface ServerCounters {
  readonly undeliverable: number
  readonly refused: number
}

const p99 = (t: Tally): LatencySummary => summarizeUs([...t.latenciesUs])
const ms = (us: number) => Number.isFinite(us) ? `${(us / 1000).toFixed(2)} ms` : "n/a"

const section = (results: ReadonlyArray<ScenarioResult>, rounds: number, counters: ServerCounters): string => {
  const none = results.find((r) => r.scenario.flooders === 0)!
  const base = { fresh: p99(none.fresh).p99Us, heartbeat: p99(none.heartbeat).p99Us }
  const rows = results.map((r) => {
    const f = p99(r.fresh)
    const h = p99(r.heartbeat)
    const flood = r.floodSeconds.length === 0 ? "—" : `${(r.floodSeconds.reduce((a, b) => a + b, 0) / r.floodSeconds.length).toFixed(2)} s`
    return `| ${r.scenario.name} | ${flood} | ${f.samples} | ${r.fresh.timeouts} | ${ms(f.p50Us)} | ${ms(f.p99Us)} | ${(f.p99Us / base.fresh).toFixed(2)}× | ${h.samples} | ${r.heartbeat.timeouts} | ${ms(h.p50Us)} | ${ms(h.p99Us)} | ${(h.p99Us / base.heartbeat).toFixed(2)}× |`
  })
  return [
    FLOOD_HEADING,
    "",
    `Measured ${measuredDate()} with \`npm run bench:ping -- --flood\` (${rounds} rounds per scenario, scenarios alternating round by round) on ${nodeAndCpu()}.`,
    `Each flooder is a DEALER with a receive high-water mark of 1 and a 4 KiB receive buffer sending ${int(FLOOD_PINGS)} nil PINGs as fast as it can and reading none (bench/ping/flooder.ts).`,
    `While it floods: a fresh client sends ${FRESH_PINGS} nil PINGs ${FRESH_INTERVAL_MS} ms apart (${FRESH_TIMEOUT_MS} ms timeout each), and a worker's heartbeat sends PING_REGISTERED every ${HEARTBEAT_INTERVAL_MS} ms (${HEARTBEAT_TIMEOUT_MS} ms timeout).`,
    `Target: 0 timeouts, and p99 under a flood ≤ ${P99_TARGET}× the p99 with none (the same clients in the same run).`,
    "",
    "| flood | flood lasted (mean) | fresh PINGs | timeouts | p50 | p99 | p99 vs none | heartbeats | timeouts | p50 | p99 | p99 vs none |",
    "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ...rows,
    "",
    `The server counted ${int(counters.undeliverable)} replies it could not deliver (to the flooders: their pipes stayed full) and refused ${int(counters.refused)} for the bytes queued to their peer.`,
    "",
    verdict(results, base),
    "",
    "Before issue 27 item 1 (the same bench against the build before it, 2026-12-02, 2 rounds, the machine less quiet):",
    "1 flooder: 40 of the fresh client's 60 PINGs timed out, and 4 heartbeats; 8 flooders: all 60 PINGs and 7 heartbeats",
    "timed out; and the rounds with no flood after them still lost 30 PINGs, the server still working through the flood.",
    "Reproduce: `npm run bench:ping -- --flood` (`-- --quick`: 2 rounds, `-- --full`: 10, `-- --rounds R`)."
  ].join("\n")
}

/** What the run says about the two targets, in words. */
const verdict = (results: ReadonlyArray<ScenarioResult>, base: { readonly fresh: number; readonly heartbeat: number }): string => {
  const flooded = results.filter((r) => r.scenario.flooders > 0)
  const timeouts = flooded.reduce((n, r) => n + r.fresh.timeouts + r.heartbeat.timeouts, 0)
  const worst = Math.max(...flooded.flatMap((r) => [p99(r.fresh).p99Us / base.fresh, p99(r.heartbeat).p99Us / base.heartbeat]))
  return [
    timeouts === 0 ? "Timeouts: **met** — no request of the fresh client or the heartbeat went unanswered under either flood." : `Timeouts: **not met** — ${timeouts} under the floods.`,
    worst <= P99_TARGET
      ? `p99: **met** — at most ${worst.toFixed(2)}× the p99 with no flood.`
      : `p99: **not met** — up to ${worst.toFixed(2)}× the p99 with no flood. Where the tail comes from (2026-12-04, a GC observer and a 5 ms interval timer in the server, two rounds at a time): under the floods its young-generation scavenges took up to 20–40 ms (over 2 ms: about 70 of them, 1.2–1.5 s in all) and its event loop stalled up to 50–85 ms; a request that arrives then waits the stall out whatever its turn. Most of that garbage was the shed requests' error replies waiting unread in the flooders' outboxes (up to 10,000 each); they are no longer built for a peer whose replies back up, and the collections took 244 ms instead of 1,281 ms over two rounds (largest 33–51 ms) — but the loop still stalls up to 53–55 ms and the p99 did not move, so what is left is not only the collector and is not found yet. Tried and dropped: pausing the receive loop 1 ms after a batch that was mostly shed, with a bound of 16 waiting messages for a peer whose replies back up (GC time a fifth, p99 still 2.9–13.6×); that bound at 64 alone (GC time unchanged); a 1–2 MiB young generation (\`--max-semi-space-size\`: major collections of up to 180 ms instead).`
  ].join("\n")
}

const summaryRows = (results: ReadonlyArray<ScenarioResult>): Array<SummaryRow> => {
  const none = results.find((r) => r.scenario.flooders === 0)!
  return results.filter((r) => r.scenario.flooders > 0).flatMap((r) =>
    ([["fresh client", r.fresh, none.fresh], ["heartbeat", r.heartbeat, none.heartbeat]] as const).map(([who, t, n]) => {
      const ratio = p99(t).p99Us / p99(n).p99Us
      return {
        bench: "bench:ping --flood",
        figure: `${who} p99 under ${r.scenario.name}`,
        measured: `${ms(p99(t).p99Us)}, ${t.timeouts} timeouts`,
        reference: `${ms(p99(n).p99Us)} with no flood`,
        ratio,
        target: `0 timeouts, ≤ ${P99_TARGET}×`,
        met: t.timeouts === 0 && ratio <= P99_TARGET
      }
    })
  )
}

/**
 * The flood benchmark over `resources` (children, ipc files), `rounds` rounds per scenario; writes the doc
 * section and, with `summary`, the target rows. Rejects when a child fails to start or a reply is wrong.
 */
export const runFlood = async (resources: Resources, rounds: number, flags: OutcomeFlags): Promise<void> => {
  const endpoint = resources.ipcEndpoint("flood")
  const server = startLineChild("mpcache", [LAUNCHER, ...SERVE_FLAGS(endpoint)], resources.children)
  const httpUrl = (await server.waitFor(/HTTP frontend listening on (http:\/\/[^\s"]+)/, READY_TIMEOUT_MS))[1]!
  await server.waitFor(/MQ server listening on/, READY_TIMEOUT_MS)
  const worker = startLineChild("worker", ["bench/ping/worker.ts", endpoint], resources.children, { stdin: true })
  const instanceId = makeInstanceId(BigInt((await worker.waitFor(/"registered":"(\d+)"/, READY_TIMEOUT_MS, "stdout"))[1]!))

  const results: Array<ScenarioResult> = SCENARIOS.map((scenario) => ({ scenario, fresh: tally(), heartbeat: tally(), floodSeconds: [] }))
  let current: ScenarioResult | undefined
  let finished = false
  const heartbeatDealer = new Dealer({ linger: 0 })
  heartbeatDealer.connect(endpoint)
  const heartbeat = openLoop({
    dealer: heartbeatDealer,
    frames: heartbeatFrames(instanceId),
    ok: (reply) => {
      const uid = okUid(PingRegistered.id)(reply)
      const h = decodeReplyHeader(reply)
      // The server must hold the worker's kv_cache: an answer naming a missing kind is wrong.
      if (uid !== undefined && h !== undefined && h._tag === "Ok" && (unpack(h.body[0]!)?.value as Array<unknown>).length !== 0) {
        throw new Error("PING_REGISTERED: the server does not hold the bench worker's kv_cache")
      }
      return uid
    },
    intervalMs: HEARTBEAT_INTERVAL_MS,
    timeoutMs: HEARTBEAT_TIMEOUT_MS,
    until: () => finished,
    into: () => current?.heartbeat
  })
  const nilTail = pingTail(null)
  await sleep(200)
  // The worker's and the heartbeat's connections: what an idle server holds between rounds.
  const baselinePeers = Number((await status(httpUrl))["connected_peers"])
  try {
    for (let r = 0; r < rounds; r++) {
      for (let i = 0; i < results.length; i++) {
        const result = results[(i + r) % results.length]!
        const flooder = result.scenario.flooders === 0 ? undefined : startLineChild(
          "flooder",
          ["bench/ping/flooder.ts", endpoint, String(result.scenario.flooders), String(FLOOD_PINGS)],
          resources.children
        )
        if (flooder !== undefined) await flooder.waitFor(/"flooding":\d+/, READY_TIMEOUT_MS, "stdout")
        current = result
        const fresh = new Dealer({ linger: 0 })
        fresh.connect(endpoint)
        await openLoop({
          dealer: fresh,
          frames: (uid) => [pack(uid), ...nilTail],
          ok: okUid(Ping.id),
          intervalMs: FRESH_INTERVAL_MS,
          timeoutMs: FRESH_TIMEOUT_MS,
          count: FRESH_PINGS,
          into: () => result.fresh
        })
        fresh.close()
        if (flooder !== undefined) {
          const done = await flooder.waitFor(/"done":\d+,"seconds":([\d.]+)/, 120_000, "stdout")
          result.floodSeconds.push(Number(done[1]))
        }
        current = undefined
        // The next round starts on an idle server: the flood's connections gone and what they had sent handled
        // (the kernel still hands over what was in their sockets after they close).
        if (flooder !== undefined) await stopChild(flooder.process, STOP_TIMEOUT_MS)
        await idle(httpUrl, baselinePeers)
        process.stderr.write(`  round ${r + 1}/${rounds}: ${result.scenario.name} done\n`)
      }
    }
  } finally {
    finished = true
    await heartbeat
    heartbeatDealer.close()
  }
  const s = await status(httpUrl)
  const counters = { undeliverable: Number(s["undeliverable_replies"]), refused: Number(s["refused_replies"]) }
  await stopChild(worker.process, STOP_TIMEOUT_MS)
  await stopChild(server.process, STOP_TIMEOUT_MS)
  process.exitCode = finishBench(flags, { heading: FLOOD_HEADING, body: section(results, rounds, counters), rows: summaryRows(results) })
}
