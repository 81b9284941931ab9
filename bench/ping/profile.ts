/**
 * `node bench/ping/profile.ts [--clients 16] [--duration 8] [--pings 100000] [--out DIR] [--parts cpu,heap,alloc]`
 *
 * Profiles the mpcache server under PING load from `--clients` raw clients
 * (bench/lib/pingClient.ts), three ways, one server each:
 *
 * 1. `--cpu-prof`: the top self-time functions over `--duration` seconds
 *    (after a 1 s warm-up; start-up excluded), and the JS thread's busy
 *    time per round trip, for mpcache and for the bare echo
 *    (bench/lib/echo-router.ts), the stack's own cost;
 * 2. `--heap-prof`: the allocation sites of what is still live at exit;
 * 3. bench/ping/alloc-probe.ts: bytes allocated per PING over `--pings` PINGs
 *    (heap statistics deltas and allocation sampling) and its top sites, and
 *    the same for the bare echo (bench/lib/echo-router.ts), the stack's floor.
 *
 * Prints the three summaries; the profiles stay in `--out` (default: a
 * fresh directory under the OS's tmp) for Chrome DevTools. Not part of
 * `npm run bench`: a tool for reading where the PING path's time goes.
 */
import { mkdtempSync, readdirSync, readFileSync } from "node:fs"
import os from "node:os"
import path from "node:path"
import { parseArgs } from "node:util"
import { startLineChild, stopChild } from "../lib/children.ts"
import { ALLOC_PROBE_ARGV, measureAllocation } from "./allocWindow.ts"
import { pingLoop, type PingRun, type Responder } from "../lib/pingClient.ts"
import { cpuTop, formatTop, heapTop, type HeapProfile, type WindowUs } from "./profileTop.ts"
import { makeResources, runBench } from "../lib/resources.ts"
import { sleep } from "../lib/time.ts"
import { SERVE_FLAGS } from "./serveFlags.ts"

const { values } = parseArgs({
  options: {
    clients: { type: "string", default: "16" },
    duration: { type: "string", default: "8" },
    pings: { type: "string", default: "100000" },
    out: { type: "string" },
    parts: { type: "string", default: "cpu,heap,alloc" }
  }
})
const clients = Number(values.clients)
const durationS = Number(values.duration)
const pings = Number(values.pings)
const parts = new Set(values.parts.split(","))
const out = values.out ?? mkdtempSync(path.join(os.tmpdir(), "mpcache-ping-prof-"))
const READY = /MQ server listening on/
const resources = makeResources(`mpcache-prof-${process.pid}-${Date.now()}`, { stopTimeoutMs: 10_000, onSignal: "stop" })

const serveArgv = (endpoint: string): Array<string> => ["src/cli/main.ts", "serve", ...SERVE_FLAGS(endpoint)]

const serve = (nodeFlags: ReadonlyArray<string>, endpoint: string) =>
  startLineChild("mpcache", [...nodeFlags, ...serveArgv(endpoint)], resources.children)

const nowUs = (): number => Number(process.hrtime.bigint() / 1000n)

/** `clients` clients for `seconds` after a 1 s warm-up: the PINGs answered in the measured window, and the window. */
const load = async (endpoint: string, seconds: number, responder: Responder = "mpcache"): Promise<{ readonly pings: number; readonly window: WindowUs }> => {
  const run: PingRun = { measuring: false, stopped: false, latenciesUs: [] }
  const all = Promise.all(Array.from({ length: clients }, () => pingLoop(endpoint, run, responder)))
  await sleep(1000)
  run.measuring = true
  const fromUs = nowUs()
  await sleep(seconds * 1000)
  run.measuring = false
  const toUs = nowUs()
  run.stopped = true
  await all
  return { pings: run.latenciesUs.length, window: { fromUs, toUs } }
}

/** Runs a server with `--cpu-prof` under the load; prints its top self time inside the measured window. */
const profileCpu = async (name: string, argv: ReadonlyArray<string>, ready: RegExp, endpoint: string, responder: Responder): Promise<void> => {
  const dir = path.join(out, `cpu-${name}`)
  const child = startLineChild(name, ["--cpu-prof", "--cpu-prof-dir", dir, ...argv], resources.children)
  await child.waitFor(ready, 30_000)
  const { pings, window } = await load(endpoint, durationS, responder)
  await stopChild(child.process, 10_000)
  const c = cpuTop(JSON.parse(readFileSync(newest(dir, ".cpuprofile"), "utf8")), 20, window)
  process.stdout.write(
    `\n== CPU of ${name}, ${clients} clients, ${pings} round trips in ${durationS} s: JS thread busy ${c.busyMs.toFixed(0)} ms of ` +
      `${c.totalMs.toFixed(0)} ms = ${(c.busyMs * 1000 / pings).toFixed(1)} µs per round trip ==\n${formatTop(c.top, (ms) => `${ms.toFixed(0)} ms`)}\n`
  )
}

const newest = (dir: string, ext: string): string => {
  const files = readdirSync(dir).filter((f) => f.endsWith(ext)).sort()
  if (files.length === 0) throw new Error(`no ${ext} in ${dir}`)
  return path.join(dir, files.at(-1)!)
}

const main = async (): Promise<void> => {
  if (parts.has("cpu")) await cpuPart()
  if (parts.has("heap")) await heapPart()
  if (parts.has("alloc")) await allocPart()
  process.stdout.write(`\nprofiles in ${out}\n`)
}

const cpuPart = async (): Promise<void> => {
  const endpoint = resources.ipcEndpoint("cpu")
  await profileCpu("mpcache", serveArgv(endpoint), READY, endpoint, "mpcache")
  const echoEndpoint = resources.ipcEndpoint("cpu-echo")
  await profileCpu("echo", ["bench/lib/echo-router.ts", echoEndpoint], /echo router listening on/, echoEndpoint, "echo")
}

const heapPart = async (): Promise<void> => {
  const heapDir = path.join(out, "heap")
  const heapEndpoint = resources.ipcEndpoint("heap")
  const heap = serve(["--heap-prof", "--heap-prof-dir", heapDir], heapEndpoint)
  await heap.waitFor(READY, 30_000)
  await load(heapEndpoint, durationS / 2)
  await stopChild(heap.process, 10_000)
  const h = heapTop(JSON.parse(readFileSync(newest(heapDir, ".heapprofile"), "utf8")) as HeapProfile, 15)
  process.stdout.write(
    `\n== --heap-prof (live at exit): ${(h.totalBytes / 1e6).toFixed(1)} MB ==\n${formatTop(h.top, (b) => `${(b / 1024).toFixed(0)} KB`)}\n`
  )
}

const allocPart = async (): Promise<void> => {
  const allocEndpoint = resources.ipcEndpoint("alloc")
  const alloc = serve(ALLOC_PROBE_ARGV, allocEndpoint)
  await alloc.waitFor(READY, 30_000)
  const a = await measureAllocation(alloc, allocEndpoint, clients, pings)
  await stopChild(alloc.process, 10_000)
  process.stdout.write(
    `\n== allocated per PING over ${a.pings} PINGs: ${a.gcBytesPerPing.toFixed(0)} B (heap statistics deltas, ${a.gcs} GCs), ` +
      `${a.sampledBytesPerPing.toFixed(0)} B (sampling) ==\n` +
      `${formatTop(a.top.map((e) => ({ ...e, amount: e.amount / a.pings })), (b) => `${b.toFixed(0)} B`)}\n`
  )
  const echoEndpoint = resources.ipcEndpoint("echo")
  const echo = startLineChild("echo", [...ALLOC_PROBE_ARGV, "bench/lib/echo-router.ts", echoEndpoint], resources.children)
  await echo.waitFor(/echo router listening on/, 30_000)
  const e = await measureAllocation(echo, echoEndpoint, clients, pings, "echo")
  await stopChild(echo.process, 10_000)
  process.stdout.write(
    `\n== the bare echo, per round trip over ${e.pings}: ${e.gcBytesPerPing.toFixed(0)} B (heap statistics deltas), ` +
      `${e.sampledBytesPerPing.toFixed(0)} B (sampling) ==\n` +
      `${formatTop(e.top.map((t) => ({ ...t, amount: t.amount / e.pings })), (b) => `${b.toFixed(0)} B`)}\n`
  )
}

await runBench("profile-ping", main, resources)
