#!/usr/bin/env node
/**
 * GPU end-to-end check of the cuda_ipc data path and of reaping (DESIGN §4,
 * §5), with real processes:
 *
 *   1. starts `mpcache serve` (ipc endpoint, --worker-disconnect-grace-seconds 3);
 *   2. this process (the retriever, B) puts a paged KV cache in device memory
 *      (cudaMalloc + cudaIpcGetMemHandle, src/native/CudaExport.ts) and
 *      registers it; the server opens it with cudaIpcOpenMemHandle. Baseline:
 *      cudaMemGetInfo's free bytes now;
 *   2b. a second adapter REGISTERs B's descriptors with a zeroed IPC handle: the
 *      driver refuses it (cudaIpcOpenMemHandle), the reply is invalid_argument
 *      naming the instance, kv_caches[0], the device and the CUDA error; the
 *      server keeps nothing of it (not in /api/status, no new mapping) and
 *      counts it (mpcache_guarded_faults_total{kind="cuda_handle_refused"},
 *      /api/status fault_guard.cuda_faults; issue 13 item 4);
 *   3. spawns the exporter (A, this script with --role exporter): its own
 *      device KV cache, registered, deterministic KV bytes written, STOREd;
 *   4. B LOOKUPs and RETRIEVEs those chunks into other blocks of its own
 *      device memory and compares every byte;
 *   5. SIGKILLs A: its allocation must stay in use (the server still holds
 *      the IPC mapping), then the server reaps A (disconnect) and closes the
 *      handle: device memory back to the baseline (cudaMemGetInfo), A gone
 *      from /api/status, the server's open mappings back to what they were.
 *
 * On a GPU host:            npx node scripts/gpu-e2e.ts [--device GPU-…] [--tolerance-mib 32]
 * Against the fake libcudart (no GPU; test/support/fakecudart, built by the
 * tests or by hand with `cc -shared -fPIC -o /tmp/libfakecudart.so
 * test/support/fakecudart/fakecudart.c -lpthread -lrt`):
 *                           MPCACHE_CUDART=/tmp/libfakecudart.so npx node scripts/gpu-e2e.ts
 * (MPCACHE_CUDART is inherited by the server and the exporter.)
 *
 * Prints one JSON line with the measurements; exits 0 when every check
 * holds, 1 when one fails, 2 when there is no CUDA backend.
 */
import { type ChildProcess, spawn } from "node:child_process"
import { randomUUID } from "node:crypto"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { fileURLToPath } from "node:url"
import { Cause, Effect, Exit, Schedule } from "effect"
import { InvalidArgument } from "../src/schema/WireError.ts"
import { ClientLive } from "../src/layers/Client.ts"
import { makeCudaPagedKvCache } from "../src/services/client/CudaPagedKvCache.ts"
import { NativeMemory } from "../src/native/Native.ts"
import type { PagedKvCache } from "../src/services/client/PagedKvCache.ts"
import { makeSchedulerAdapter } from "../src/services/client/SchedulerAdapter.ts"
import { makeWorkerAdapter } from "../src/services/client/WorkerAdapter.ts"

const SELF = fileURLToPath(import.meta.url)
const CLI = fileURLToPath(new URL("../src/cli/main.ts", import.meta.url))
const MiB = 1024 * 1024

const argValue = (name: string): string | undefined => {
  const i = process.argv.indexOf(name)
  return i >= 0 ? process.argv[i + 1] : undefined
}

// 8 layers × [2, 512 blocks, 16 tokens, 8 heads, 128] bf16: 32 MiB per layer, 256 MiB per cache — well
// above cudaMemGetInfo's noise (the default tolerance is 32 MiB), so a handle left open shows.
const geometry = { numLayers: 8, numBlocks: 512, blockSizeTokens: 16, numHeads: 8, headSize: 128, dtype: "bfloat16" as const }
const CHUNK = 64
const MODEL = "gpu-e2e"
const tokenIds = Array.from({ length: 330 }, (_, i) => (i * 31 + 7) % 32000)
const SEED = 42

/** Bytes of tokens [t0, t0 + block_size) of one layer's K or V (the same rule as test/support/KvData.ts). */
const blockContent = (cache: PagedKvCache, seed: number, layer: number, kv: 0 | 1, t0: number): Buffer => {
  const g = cache.geometry
  const tokenBytes = g.blockBytes / g.blockSizeTokens
  const out = Buffer.alloc(g.blockBytes)
  for (let t = 0; t < g.blockSizeTokens; t++) {
    let x = (seed * 2654435761 + layer * 40503 + kv * 7919 + (t0 + t) * 104729) >>> 0
    for (let b = 0; b < tokenBytes; b++) {
      x = (x * 1103515245 + 12345) >>> 0
      out[t * tokenBytes + b] = x >>> 24
    }
  }
  return out
}

const layersAndKv = Array.from({ length: geometry.numLayers }, (_, l) => [[l, 0], [l, 1]] as const).flat()

const writeTokens = (cache: PagedKvCache, seed: number, blockIds: ReadonlyArray<number>) =>
  Effect.forEach(blockIds, (blockId, j) =>
    Effect.forEach(layersAndKv, ([l, kv]) =>
      cache.writeBlock(l, kv, blockId, blockContent(cache, seed, l, kv, j * geometry.blockSizeTokens)), { discard: true }), {
    discard: true
  })

const verifyTokens = (cache: PagedKvCache, seed: number, blockIds: ReadonlyArray<number>) =>
  Effect.gen(function*() {
    const bad: Array<string> = []
    for (let j = 0; j < blockIds.length; j++) {
      for (const [l, kv] of layersAndKv) {
        const got = yield* cache.readBlock(l, kv, blockIds[j]!)
        if (!got.equals(blockContent(cache, seed, l, kv, j * geometry.blockSizeTokens))) bad.push(`${j}/${l}/${kv}`)
      }
    }
    return bad
  })

// ---------------------------------------------------------------------------
// exporter (A): register, write, store, then wait to be killed
// ---------------------------------------------------------------------------

const exporter = (endpoint: string, deviceUuid: string, blockIds: ReadonlyArray<number>) =>
  Effect.gen(function*() {
    const cache = yield* makeCudaPagedKvCache({ ...geometry, deviceUuid })
    const worker = yield* makeWorkerAdapter({ endpoint, modelName: MODEL, worldSize: 1, kvRank: 0, heartbeatIntervalMs: 1_000 })
    yield* worker.registerKvCaches(cache.descriptors)
    yield* writeTokens(cache, SEED, blockIds)
    const end = Math.floor(tokenIds.length / worker.chunkSizeTokens) * worker.chunkSizeTokens
    const ok = yield* worker.store({ requestId: "gpu-e2e-store", tokenIds, start: 0, end, blockIds })
    process.stdout.write(
      `${JSON.stringify({ event: "stored", ok, instanceId: worker.instanceId.toString(), pid: process.pid, bytes: cache.geometry.blockBytes * 2 * geometry.numBlocks * geometry.numLayers })}\n`
    )
    return yield* Effect.never
  })

// ---------------------------------------------------------------------------
// orchestrator: server, B, A, checks
// ---------------------------------------------------------------------------

interface Child {
  readonly child: ChildProcess
  readonly stdout: () => string
  readonly stderr: () => string
}

const startChild = (args: ReadonlyArray<string>): Child => {
  const child = spawn(process.execPath, args, { stdio: ["ignore", "pipe", "pipe"] })
  let out = ""
  let err = ""
  child.stdout!.on("data", (d: Buffer) => (out += d.toString()))
  child.stderr!.on("data", (d: Buffer) => (err += d.toString()))
  return { child, stdout: () => out, stderr: () => err }
}

const waitFor = (what: string, read: () => string, pattern: RegExp, timeoutMs = 60_000) =>
  Effect.promise(() =>
    new Promise<RegExpMatchArray>((resolve, reject) => {
      const started = Date.now()
      const poll = () => {
        const m = read().match(pattern)
        if (m) return resolve(m)
        if (Date.now() - started > timeoutMs) return reject(new Error(`timed out after ${timeoutMs} ms waiting for ${what} (${pattern})`))
        setTimeout(poll, 50)
      }
      poll()
    })
  )

const getJson = (url: string) => Effect.promise(() => fetch(url).then((r) => r.json() as Promise<Record<string, unknown>>))

class CheckFailed extends Error {}

const check = (ok: boolean, message: string): Effect.Effect<void, CheckFailed> =>
  ok ? Effect.void : Effect.fail(new CheckFailed(message))

/** Polls `read` every 100 ms until `holds`, at most `timeoutMs`; returns the last value. */
const pollUntil = <A>(read: Effect.Effect<A, unknown>, holds: (a: A) => boolean, timeoutMs: number) =>
  read.pipe(
    Effect.repeat({ schedule: Schedule.spaced("100 millis"), until: holds }),
    Effect.timeoutOrElse({ duration: `${timeoutMs} millis`, orElse: () => read })
  )

const orchestrate = Effect.gen(function*() {
  const native = yield* NativeMemory
  const info = yield* native.cudaBackend()
  if (!info.available) {
    process.stderr.write(`gpu-e2e: CUDA IPC backend not available on this host (${info.reason})\n`)
    return process.exit(2)
  }
  const deviceUuid = argValue("--device") ?? info.devices[0]!.uuid
  const toleranceBytes = Number(argValue("--tolerance-mib") ?? "32") * MiB
  const endpoint = `ipc://${join(tmpdir(), `mpcache-gpu-e2e-${randomUUID()}.sock`)}`

  // 1. server
  const server = startChild([CLI, "serve", "--endpoint", endpoint, "--http-port", "0", "--chunk-size", String(CHUNK), "--worker-disconnect-grace-seconds", "3"])
  // Last finalizer to run: SIGTERM, and wait (10 s at most) for the server's own shutdown to finish.
  yield* Effect.addFinalizer(() =>
    Effect.promise(() =>
      new Promise<void>((resolve) => {
        if (server.child.exitCode !== null || server.child.signalCode !== null) return resolve()
        const timer = setTimeout(() => {
          server.child.kill("SIGKILL")
          resolve()
        }, 10_000)
        server.child.once("exit", () => {
          clearTimeout(timer)
          resolve()
        })
        server.child.kill("SIGTERM")
      })
    )
  )
  const [, port] = yield* waitFor("the server's HTTP frontend", server.stderr, /HTTP frontend listening on http:\/\/127\.0\.0\.1:(\d+)/)
  yield* waitFor("the server's MQ socket", server.stderr, /MQ server listening on/)
  const status = getJson(`http://127.0.0.1:${port}/api/status`)
  const instanceIds = Effect.map(status, (s) => (s["instances"] as ReadonlyArray<{ instance_id: string }>).map((i) => i.instance_id))
  const openMappings = Effect.map(status, (s) => (s["native"] as { open_mappings: number }).open_mappings)
  const cudaFaults = Effect.map(status, (s) => (s["fault_guard"] as { cuda_faults: number }).cuda_faults)
  /** mpcache_guarded_faults_total{kind="cuda_handle_refused",call="cudaIpcOpenMemHandle"} from /metrics (0 when absent). */
  const refusedMetric = Effect.promise(() => fetch(`http://127.0.0.1:${port}/metrics`).then((r) => r.text())).pipe(
    Effect.map((text) => {
      const line = text.split("\n").find((l) =>
        l.startsWith("mpcache_guarded_faults_total{") && l.includes(`kind="cuda_handle_refused"`) && l.includes(`call="cudaIpcOpenMemHandle"`)
      )
      return line === undefined ? 0 : Number(line.slice(line.lastIndexOf(" ") + 1))
    })
  )

  // 2. B: registered first, so the server's CUDA context exists before the baseline.
  const b = yield* makeCudaPagedKvCache({ ...geometry, deviceUuid })
  const workerB = yield* makeWorkerAdapter({ endpoint, modelName: MODEL, worldSize: 1, kvRank: 0, heartbeatIntervalMs: 1_000 })
  yield* workerB.registerKvCaches(b.descriptors)
  const baseline = (yield* native.cudaMemInfo(deviceUuid)).free
  const mappingsBefore = yield* openMappings

  // 2b. A handle the driver refuses: 64 zero bytes name no allocation (issue 13 item 4).
  const refusing = yield* makeWorkerAdapter({ endpoint, modelName: MODEL, worldSize: 1, kvRank: 0 })
  const refusedAt = Date.now()
  const refusal = yield* Effect.flip(refusing.registerKvCaches(b.descriptors.map((d) => ({ ...d, ipc_handle: new Uint8Array(64) }))))
  const refusedMs = Date.now() - refusedAt
  const refusedId = refusing.instanceId.toString()
  yield* check(refusal instanceof InvalidArgument, `a zeroed IPC handle was answered ${refusal._tag}: ${refusal.message}; expected invalid_argument`)
  const refused = refusal as InvalidArgument
  yield* check(
    refused.op === "register_kv_cache" && refused.instance_id === refusedId && refused.field === "kv_caches[0]" &&
      (refused.actual ?? "").startsWith("cudaIpcOpenMemHandle failed with cudaError") &&
      refused.message.startsWith(`register_kv_cache: instance ${refusedId}: kv_caches[0] (cuda_ipc on device ${deviceUuid}): the CUDA driver refused the IPC handle: cudaIpcOpenMemHandle failed with `),
    `the refusal of a zeroed IPC handle does not name the instance, the descriptor, the device and the CUDA error: ${JSON.stringify({ ...refused, message: refused.message })}`
  )
  yield* check(!(yield* instanceIds).includes(refusedId), `the server lists the instance ${refusedId} whose handle it refused`)
  const mappingsAfterRefusal = yield* openMappings
  yield* check(mappingsAfterRefusal === mappingsBefore, `the server holds ${mappingsAfterRefusal} mappings after the refusal; ${mappingsBefore} before`)
  const refusedCount = { status: yield* cudaFaults, metric: yield* refusedMetric }
  yield* check(
    refusedCount.status === 1 && refusedCount.metric === 1,
    `after one refused handle: /api/status fault_guard.cuda_faults = ${refusedCount.status}, mpcache_guarded_faults_total{kind="cuda_handle_refused"} = ${refusedCount.metric}; expected 1 and 1`
  )

  // 3. A
  const blocksA = Array.from({ length: 20 }, (_, i) => i + 1)
  const a = startChild([SELF, "--role", "exporter", JSON.stringify({ endpoint, deviceUuid, blockIds: blocksA })])
  yield* Effect.addFinalizer(() => Effect.sync(() => a.child.exitCode === null && a.child.kill("SIGKILL")))
  const [stored] = yield* waitFor("the exporter's store", () => a.stdout() + a.stderr(), /\{"event":"stored".*\}/, 120_000)
  const storedEvent = JSON.parse(stored!) as { ok: boolean; instanceId: string; pid: number; bytes: number }
  yield* check(storedEvent.ok, "the exporter's STORE answered ok = false")
  yield* check(toleranceBytes < storedEvent.bytes / 2, `--tolerance-mib must stay below half the exporter's ${storedEvent.bytes / MiB} MiB`)
  const idsWithA = yield* instanceIds
  yield* check(idsWithA.includes(storedEvent.instanceId), `the server does not list the exporter ${storedEvent.instanceId}: ${idsWithA.join(", ")}`)

  // 4. B retrieves into other blocks and compares
  const scheduler = yield* makeSchedulerAdapter({ endpoint, modelName: MODEL, worldSize: 1 })
  const hitTokens = yield* scheduler.lookup("gpu-e2e-retrieve", tokenIds)
  const blocksB = Array.from({ length: hitTokens / geometry.blockSizeTokens }, (_, i) => geometry.numBlocks - 1 - i)
  const retrieved = yield* workerB.retrieve({ requestId: "gpu-e2e-retrieve", tokenIds, start: 0, end: hitTokens, blockIds: blocksB })
  yield* scheduler.endSession("gpu-e2e-retrieve")
  const mismatches = yield* verifyTokens(b, SEED, blocksB)
  yield* check(hitTokens === 320, `LOOKUP hit ${hitTokens} tokens; expected 320 (5 chunks of ${CHUNK})`)
  yield* check(retrieved, "the RETRIEVE answered ok = false")
  yield* check(mismatches.length === 0, `retrieved bytes differ in (block, layer, kv) ${mismatches.slice(0, 10).join(" ")}`)

  // 5. SIGKILL A: still held by the server, then reaped and released
  const withA = (yield* native.cudaMemInfo(deviceUuid)).free
  a.child.kill("SIGKILL")
  yield* Effect.promise(() => new Promise<void>((resolve) => (a.child.exitCode !== null || a.child.signalCode !== null ? resolve() : a.child.once("exit", () => resolve()))))
  const afterKill = (yield* native.cudaMemInfo(deviceUuid)).free
  yield* check(
    baseline - afterKill >= storedEvent.bytes / 2,
    `right after SIGKILL, ${(baseline - afterKill) / MiB} MiB below the baseline; expected the exporter's ${storedEvent.bytes / MiB} MiB still held by the server's IPC mapping`
  )
  const reapedLine = yield* waitFor("the reap", server.stderr, new RegExp(`reaped instance ${storedEvent.instanceId}\\b[^\\n]*`), 30_000)
  const idsAfter = yield* pollUntil(instanceIds, (ids) => !ids.includes(storedEvent.instanceId), 10_000)
  yield* check(!idsAfter.includes(storedEvent.instanceId), `the server still lists the exporter after the reap: ${idsAfter.join(", ")}`)
  const mappingsAfter = yield* pollUntil(openMappings, (n) => n === mappingsBefore, 10_000)
  yield* check(mappingsAfter === mappingsBefore, `the server holds ${mappingsAfter} mappings after the reap; ${mappingsBefore} before the exporter came`)
  const freeAfter = yield* pollUntil(
    Effect.map(native.cudaMemInfo(deviceUuid), (m) => m.free),
    (free) => free >= baseline - toleranceBytes,
    30_000
  )
  yield* check(
    freeAfter >= baseline - toleranceBytes,
    `device memory did not come back: ${(baseline - freeAfter) / MiB} MiB below the baseline after the reap (tolerance ${toleranceBytes / MiB} MiB)`
  )

  const result = {
    ok: true,
    library: info.library,
    device: deviceUuid,
    exporterBytes: storedEvent.bytes,
    hitTokens,
    mismatches: mismatches.length,
    refusedHandle: { message: refused.message, actual: refused.actual, ms: refusedMs, counted: refusedCount },
    freeBytes: { baseline, withExporter: withA, afterKill, afterReap: freeAfter },
    serverMappings: { before: mappingsBefore, afterReap: mappingsAfter },
    reaped: reapedLine[0]
  }
  process.stdout.write(`${JSON.stringify(result)}\n`)
})

const role = argValue("--role")
const program = role === "exporter"
  ? Effect.suspend(() => {
    const args = JSON.parse(process.argv[process.argv.indexOf("--role") + 2] ?? "{}") as {
      endpoint: string
      deviceUuid: string
      blockIds: ReadonlyArray<number>
    }
    return exporter(args.endpoint, args.deviceUuid, args.blockIds)
  })
  : orchestrate

Effect.runPromiseExit(program.pipe(Effect.scoped, Effect.provide(ClientLive))).then((exit) => {
  if (Exit.isSuccess(exit)) return process.exit(0)
  const error = Cause.squash(exit.cause)
  const why = error instanceof CheckFailed ? error.message : Cause.pretty(exit.cause)
  process.stderr.write(`gpu-e2e${role === "exporter" ? " exporter" : ""}: FAILED: ${why}\n`)
  process.exit(1)
})
