/**
 * Issue 24 items 4 and 12 end to end: the attacks themselves against a real
 * `mpcache serve`, with real shared memory and real memfds handed over the
 * descriptor socket; this test process is the attacker (and, for item 12,
 * the worker whose memory is sparse), worker-main.ts processes are the other
 * workers that must still be served.
 *
 * - Item 4, one REGISTER exhausting the process's maps: a REGISTER naming
 *   more segments than `--max-segments-per-register` is `overloaded` naming
 *   it and the server maps none of them (/proc/PID/maps); REGISTERs that
 *   each pass it but together would pass `--max-mappings` are refused the
 *   same way; another worker still registers, STOREs and RETRIEVEs byte for
 *   byte. Without flags the bounds derive from the vm.max_map_count the
 *   server read at start (status), and a flag beyond what the kernel allows
 *   exits 2 naming it.
 * - Item 12, sparse memfds: a worker registers 2 GiB of memfds that were only
 *   ftruncated: after the REGISTER (and a status poll) not one page is
 *   allocated to them (fstat st_blocks) nor resident in the server
 *   (/proc/PID/smaps); a STORE and a RETRIEVE then allocate and map exactly
 *   the blocks they copied. A second 2 GiB REGISTER passes
 *   `--max-mapped-bytes` (no CURVE) and is `overloaded` naming it.
 */
import { randomUUID } from "node:crypto"
import { fstatSync, readFileSync } from "node:fs"
import { totalmem } from "node:os"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { ClientLive } from "../../src/layers/Client.ts"
import { NativeMemory } from "../../src/native/Native.ts"
import { makeInstanceId } from "../../src/schema/InstanceId.ts"
import { Ping, RegisterKvCache } from "../../src/schema/Op.ts"
import type { TensorDescriptor } from "../../src/schema/TensorDescriptor.ts"
import { Overloaded } from "../../src/schema/WireError.ts"
import { makeMqClient } from "../../src/services/client/MqClient.ts"
import { makePagedKvCache } from "../../src/services/client/PagedKvCache.ts"
import { makeSchedulerAdapter } from "../../src/services/client/SchedulerAdapter.ts"
import { makeWorkerAdapter } from "../../src/services/client/WorkerAdapter.ts"
import { runCli, runJsonScript } from "../support/Cli.ts"
import { verifyTokens, writeTokens } from "../support/KvData.ts"
import { eventually, ipcEndpoint, startServer, statusOf } from "../support/LiveFleet.ts"
import { mapsOf, memfdMaps, memfdRssKiB } from "../support/ProcMaps.ts"
import { childScript } from "../support/ChildScripts.ts"

const WORKER = childScript("worker-main")
/** worker-main.ts's cache: 4 layer segments of 2 × 64 blocks × 16 tokens × 2 × 16 bf16 = 64 KiB each. */
const WORKER_BYTES = 4 * 2 * 64 * 16 * 2 * 16 * 2

const client = (endpoint: string) => makeMqClient({ endpoint, requestTimeoutMs: 10_000, lingerMs: 0 })

/** A one-page cpu_shm descriptor of segment `name`: one layer of 2 × 1 block × 16 tokens × 1 × 8 fp16. */
const onePage = (name: string): TensorDescriptor => ({
  kind: "cpu_shm",
  shm_name: name,
  device_uuid: "cpu",
  nbytes: 4096,
  dtype: "float16",
  shape: [2, 1, 16, 1, 8],
  stride: [128, 128, 8, 8, 1],
  storage_offset: 0
})

/**
 * Another worker, in processes of its own: worker-main STOREs 5 chunks, a second one RETRIEVEs them and checks
 * every byte. Each leaves by UNREGISTER; the next starts once the server has released its mappings (the event:
 * status back at the mappings held before), since the room left for them is exactly one worker's.
 */
const anotherWorkerIsServed = (endpoint: string, httpPort: number, requestId: string) =>
  Effect.gen(function*() {
    const held = (yield* statusOf(httpPort)).mapping_limits.mappings
    const released = eventually(Effect.map(statusOf(httpPort), (s) => s.mapping_limits.mappings), (n) => n === held, 30_000)
    const blockIds = Array.from({ length: 20 }, (_, i) => i + 1)
    const args = { endpoint, seed: 24, tokenCount: 330, requestId }
    const stored = yield* runJsonScript(WORKER, { ...args, mode: "store", namePrefix: `mpcache-maps-w-${randomUUID()}`, blockIds })
    assert.strictEqual(stored.code, 0, stored.stderr)
    assert.strictEqual(stored.result["ok"], true)
    assert.strictEqual(yield* released, held)
    const retrieved = yield* runJsonScript(WORKER, { ...args, mode: "retrieve", namePrefix: `mpcache-maps-r-${randomUUID()}`, blockIds: blockIds.map((b) => b + 30) })
    assert.strictEqual(retrieved.code, 0, retrieved.stderr)
    assert.deepStrictEqual([retrieved.result["ok"], retrieved.result["hitTokens"], retrieved.result["mismatches"]], [true, 320, []])
    assert.strictEqual(yield* released, held)
  })

/** The failure of `e`, which must be an Overloaded: its flag (`field`), `actual` and message. */
const refusal = <A, E, R>(e: Effect.Effect<A, E, R>) =>
  Effect.map(Effect.flip(e), (x) => {
    assert.instanceOf(x, Overloaded, String(x))
    const o = x as Overloaded
    return { field: o.field, actual: o.actual, message: o.message }
  })

const kernelMaxMapCount = () => Number(readFileSync("/proc/sys/vm/max_map_count", "utf8").trim())

describe("item 4: one REGISTER exhausts the process's memory maps", () => {
  it.live("more segments than --max-segments-per-register, then more mappings than --max-mappings: overloaded naming the flag, nothing mapped; another worker is served", () =>
    Effect.scoped(Effect.gen(function*() {
      const endpoint = ipcEndpoint()
      const flags = ["--l1-size-gb", "0.25", "--no-l1-prefault", "--max-segments-per-register", "8", "--max-mappings", "12"]
      const { server, httpPort } = yield* startServer(endpoint, flags, 60_000)
      const serverPid = server.child.pid!
      const native = yield* NativeMemory
      // The attacker's segments: real, one page each (the attack took 64,645 of them).
      const prefix = `mpcache-maps-attack-${randomUUID().slice(0, 8)}`
      const names = Array.from({ length: 9 }, (_, i) => `${prefix}-${i}`)
      for (const name of names) yield* Effect.acquireRelease(native.createSegment(name, 4096), () => Effect.ignore(native.unlinkSegment(name)))
      const attacker = yield* client(endpoint)
      const register = (id: number, segments: ReadonlyArray<string>) =>
        attacker.request(RegisterKvCache, [makeInstanceId(id), segments.map(onePage), "maps-e2e", 1, "vllm", {}, []])

      // One REGISTER of 9 segments: refused before anything is mapped.
      assert.deepStrictEqual(yield* refusal(register(1, names)), {
        field: "max-segments-per-register",
        actual: "more than 8 (9 descriptors)",
        message:
          "register_kv_cache: instance 1: kv_caches names more than 8 distinct segments, over --max-segments-per-register (8); nothing was mapped: let layers share segments (one segment with offsets, DESIGN §3.2) or raise the limit"
      })
      assert.deepStrictEqual(mapsOf(serverPid, `/dev/shm/${prefix}`), [])

      // 8 of them: allowed. 8 more for another instance (the same segments, mapped again): past --max-mappings.
      yield* register(1, names.slice(0, 8))
      assert.strictEqual(mapsOf(serverPid, `/dev/shm/${prefix}`).length, 8)
      assert.deepStrictEqual(yield* refusal(register(2, names.slice(1))), {
        field: "max-mappings",
        actual: "8 held + 8 asked",
        message:
          "register_kv_cache: instance 2: mapping its 8 segment(s) would make 16 mappings of worker memory, over --max-mappings (12; 8 held now); nothing was mapped: retry once other instances unregister, or raise the limit"
      })
      assert.strictEqual(mapsOf(serverPid, `/dev/shm/${prefix}`).length, 8)

      // Everyone else is still served: a worker of 4 segments registers (8 + 4 = 12), stores and retrieves byte for byte.
      yield* anotherWorkerIsServed(endpoint, httpPort, "maps-4")
      assert.strictEqual(yield* attacker.request(Ping, [null]), true)
      const status = yield* statusOf(httpPort)
      assert.deepStrictEqual({ ...status.mapping_limits, process_maps: null }, {
        kernel_max_map_count: kernelMaxMapCount(),
        kernel_max_map_count_source: "kernel",
        process_maps: null,
        max_mappings: 12,
        mappings: 8,
        max_segments_per_register: 8,
        max_mapped_bytes: Math.floor(totalmem() / 2),
        host_mapped_bytes: 8 * 4096,
        device_mapped_bytes: 0,
        refused: { max_segments_per_register: 1, max_mappings: 1, max_mapped_bytes: 0 }
      })
      assert.isAbove(status.mapping_limits.process_maps!, 8)
      yield* server.waitForStderr(/over --max-segments-per-register \(8\); nothing was mapped/)
    }).pipe(Effect.provide(ClientLive))), 180_000)

  it.live("without flags the bounds derive from the vm.max_map_count read at start; a flag beyond what the kernel allows exits 2 naming it", () =>
    Effect.scoped(Effect.gen(function*() {
      const kernel = kernelMaxMapCount()
      const { httpPort } = yield* startServer(ipcEndpoint(), ["--l1-size-gb", "0.25", "--no-l1-prefault"], 60_000)
      const limits = (yield* statusOf(httpPort)).mapping_limits
      assert.deepStrictEqual(
        [limits.kernel_max_map_count, limits.kernel_max_map_count_source, limits.max_mappings, limits.max_segments_per_register, limits.max_mapped_bytes, limits.mappings],
        [kernel, "kernel", Math.floor(kernel / 2), 1024, Math.floor(totalmem() / 2), 0]
      )
      // An idle server's own maps leave the room the defaults promise.
      assert.isBelow(limits.process_maps!, kernel - limits.max_mappings)

      const allowed = Math.max(Math.floor(kernel / 2), kernel - 16384)
      const over = yield* runCli(["serve", "--endpoint", ipcEndpoint(), "--http-port", "0", "--max-mappings", String(allowed + 1)])
      assert.strictEqual(over.code, 2)
      assert.include(
        over.stderr,
        `--max-mappings: must be an integer from 1 to ${allowed} (got ${allowed + 1}): vm.max_map_count is ${kernel} (read at start from /proc/sys/vm/max_map_count)`
      )
      const perRegister = yield* runCli(["serve", "--endpoint", ipcEndpoint(), "--http-port", "0", "--max-mappings", "10", "--max-segments-per-register", "11"])
      assert.strictEqual(perRegister.code, 2)
      assert.include(perRegister.stderr, "--max-segments-per-register: must be an integer from 1 to --max-mappings (10) (got 11)")
    })), 120_000)
})

describe("item 12: sparse memfds make the server allocate the worker's memory", () => {
  // 2 layers × (K, V) × 256 blocks of 16 tokens × 64 heads × 1024 bf16: a block of K or V is 2 MiB (whole pages,
  // huge ones too), a layer 1 GiB, the cache 2 GiB; one chunk (64 tokens, LiveFleet's --chunk-size) is 4 blocks.
  const MiB = 1024 * 1024
  const BLOCK = 2 * MiB
  const GiB = 1024 * MiB
  const sparseCache = (namePrefix: string) =>
    makePagedKvCache({ backing: "cpu_memfd", namePrefix, numLayers: 2, numBlocks: 256, blockSizeTokens: 16, numHeads: 64, headSize: 1024, dtype: "bfloat16" })
  /** Bytes allocated to each memfd of `cache` (fstat st_blocks × 512): what anyone, server or worker, has populated. */
  const allocated = (cache: { readonly memfds: ReadonlyArray<number> }) => cache.memfds.map((fd) => fstatSync(fd).blocks * 512)

  it.live("2 GiB of ftruncated memfds: nothing allocated by REGISTER; STORE and RETRIEVE allocate exactly their blocks; a REGISTER past --max-mapped-bytes is overloaded; another worker is served", () =>
    Effect.scoped(Effect.gen(function*() {
      const endpoint = ipcEndpoint()
      // Room for the sparse cache and worker-main's 256 KiB, not one byte more.
      const maxMappedBytes = 2 * GiB + WORKER_BYTES
      const flags = ["--l1-size-gb", "0.25", "--no-l1-prefault", "--max-mapped-bytes", String(maxMappedBytes)]
      const { server, httpPort } = yield* startServer(endpoint, flags, 60_000)
      const serverPid = server.child.pid!
      const prefix = `mpcache-maps-sparse-${randomUUID().slice(0, 8)}`
      const cache = yield* sparseCache(prefix)
      assert.deepStrictEqual(allocated(cache), [0, 0])
      const worker = yield* makeWorkerAdapter({ endpoint, modelName: "maps-sparse", worldSize: 1, kvRank: 0, requestTimeoutMs: 30_000 })
      yield* worker.registerPagedKvCache(cache)
      // The events: the REGISTER's reply, then a status that lists the instance with its 2 GiB mapped.
      const registered = yield* statusOf(httpPort)
      assert.isTrue(registered.instances.some((i) => i.instance_id === worker.instanceId.toString()))
      assert.strictEqual(registered.mapping_limits.host_mapped_bytes, 2 * GiB)
      assert.strictEqual(memfdMaps(serverPid, prefix).length, 2)
      assert.deepStrictEqual(allocated(cache), [0, 0], "REGISTER allocated none of the worker's pages")
      assert.strictEqual(memfdRssKiB(serverPid, prefix), 0, "the server maps none of them in")

      // A second 2 GiB of sparse memfds: past --max-mapped-bytes, without CURVE.
      const secondPrefix = `mpcache-maps-sparse2-${randomUUID().slice(0, 8)}`
      const second = yield* sparseCache(secondPrefix)
      const greedy = yield* makeWorkerAdapter({ endpoint, modelName: "maps-sparse", worldSize: 1, kvRank: 0 })
      const refused = yield* refusal(greedy.registerPagedKvCache(second))
      assert.deepStrictEqual(refused, {
        field: "max-mapped-bytes",
        actual: `${2 * GiB} held + ${2 * GiB} asked`,
        message: `register_kv_cache: instance ${greedy.instanceId}: its host memory is ${2 * GiB} bytes; with the ${
          2 * GiB
        } bytes of worker memory mapped now that is over --max-mapped-bytes (${maxMappedBytes}); nothing was mapped: retry once other instances unregister, or raise the limit`
      })
      assert.deepStrictEqual(memfdMaps(serverPid, secondPrefix), [])
      assert.deepStrictEqual(allocated(second), [0, 0])

      // Another worker (256 KiB: exactly the room left) registers, stores and retrieves byte for byte.
      yield* anotherWorkerIsServed(endpoint, httpPort, "maps-12")

      // The sparse worker writes 4 blocks (K and V, both layers: 16 MiB per memfd, its own allocation) and STOREs
      // them: the server reads them, allocates nothing.
      const tokenIds = Array.from({ length: 64 }, (_, i) => (i * 13 + 5) % 32000)
      yield* writeTokens(cache, 7, [1, 2, 3, 4])
      assert.deepStrictEqual(allocated(cache), [8 * BLOCK, 8 * BLOCK])
      assert.isTrue(yield* worker.store({ requestId: "sparse-s", tokenIds, start: 0, end: 64, blockIds: [1, 2, 3, 4] }))
      assert.deepStrictEqual(allocated(cache), [8 * BLOCK, 8 * BLOCK], "a STORE populates nothing")
      // RETRIEVE into blocks 101–104: exactly those are allocated, by the server's copy, and hold the bytes.
      const scheduler = yield* makeSchedulerAdapter({ endpoint, modelName: "maps-sparse", worldSize: 1 })
      assert.strictEqual(yield* scheduler.lookup("sparse-r", tokenIds), 64)
      assert.isTrue(yield* worker.retrieve({ requestId: "sparse-r", tokenIds, start: 0, end: 64, blockIds: [101, 102, 103, 104] }))
      yield* scheduler.endSession("sparse-r")
      assert.deepStrictEqual(allocated(cache), [16 * BLOCK, 16 * BLOCK])
      assert.deepStrictEqual(yield* verifyTokens(cache, 7, [101, 102, 103, 104]), [])
      // The server has mapped in exactly the pages it copied: 4 blocks read and 4 written, K and V, 2 layers.
      assert.strictEqual(memfdRssKiB(serverPid, prefix), (2 * 2 * 8 * BLOCK) / 1024)

      const status = yield* statusOf(httpPort)
      assert.deepStrictEqual(
        [status.mapping_limits.host_mapped_bytes, status.mapping_limits.mappings, status.mapping_limits.refused],
        [2 * GiB, 2, { max_segments_per_register: 0, max_mappings: 0, max_mapped_bytes: 1 }]
      )
    }).pipe(Effect.provide(ClientLive))), 180_000)
})
