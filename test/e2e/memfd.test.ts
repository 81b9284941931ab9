/**
 * Memory handed over, not named (issue 13 item 2) end to end: a real
 * `mpcache serve`, real worker processes, real memfds passed over the real
 * descriptor socket (SCM_RIGHTS), real SIGKILL. What is checked:
 *
 * - STORE and RETRIEVE over cpu_memfd are byte-exact across two processes,
 *   and nothing appears in /dev/shm; /api/status shows the sender's pid/uid
 *   and the seals; GET_SERVER_INFO names the 0600 socket, removed at shutdown.
 * - A SIGKILLed worker's 256 MiB: the memfds' own allocated pages (fstat
 *   st_blocks, not the machine-wide Shmem that every other process moves)
 *   are 256 MiB while it lives; after the reap the server maps none of it and
 *   no process of the machine maps or holds it, so the kernel has freed it
 *   (memfd_create(2): the memory goes when the last reference does).
 * - Tokens: a replay is refused; a token used on another ZeroMQ connection,
 *   or for another instance, is refused and stays usable by its owner; a
 *   connection that closes has its pending descriptors closed.
 * - An unsealed memfd: refused under --require-sealed-memfd; without it,
 *   shrinking it is caught by the fault guard (the STORE's error, the server
 *   alive).
 * - Descriptors passed and never registered: the server closes them after
 *   --fd-token-ttl-seconds (its /proc/<pid>/fd).
 */
import { randomUUID } from "node:crypto"
import { existsSync, readdirSync, statSync } from "node:fs"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Exit, Scope } from "effect"
import { ZmqSocketsLive } from "../../src/layers/Zmq.ts"
import { createMemfd, KV_SEALS, sendFds } from "../../src/native/FdPassing.ts"
import { pack, unpack } from "../../src/schema/Frame.ts"
import { makeInstanceId } from "../../src/schema/InstanceId.ts"
import { GetServerInfo, Ping, RegisterKvCache } from "../../src/schema/Op.ts"
import type { TensorDescriptor } from "../../src/schema/TensorDescriptor.ts"
import { makeMqClient, type MqClientShape } from "../../src/services/client/MqClient.ts"
import { runCli, runJsonScript, startScript } from "../support/Cli.ts"
import { eventually, ipcEndpoint, startServer, statusOf } from "../support/LiveFleet.ts"
import { memfdAllocatedKiB, memfdFds, memfdMaps } from "../support/ProcMaps.ts"
import { childScript } from "../support/ChildScripts.ts"

const WORKER = childScript("worker-main")
const DAEMON = childScript("worker-daemon")
const SHRINK = childScript("shrink-worker")

/** One layer of 2 × 16 blocks × 16 tokens × 2 heads × 16 bf16: 32 KiB. */
const LAYER_BYTES = 2 * 16 * 16 * 2 * 16 * 2
const descriptor = (token: Uint8Array, index: number): TensorDescriptor => ({
  kind: "cpu_memfd",
  fd_token: token,
  fd_index: index,
  device_uuid: "cpu",
  nbytes: LAYER_BYTES,
  dtype: "bfloat16",
  shape: [2, 16, 16, 2, 16],
  stride: [16 * 16 * 2 * 16, 16 * 2 * 16, 2 * 16, 16, 1],
  storage_offset: 0
})

const shmEntries = (prefix: string) => readdirSync("/dev/shm").filter((n) => n.startsWith(prefix))
/** Processes of this machine that map or hold a memfd whose name starts with `prefix` (a memfd lives only while one does). */
const holdersOf = (prefix: string) =>
  readdirSync("/proc").filter((p) => /^\d+$/.test(p)).filter((p) => {
    try {
      return memfdMaps(Number(p), prefix).length > 0 || memfdFds(Number(p), prefix) > 0
    } catch {
      return false // gone meanwhile, or not ours to read
    }
  }).map(Number)
const client = (endpoint: string) => makeMqClient({ endpoint, requestTimeoutMs: 10_000, lingerMs: 0 })

/** GET_SERVER_INFO on `c`, then one descriptor request for `instanceId` passing `fds`: the reply map. */
const pass = (c: MqClientShape, instanceId: number, fds: ReadonlyArray<number>) =>
  Effect.gen(function*() {
    const info = yield* c.request(GetServerInfo, [])
    const request = pack({ version: 1, nonce: info.fd_nonce, instance_id: instanceId, fds: fds.length })
    return unpack(yield* sendFds(info.fd_socket, request, fds, 10_000))!.value as Record<string, unknown>
  })

const register = (c: MqClientShape, instanceId: number, kv: ReadonlyArray<TensorDescriptor>) =>
  c.request(RegisterKvCache, [makeInstanceId(instanceId), kv, "memfd-e2e", 1, "vllm", {}, []])

/** The failure message of an effect that must fail. */
const failure = <A, E extends { readonly message: string }, R>(e: Effect.Effect<A, E, R>) => Effect.map(Effect.flip(e), (x) => x.message)

describe("cpu_memfd: memory handed over, not named", () => {
  it.live("two processes STORE and RETRIEVE byte-exact over passed memfds; nothing in /dev/shm; status and GET_SERVER_INFO say so", () =>
    Effect.scoped(Effect.gen(function*() {
      const endpoint = ipcEndpoint()
      const socket = `${endpoint.slice("ipc://".length)}.fds`
      const { server, httpPort } = yield* startServer(endpoint, ["--l1-size-gb", "0.25", "--no-l1-prefault"], 60_000)
      assert.strictEqual(statSync(socket).mode & 0o777, 0o600)
      const prefix = `mpcache-memfd-e2e-${randomUUID().slice(0, 8)}`
      const args = { endpoint, seed: 9, tokenCount: 320, backing: "cpu_memfd" }
      const stored = yield* runJsonScript(WORKER, { ...args, mode: "store", namePrefix: `${prefix}-a`, blockIds: Array.from({ length: 20 }, (_, i) => i), requestId: "m1" })
      assert.strictEqual(stored.code, 0, stored.stderr)
      assert.strictEqual(stored.result["ok"], true)
      const retrieved = yield* runJsonScript(WORKER, { ...args, mode: "retrieve", namePrefix: `${prefix}-b`, blockIds: Array.from({ length: 20 }, (_, i) => 40 + i), requestId: "m2" })
      assert.strictEqual(retrieved.code, 0, retrieved.stderr)
      assert.deepStrictEqual([retrieved.result["ok"], retrieved.result["hitTokens"], retrieved.result["mismatches"]], [true, 320, []])
      assert.deepStrictEqual(shmEntries(prefix), [])

      // A live worker: its row in /api/status names its pid and uid and each memfd's seals.
      const daemon = yield* startScript(DAEMON, [JSON.stringify({ endpoint, namePrefix: `${prefix}-d`, heartbeatIntervalMs: 1_000, storeEveryMs: 200, backing: "cpu_memfd" })])
      const [, id, pid] = yield* daemon.waitForStdout(/"event":"registered","instanceId":"(\d+)","pid":(\d+)/, 20_000)
      const row = (yield* statusOf(httpPort)).instances.find((i) => i.instance_id === id)!
      assert.deepStrictEqual(
        { pid: row.memfd?.pid, uid: row.memfd?.uid, seals: row.memfd?.segments.map((s) => [s.bytes, s.seals]) },
        { pid: Number(pid), uid: process.getuid!(), seals: [[16384, ["seal", "shrink", "grow"]], [16384, ["seal", "shrink", "grow"]]] }
      )
      assert.strictEqual(memfdMaps(server.child.pid!, `${prefix}-d`).length, 2)
      assert.deepStrictEqual(shmEntries(prefix), [])

      const c = yield* client(endpoint)
      const info = yield* c.request(GetServerInfo, [])
      assert.deepStrictEqual({ ...info, fd_nonce: info.fd_nonce.length }, {
        fd_socket: socket,
        fd_nonce: 16,
        protocol_version: 1,
        features: ["cpu_memfd", "named_segments", "kv_events"]
      })
      yield* daemon.stop("SIGTERM")
      assert.deepStrictEqual(yield* server.stop("SIGTERM"), { code: 0, signal: null })
      assert.isFalse(existsSync(socket))
    }).pipe(Effect.provide(ZmqSocketsLive))), 120_000)

  it.live("a SIGKILLed worker's 256 MiB memfd cache: after the reap no process maps or holds it, nothing in /dev/shm, its own 256 MiB of pages freed", () =>
    Effect.scoped(Effect.gen(function*() {
      const endpoint = ipcEndpoint()
      const { server, httpPort } = yield* startServer(endpoint, ["--l1-size-gb", "0.25", "--no-l1-prefault", "--worker-disconnect-grace-seconds", "1"], 60_000)
      const serverPid = server.child.pid!
      const prefix = `mpcache-memfd-kill-${randomUUID().slice(0, 8)}`
      // 2 layers × (K, V) × 131072 blocks × 512 B = 256 MiB, every page written by the worker before it registers
      // (the server populates none of it: issue 24 item 12).
      const daemon = yield* startScript(DAEMON, [JSON.stringify({ endpoint, namePrefix: prefix, heartbeatIntervalMs: 1_000, storeEveryMs: 500, backing: "cpu_memfd", numBlocks: 131072, populate: true })])
      const [, populated] = yield* daemon.waitForStdout(/"event":"populated","bytes":(\d+)/, 30_000)
      assert.strictEqual(Number(populated), 256 * 1024 * 1024)
      const [, id, workerPid] = yield* daemon.waitForStdout(/"event":"registered","instanceId":"(\d+)","pid":(\d+)/, 30_000)
      assert.strictEqual(memfdMaps(serverPid, prefix).length, 2)
      assert.deepStrictEqual(shmEntries(prefix), [])
      // The memfds' own pages, every one allocated: exactly 256 MiB, whoever else uses memory on the machine.
      assert.strictEqual(memfdAllocatedKiB(Number(workerPid), prefix), 256 * 1024)

      daemon.child.kill("SIGKILL")
      const unmapped = yield* eventually(Effect.sync(() => memfdMaps(serverPid, prefix).length), (n) => n === 0, 30_000)
      assert.strictEqual(unmapped, 0, `the server still maps /memfd:${prefix} 30 s after the worker's SIGKILL`)
      const gone = yield* eventually(statusOf(httpPort), (s) => !s.instances.some((i) => i.instance_id === id), 30_000)
      assert.isFalse(gone.instances.some((i) => i.instance_id === id))
      assert.deepStrictEqual(memfdMaps(serverPid, prefix), [])
      assert.strictEqual(memfdFds(serverPid, prefix), 0)
      assert.deepStrictEqual(shmEntries(prefix), [])
      // No process maps or holds the memory any more: its last reference is gone, so the kernel has freed it.
      assert.deepStrictEqual(holdersOf(prefix), [])
      // The server serves on.
      const c = yield* client(endpoint)
      assert.strictEqual(yield* c.request(Ping, [null]), true)
    }).pipe(Effect.provide(ZmqSocketsLive))), 120_000)

  it.live("a token registers once, only on the connection and for the instance it was issued for", () =>
    Effect.scoped(Effect.gen(function*() {
      const endpoint = ipcEndpoint()
      const { server } = yield* startServer(endpoint, ["--l1-size-gb", "0.25", "--no-l1-prefault"], 60_000)
      const a = yield* client(endpoint)
      const b = yield* client(endpoint)
      const name = `mpcache-memfd-tok-${randomUUID().slice(0, 8)}`
      const fd = yield* createMemfd(name, LAYER_BYTES)
      const hex8 = (t: Uint8Array) => Buffer.from(t).toString("hex").slice(0, 8)
      const refused = (id: number, t: Uint8Array, why: string) =>
        `register_kv_cache: instance ${id}: kv_caches[0].fd_token ${hex8(t)}… ${why}`

      const first = yield* pass(a, 1, [fd])
      assert.deepStrictEqual(first["fds"], [{ size: LAYER_BYTES, seals: KV_SEALS }])
      const t1 = first["token"] as Uint8Array
      yield* register(a, 1, [descriptor(t1, 0)])
      // Replayed, on its own connection and on another one.
      const used = "was already used (a token registers once: pass the descriptors again for a new one)"
      assert.strictEqual(yield* failure(register(a, 1, [descriptor(t1, 0)])), refused(1, t1, used))
      assert.strictEqual(yield* failure(register(b, 5, [descriptor(t1, 0)])), refused(5, t1, used))

      // Issued to a's connection for instance 2: refused on b's, and for instance 3 on a's; still a's to use.
      const t2 = (yield* pass(a, 2, [fd]))["token"] as Uint8Array
      assert.strictEqual(
        yield* failure(register(b, 2, [descriptor(t2, 0)])),
        refused(2, t2, "was issued to another ZeroMQ connection (REGISTER on the connection whose fd_nonce the descriptor request sent)")
      )
      assert.strictEqual(
        yield* failure(register(a, 3, [descriptor(t2, 0)])),
        refused(3, t2, "was issued for another instance_id (the one the descriptor request declared)")
      )
      yield* register(a, 2, [descriptor(t2, 0)])
      // A connection that closes revokes its pending tokens: the server closes their descriptors (TTL 30 s, not waited).
      const leaving = `mpcache-memfd-leave-${randomUUID().slice(0, 8)}`
      const leavingFd = yield* createMemfd(leaving, LAYER_BYTES)
      const closing = yield* Scope.make()
      const c = yield* client(endpoint).pipe(Scope.provide(closing))
      assert.strictEqual((yield* pass(c, 9, [leavingFd]))["ok"], true)
      assert.strictEqual(memfdFds(server.child.pid!, leaving), 1)
      yield* Scope.close(closing, Exit.void)
      assert.strictEqual(yield* eventually(Effect.sync(() => memfdFds(server.child.pid!, leaving)), (n) => n === 0, 10_000), 0)
      // A token this server never issued.
      const forged = new Uint8Array(16).fill(7)
      assert.strictEqual(yield* failure(register(a, 4, [descriptor(forged, 0)])), refused(4, forged, "is not a token this server issued"))
    }).pipe(Effect.provide(ZmqSocketsLive))), 120_000)

  it.live("an unsealed memfd: refused under --require-sealed-memfd; without it a shrink is caught by the fault guard", () =>
    Effect.scoped(Effect.gen(function*() {
      const sealedOnly = ipcEndpoint()
      yield* startServer(sealedOnly, ["--l1-size-gb", "0.25", "--no-l1-prefault", "--require-sealed-memfd"], 60_000)
      const c = yield* client(sealedOnly)
      const info = yield* c.request(GetServerInfo, [])
      assert.deepStrictEqual(info.features, ["cpu_memfd", "require_sealed_memfd", "named_segments", "kv_events"])
      const unsealed = yield* createMemfd(`mpcache-memfd-unsealed-${randomUUID().slice(0, 8)}`, LAYER_BYTES, 0)
      const notSealed = "descriptor request: descriptor 0 is not sealed (seals: none); this server requires F_SEAL_SHRINK and F_SEAL_SEAL (--require-sealed-memfd)"
      assert.deepStrictEqual(yield* pass(c, 1, [unsealed]), { ok: false, code: "invalid_argument", message: notSealed })
      // Through the worker adapter: its REGISTER fails with the same words.
      const geometry = { numLayers: 1, numBlocks: 64, blockSizeTokens: 16, numHeads: 2, headSize: 16 }
      const shrinkArgs = { geometry, blockIds: [1, 2, 3, 4], tokenCount: 64, shrinkTo: 0, backing: "cpu_memfd" }
      const refusedRun = yield* runJsonScript(SHRINK, { ...shrinkArgs, endpoint: sealedOnly, mode: "register-only", namePrefix: "mpcache-memfd-r", requestId: "u1" })
      assert.strictEqual(refusedRun.code, 0, refusedRun.stderr)
      const reg = (refusedRun.result["register"] as { error: Record<string, unknown> }).error
      assert.deepStrictEqual([reg["_tag"], reg["field"], reg["message"]], ["InvalidArgument", "fd_socket", notSealed])

      const guarded = ipcEndpoint()
      const { httpPort } = yield* startServer(guarded, ["--l1-size-gb", "0.25", "--no-l1-prefault"], 60_000)
      // The STORE's gather takes the SIGBUS (REGISTER touched no page: nothing else could have), the guard ends
      // that copy and the STORE is answered with the fault.
      const run = yield* runJsonScript(SHRINK, { ...shrinkArgs, endpoint: guarded, mode: "shrink-store", namePrefix: "mpcache-memfd-s", requestId: "u2" })
      assert.strictEqual(run.code, 0, run.stderr)
      const store = (run.result["store"] as { error: Record<string, unknown> }).error
      assert.strictEqual(store["_tag"], "InvalidArgument")
      assert.strictEqual(store["actual"], `segment ${/segment (memfd:[0-9a-f]{32}:0)/.exec(String(store["message"]))?.[1]} shrank`)
      assert.match(
        String(store["message"]),
        new RegExp(
          `^store: instance ${run.result["instanceId"]}: segment memfd:[0-9a-f]{32}:0: the segment shrank below its registered size \\(131072 bytes registered, a passed memfd, shrunk by its owner; gather faulted on the page at byte \\d+\\); its context is released: recreate the memory and register it again$`
        )
      )
      const status = yield* statusOf(httpPort)
      assert.isFalse(status.instances.some((i) => i.instance_id === run.result["instanceId"]))
      assert.strictEqual(yield* (yield* client(guarded)).request(Ping, [null]), true)
    }).pipe(Effect.provide(ZmqSocketsLive))), 120_000)

  it.live("descriptors passed and never registered are closed by the server after --fd-token-ttl-seconds", () =>
    Effect.scoped(Effect.gen(function*() {
      const endpoint = ipcEndpoint()
      const { server } = yield* startServer(endpoint, ["--l1-size-gb", "0.25", "--no-l1-prefault", "--fd-token-ttl-seconds", "1"], 60_000)
      const serverPid = server.child.pid!
      const name = `mpcache-memfd-ttl-${randomUUID().slice(0, 8)}`
      const c = yield* client(endpoint)
      const one = yield* createMemfd(`${name}-x`, LAYER_BYTES)
      const two = yield* createMemfd(`${name}-y`, LAYER_BYTES)
      const reply = yield* pass(c, 1, [one, two, one])
      assert.strictEqual(reply["ok"], true)
      assert.strictEqual(reply["expires_in_ms"], 1_000)
      assert.strictEqual(memfdFds(serverPid, name), 3)
      const closed = yield* eventually(Effect.sync(() => memfdFds(serverPid, name)), (n) => n === 0, 10_000)
      assert.strictEqual(closed, 0)
      // And the token is gone with them.
      const token = reply["token"] as Uint8Array
      assert.include(yield* failure(register(c, 1, [descriptor(token, 0)])), "expired (passed descriptors are closed 1 s after passing unless registered)")
    }).pipe(Effect.provide(ZmqSocketsLive))), 120_000)

  it.live("--fd-socket @name serves on the abstract namespace; a socket a live server holds refuses to start a second one (exit 1)", () =>
    Effect.scoped(Effect.gen(function*() {
      const endpoint = ipcEndpoint()
      const abstract = `@mpcache-e2e-${randomUUID()}`
      yield* startServer(endpoint, ["--l1-size-gb", "0.25", "--no-l1-prefault", "--fd-socket", abstract], 60_000)
      const c = yield* client(endpoint)
      assert.strictEqual((yield* c.request(GetServerInfo, [])).fd_socket, abstract)
      const fd = yield* createMemfd(`mpcache-memfd-abs-${randomUUID().slice(0, 8)}`, LAYER_BYTES)
      yield* register(c, 1, [descriptor((yield* pass(c, 1, [fd]))["token"] as Uint8Array, 0)])

      const second = yield* runCli(
        ["serve", "--endpoint", ipcEndpoint(), "--http-port", "0", "--l1-size-gb", "0.25", "--no-l1-prefault", "--fd-socket", abstract],
        60_000
      )
      assert.strictEqual(second.code, 1)
      assert.include(second.stderr, `mpcache cannot start: bind on descriptor socket ${abstract} failed: Address already in use (EADDRINUSE)`)
    }).pipe(Effect.provide(ZmqSocketsLive))), 120_000)

  it.live("kill -9 the server and start it again: a memfd worker hands its memfds to the new server and registers again", () =>
    Effect.scoped(Effect.gen(function*() {
      const endpoint = ipcEndpoint()
      const first = yield* startServer(endpoint, ["--l1-size-gb", "0.25", "--no-l1-prefault"], 60_000)
      const prefix = `mpcache-memfd-restart-${randomUUID().slice(0, 8)}`
      const daemon = yield* startScript(DAEMON, [JSON.stringify({ endpoint, namePrefix: prefix, heartbeatIntervalMs: 1_000, storeEveryMs: 300, backing: "cpu_memfd" })])
      const [, id] = yield* daemon.waitForStdout(/"event":"registered","instanceId":"(\d+)"/, 20_000)
      yield* first.server.stop("SIGKILL")
      // The dead server's socket files stay behind; the new one replaces the descriptor socket nobody answers on.
      const second = yield* startServer(endpoint, ["--l1-size-gb", "0.25", "--no-l1-prefault"], 60_000)
      const row = yield* eventually(
        Effect.map(statusOf(second.httpPort), (s) => s.instances.find((i) => i.instance_id === id)),
        (r) => r !== undefined,
        10_000
      )
      assert.deepStrictEqual(row?.memfd?.segments.map((x) => x.seals), [["seal", "shrink", "grow"], ["seal", "shrink", "grow"]])
      assert.strictEqual(memfdMaps(second.server.child.pid!, prefix).length, 2)
      // At least one re-registration (a loaded machine may cost the worker a heartbeat and so one more).
      yield* daemon.waitForStdout(/"event":"store","n":\d+,"ok":true,"healthy":true,"reregistrations":[1-9]\d*/, 45_000)
    }).pipe(Effect.provide(ZmqSocketsLive))), 120_000)
})
