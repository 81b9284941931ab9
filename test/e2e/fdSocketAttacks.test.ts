/**
 * Attacks on the descriptor socket from the same node (issue 24 items 2, 8, 9 and 11), performed against a
 * real `mpcache serve` by a real attacker process (test/support/fd-attacker.py: Python's standard library, so
 * it can run as another uid), with the server's own /proc/<pid>/fd as the witness. After each attack another
 * client's PING, HTTP /api/healthcheck and a memfd hand-over with its REGISTER are answered.
 *
 * - Item 2: a TCP socket with unsent data and SO_LINGER 3600 s handed over (directly, and queued inside a
 *   passed socketpair end) is refused naming it a socket, and the server holds none of it; from another uid
 *   on an abstract socket it is refused at accept (forbidden) and the server's descriptor count is back to
 *   exactly what it was.
 * - Item 8: 1,280 descriptors on one connection, in sends of 64 and of 253, are refused at the first read
 *   past 64, none kept; a flood of valid requests stops at --max-passed-descriptors-per-peer and
 *   --max-passed-descriptors (overloaded naming the flag) with exactly that many held; a connection that goes
 *   takes its tokens' descriptors with it.
 * - Items 9 and 11: another uid reopening 140 connections to the abstract socket never holds a slot (no cap
 *   refusal, hand-overs served while it goes on); one uid over its per-uid slots does not block another uid;
 *   a request sent a byte a second is cut 5 s after accept; refusals counted (status, metrics) and logged
 *   once per 10 s per reason.
 *
 * Needs /usr/bin/python3 ≥ 3.9 and, for the other-uid attacks, root (the attacker setuid()s to nobody):
 * skipped loudly on stderr otherwise.
 */
import { type ChildProcess, spawn, spawnSync } from "node:child_process"
import { randomUUID } from "node:crypto"
import { readdirSync, readlinkSync, rmSync, statSync } from "node:fs"
import { fileURLToPath } from "node:url"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Exit, Scope } from "effect"
import { ZmqSocketsLive } from "../../src/layers/Zmq.ts"
import { createMemfd, sendFds } from "../../src/native/FdPassing.ts"
import { loadNativeAddon } from "../../src/native/Native.ts"
import { pack, unpack } from "../../src/schema/Frame.ts"
import { makeInstanceId } from "../../src/schema/InstanceId.ts"
import { GetServerInfo, Ping, RegisterKvCache } from "../../src/schema/Op.ts"
import type { StatusFdSocket } from "../../src/schema/Status.ts"
import type { TensorDescriptor } from "../../src/schema/TensorDescriptor.ts"
import { makeMqClient, type MqClientShape } from "../../src/services/client/MqClient.ts"
import { eventually, getText, ipcEndpoint, startServer, statusOf } from "../support/LiveFleet.ts"

const ATTACKER = fileURLToPath(new URL("../support/fd-attacker.py", import.meta.url))
const PYTHON = "/usr/bin/python3"
/** nobody and nogroup (Debian): the other uid, and the group of an --ipc-group socket. */
const NOBODY = 65534
const NOGROUP = 65534

const python = (() => {
  const probe = spawnSync(PYTHON, ["-c", "import socket, sys; socket.send_fds; sys.exit(0 if sys.version_info >= (3, 9) else 1)"], { encoding: "utf8" })
  if (probe.status === 0) return true
  process.stderr.write(`SKIPPED test/e2e/fdSocketAttacks.test.ts: ${PYTHON} ≥ 3.9 with socket.send_fds is needed: ${probe.error?.message ?? probe.stderr.trim()}\n`)
  return false
})()
const root = (() => {
  if (process.getuid?.() === 0) return true
  process.stderr.write("SKIPPED the other-uid attacks of test/e2e/fdSocketAttacks.test.ts: they need root (the attacker setuid()s to nobody)\n")
  return false
})()

const BASE = ["--l1-size-gb", "0.25", "--no-l1-prefault"]

interface Attacker {
  readonly child: ChildProcess
  /** The first JSON line (past `after` lines) whose event is `event` and that `holds`, within `timeoutMs`. */
  readonly next: (event: string, holds?: (e: Record<string, unknown>) => boolean, timeoutMs?: number) => Effect.Effect<Record<string, unknown>, Error>
  /** Closes its stdin: the commands that hold something end. */
  readonly release: () => void
  readonly exited: Effect.Effect<number | null>
}

/** fd-attacker.py with `args`, as `uid`:`gid` when given; killed with the scope if still alive. */
const attacker = (args: ReadonlyArray<string>, as?: { readonly uid: number; readonly gid: number }) =>
  Effect.acquireRelease(
    Effect.sync((): Attacker => {
      const ids = as === undefined ? [] : ["--uid", String(as.uid), "--gid", String(as.gid)]
      const child = spawn(PYTHON, [ATTACKER, ...args, ...ids], { stdio: ["pipe", "pipe", "pipe"] })
      let stdout = ""
      let stderr = ""
      child.stdout!.on("data", (d: Buffer) => (stdout += d.toString()))
      child.stderr!.on("data", (d: Buffer) => (stderr += d.toString()))
      const exitedP = new Promise<number | null>((resolve) => child.on("exit", (code) => resolve(code)))
      const lines = () => stdout.split("\n").filter((l) => l !== "").map((l) => JSON.parse(l) as Record<string, unknown>)
      return {
        child,
        next: (event, holds = () => true, timeoutMs = 30_000) =>
          Effect.tryPromise({
            try: () =>
              new Promise<Record<string, unknown>>((resolve, reject) => {
                const started = Date.now()
                const poll = () => {
                  const hit = lines().find((e) => e["event"] === event && holds(e))
                  if (hit !== undefined) return resolve(hit)
                  if (child.exitCode !== null) return reject(new Error(`attacker exited (${child.exitCode}) before "${event}": ${stderr}${stdout}`))
                  if (Date.now() - started > timeoutMs) return reject(new Error(`timed out waiting for "${event}": ${stderr}${stdout.slice(-2000)}`))
                  setTimeout(poll, 20)
                }
                poll()
              }),
            catch: (e) => e as Error
          }),
        release: () => void child.stdin!.end(),
        exited: Effect.promise(() => exitedP)
      }
    }),
    (a) => Effect.sync(() => a.child.exitCode === null && a.child.kill("SIGKILL"))
  )

const client = (endpoint: string) => makeMqClient({ endpoint, requestTimeoutMs: 10_000, lingerMs: 0 })

/** One layer of 2 × 16 blocks × 16 tokens × 2 heads × 16 bf16: 32 KiB (as test/e2e/memfd.test.ts). */
const LAYER_BYTES = 2 * 16 * 16 * 2 * 16 * 2
const layout = { device_uuid: "cpu", nbytes: LAYER_BYTES, dtype: "bfloat16" as const, shape: [2, 16, 16, 2, 16], stride: [8192, 512, 32, 16, 1], storage_offset: 0 }
const memfdDescriptor = (token: Uint8Array): TensorDescriptor => ({ kind: "cpu_memfd", fd_token: token, fd_index: 0, ...layout })

const register = (c: MqClientShape, instanceId: number, kv: ReadonlyArray<TensorDescriptor>) =>
  c.request(RegisterKvCache, [makeInstanceId(instanceId), kv, "fd-attacks", 1, "vllm", {}, []])

/** GET_SERVER_INFO on `c` and the payload of a descriptor request of `fds` descriptors for `instanceId`. */
const requestFor = (c: MqClientShape, instanceId: number, fds: number) =>
  Effect.map(c.request(GetServerInfo, []), (info) => ({ info, payload: pack({ version: 1, nonce: info.fd_nonce, instance_id: instanceId, fds }) }))

/** One descriptor request on `c`'s connection passing `fds`: the reply map. */
const pass = (c: MqClientShape, instanceId: number, fds: ReadonlyArray<number>) =>
  Effect.gen(function*() {
    const { info, payload } = yield* requestFor(c, instanceId, fds.length)
    return unpack(yield* sendFds(info.fd_socket, payload, fds, 10_000))!.value as Record<string, unknown>
  })

/**
 * What everyone else must still get: a PING on `c`, HTTP /api/healthcheck, and a memfd handed over by `c`
 * and registered as `instanceId`.
 */
const servesEveryoneElse = (c: MqClientShape, httpPort: number, instanceId: number) =>
  Effect.gen(function*() {
    assert.strictEqual(yield* c.request(Ping, [null]), true)
    const health = yield* Effect.promise(() => fetch(`http://127.0.0.1:${httpPort}/api/healthcheck`).then(async (r) => [r.status, await r.json()]))
    assert.deepStrictEqual(health, [200, { status: "healthy" }])
    const fd = yield* createMemfd(`mpcache-fda-legit-${randomUUID().slice(0, 8)}`, LAYER_BYTES)
    const reply = yield* pass(c, instanceId, [fd])
    assert.strictEqual(reply["ok"], true, String(reply["message"]))
    yield* register(c, instanceId, [memfdDescriptor(reply["token"] as Uint8Array)])
  })

/** What process `pid` holds open: every link of /proc/<pid>/fd. */
const linksOf = (pid: number) =>
  readdirSync(`/proc/${pid}/fd`).flatMap((fd) => {
    try {
      return [readlinkSync(`/proc/${pid}/fd/${fd}`)]
    } catch {
      return [] // closed meanwhile
    }
  })
const socketsOf = (pid: number, inodes: ReadonlyArray<unknown>) => linksOf(pid).filter((l) => inodes.some((i) => l === `socket:[${String(i)}]`))
const memfdFds = (pid: number, name: string) => linksOf(pid).filter((l) => l === `/memfd:${name} (deleted)`).length

const fdSocketOf = (httpPort: number) => Effect.map(statusOf(httpPort), (s) => s.fd_socket!)
const refusalsMetric = (text: string, reason: string) => Number(new RegExp(`^mpcache_fd_socket_refusals_total\\{reason="${reason}"\\} (\\d+)`, "m").exec(text)?.[1] ?? 0)
const decode = (hex: unknown) => unpack(Buffer.from(String(hex), "hex"))?.value
const notAMemfd = (kind: string) =>
  `descriptor request: descriptor 0 is not a read-write memfd (a ${kind}, access rw, seals unsupported); expected memfd_create(…, MFD_ALLOW_SEALING) memory`
const noRefusals: StatusFdSocket["refusals"] = { uid: 0, connections: 0, connections_per_uid: 0, deadline: 0 }
/** The refusals metric of `reason` once it caught up with the listener's count `n` (it follows a coalesced signal). */
const metricReaches = (httpPort: number, reason: string, n: number) =>
  eventually(Effect.map(getText(`http://127.0.0.1:${httpPort}/metrics`), (t) => refusalsMetric(t, reason)), (v) => v === n, 10_000)

describe.runIf(python)("descriptor socket attacks (issue 24)", () => {
  it.live("item 2: a lingering TCP socket handed over, directly and inside a passed socket: refused as a socket, nothing of it kept, everyone else served", () =>
    Effect.scoped(Effect.gen(function*() {
      const endpoint = ipcEndpoint()
      const socket = `${endpoint.slice("ipc://".length)}.fds`
      const { server, httpPort } = yield* startServer(endpoint, BASE, 60_000)
      const c = yield* client(endpoint)
      let id = 1
      for (const nested of [false, true]) {
        const { payload } = yield* requestFor(c, 100, 1)
        // Attempts until one landed: the server, not the attacker, dropped the last reference to the lingering socket.
        const a = yield* attacker(["linger", socket, Buffer.from(payload).toString("hex"), "--attempts", "40", ...(nested ? ["--nested"] : [])])
        const passed = yield* a.next("passed", undefined, 100_000)
        // The attack is real here: closing such a socket waits for its linger (1 s for the control).
        assert.isAtLeast(passed["control_close_ms"] as number, 900)
        assert.isAbove(passed["queued"] as number, 0)
        assert.strictEqual(passed["landed"], 1)
        // The attempt that landed was answered with the refusal (an attempt tried again was cut short, unanswered).
        assert.deepStrictEqual(decode((passed["replies"] as Array<unknown>).at(-1)), { ok: false, code: "invalid_argument", message: notAMemfd("socket") })
        // While the attacker keeps the socket lingering (its peer alive), the server serves, and holds none of it.
        yield* servesEveryoneElse(c, httpPort, id++)
        assert.deepStrictEqual(socketsOf(server.child.pid!, passed["inodes"] as Array<unknown>), [])
        a.release()
        assert.strictEqual(yield* a.exited, 0)
      }
      // The legit tokens were claimed: nothing held, nothing closing, no connection refused.
      const settled = yield* eventually(fdSocketOf(httpPort), (s) => s.held_descriptors === 0, 10_000)
      assert.deepStrictEqual([settled.held_descriptors, settled.token_descriptors, settled.closing_descriptors, settled.refusals], [0, 0, 0, noRefusals])
    }).pipe(Effect.provide(ZmqSocketsLive))), 120_000)

  it.live.runIf(root)("item 2: another uid's lingering socket on an abstract socket: refused at accept (forbidden), not one descriptor installed, everyone else served", () =>
    Effect.scoped(Effect.gen(function*() {
      const endpoint = ipcEndpoint()
      const abstract = `@mpcache-fda-${randomUUID()}`
      const { server, httpPort } = yield* startServer(endpoint, [...BASE, "--fd-socket", abstract], 60_000)
      const pid = server.child.pid!
      const c = yield* client(endpoint)
      const { payload } = yield* requestFor(c, 200, 1)
      const before = new Set(linksOf(pid))
      // Attempts until one landed: its sendmsg went through (the lingering socket sat in the server's connection) and
      // the server, not the attacker, dropped the last reference to it.
      const a = yield* attacker(["linger", abstract, Buffer.from(payload).toString("hex"), "--attempts", "40"], { uid: NOBODY, gid: NOBODY })
      const passed = yield* a.next("passed", undefined, 100_000)
      assert.strictEqual(passed["landed"], 1)
      const forbidden = {
        ok: false,
        code: "forbidden",
        message: `descriptor request: the sender runs as another uid; this server (abstract socket ${abstract}, which has no file mode) takes descriptors from uid 0 or root only`
      }
      assert.deepStrictEqual(decode((passed["replies"] as Array<unknown>).at(-1)), forbidden)
      yield* server.waitForStderr(/descriptor socket: refused a connection of another uid than 0 or root/, 15_000)
      // No descriptor it did not have before: nothing of the attacker's was ever installed, or left behind. (A set,
      // not a count: one of the server's own, such as an HTTP connection closing, may go meanwhile.)
      const added = () => linksOf(pid).filter((l) => !before.has(l))
      assert.deepStrictEqual(yield* eventually(Effect.sync(added), (xs) => xs.length === 0, 30_000), [])
      assert.deepStrictEqual(socketsOf(pid, passed["inodes"] as Array<unknown>), [])
      yield* servesEveryoneElse(c, httpPort, 1)
      const status = yield* fdSocketOf(httpPort)
      assert.deepStrictEqual([status.refusals, status.connections, status.held_descriptors], [
        { uid: passed["connects"], connections: 0, connections_per_uid: 0, deadline: 0 },
        0,
        0
      ])
      assert.strictEqual(yield* metricReaches(httpPort, "uid", passed["connects"] as number), passed["connects"])
      a.release()
    }).pipe(Effect.provide(ZmqSocketsLive))), 120_000)

  it.live("item 8: 1,280 descriptors on one connection are refused at the first read past 64, none kept; a flood stops at the caps with exactly that many held", () =>
    Effect.scoped(Effect.gen(function*() {
      const endpoint = ipcEndpoint()
      const socket = `${endpoint.slice("ipc://".length)}.fds`
      const flags = [...BASE, "--max-passed-descriptors", "256", "--max-passed-descriptors-per-peer", "128"]
      const { server, httpPort } = yield* startServer(endpoint, flags, 60_000)
      const pid = server.child.pid!
      const c = yield* client(endpoint)
      for (const [perSend, arrived] of [[64, 128], [253, 253]] as const) {
        const name = `mpcache-fda-1280-${randomUUID().slice(0, 8)}`
        const { payload } = yield* requestFor(c, 1, 1280)
        const a = yield* attacker(["fds", socket, Buffer.from(payload).toString("hex"), "1280", String(perSend), name])
        const sent = yield* a.next("sent")
        assert.deepStrictEqual(decode(sent["reply"]), {
          ok: false,
          code: "invalid_argument",
          message: `descriptor request: ${arrived} descriptors arrived, more than the 64 one request may pass; every one was closed`
        })
        assert.strictEqual(memfdFds(pid, name), 0)
      }

      // A flood of valid requests, 64 descriptors each, from three ZeroMQ connections.
      const flood = `mpcache-fda-flood-${randomUUID().slice(0, 8)}`
      const fd = yield* createMemfd(flood, 4096)
      const sixtyFour = Array.from({ length: 64 }, () => fd)
      const leaving = yield* Scope.make()
      const p1 = yield* client(endpoint).pipe(Scope.provide(leaving))
      const p2 = yield* client(endpoint)
      const p3 = yield* client(endpoint)
      assert.strictEqual((yield* pass(p1, 1, sixtyFour))["ok"], true)
      assert.strictEqual((yield* pass(p1, 2, sixtyFour))["ok"], true)
      assert.deepStrictEqual(yield* pass(p1, 3, sixtyFour), {
        ok: false,
        code: "overloaded",
        field: "max-passed-descriptors-per-peer",
        message:
          "descriptor request: this ZeroMQ connection's tokens hold 128 passed descriptors not yet registered; 64 more would pass --max-passed-descriptors-per-peer 128; register what it passed or retry later"
      })
      assert.strictEqual((yield* pass(p2, 4, sixtyFour))["ok"], true)
      assert.strictEqual((yield* pass(p2, 5, sixtyFour))["ok"], true)
      assert.deepStrictEqual(yield* pass(p3, 6, sixtyFour), {
        ok: false,
        code: "overloaded",
        field: "max-passed-descriptors",
        message:
          "descriptor request: the server holds 256 passed descriptors for tokens not yet registered; 64 more would pass --max-passed-descriptors 256; register or retry later"
      })
      assert.strictEqual(memfdFds(pid, flood), 256)
      const full = yield* fdSocketOf(httpPort)
      assert.deepStrictEqual([full.held_descriptors, full.token_descriptors, full.pending_tokens], [256, 256, 4])

      // Everyone else: a new ZeroMQ client's PING, HTTP, a REGISTER (of a named segment: memfd room is used up).
      const fresh = yield* client(endpoint)
      assert.strictEqual(yield* fresh.request(Ping, [null]), true)
      assert.strictEqual(yield* Effect.promise(() => fetch(`http://127.0.0.1:${httpPort}/api/healthcheck`).then((r) => r.status)), 200)
      const shm = `mpcache-fda-shm-${randomUUID().slice(0, 8)}`
      loadNativeAddon().shmCreate(shm, LAYER_BYTES)
      yield* Effect.addFinalizer(() => Effect.sync(() => rmSync(`/dev/shm/${shm}`, { force: true })))
      yield* register(fresh, 7, [{ kind: "cpu_shm", shm_name: shm, ...layout }])

      // The first flooder goes: its tokens' 128 descriptors with it, and the room is there for a hand-over.
      yield* Scope.close(leaving, Exit.void)
      assert.strictEqual(yield* eventually(Effect.sync(() => memfdFds(pid, flood)), (n) => n === 128, 10_000), 128)
      yield* servesEveryoneElse(fresh, httpPort, 8)
      const metrics = yield* getText(`http://127.0.0.1:${httpPort}/metrics`)
      assert.deepStrictEqual(
        ["passed_descriptors_per_peer", "passed_descriptors", "invalid"].map((r) => refusalsMetric(metrics, r)),
        [1, 1, 2]
      )
    }).pipe(Effect.provide(ZmqSocketsLive))), 120_000)

  it.live.runIf(root)("items 9, 11: another uid reopening 140 connections to @name never holds a slot; hand-overs are served while it goes on; refusals counted and logged once per 10 s", () =>
    Effect.scoped(Effect.gen(function*() {
      const endpoint = ipcEndpoint()
      const abstract = `@mpcache-fda-${randomUUID()}`
      const flags = [...BASE, "--fd-socket", abstract, "--fd-socket-max-connections", "16", "--fd-socket-max-connections-per-uid", "4"]
      const { server, httpPort } = yield* startServer(endpoint, flags, 60_000)
      const c = yield* client(endpoint)
      const started = Date.now()
      const a = yield* attacker(["hold", abstract, "140", "--reopen", "300"], { uid: NOBODY, gid: NOBODY })
      // Every one of the 140 answered and reopened at least once: the attack is going on.
      const going = yield* a.next("holding", (e) => (e["opened"] as number) >= 280, 60_000)
      for (let id = 1; id <= 5; id++) yield* servesEveryoneElse(c, httpPort, id)
      // Still going after the hand-overs: they were served during the attack.
      yield* a.next("holding", (e) => (e["opened"] as number) > (going["opened"] as number) + 140, 60_000)
      const status = yield* fdSocketOf(httpPort)
      // No refusal for a cap: 140 connections > 16 slots, and none of them ever held one.
      assert.deepStrictEqual({ ...status.refusals, uid: status.refusals.uid > 280 }, { uid: true, connections: 0, connections_per_uid: 0, deadline: 0 })
      a.release()
      const done = yield* a.next("done")
      const forbidden = Buffer.from(pack({
        ok: false,
        code: "forbidden",
        message: `descriptor request: the sender runs as another uid; this server (abstract socket ${abstract}, which has no file mode) takes descriptors from uid 0 or root only`
      })).toString("hex")
      assert.deepStrictEqual(Object.keys(done["replies"] as object), [forbidden])
      assert.strictEqual(yield* eventually(Effect.map(fdSocketOf(httpPort), (s) => s.connections), (n) => n === 0, 10_000), 0)
      // One WARNING line per 10 s window (the first of each window), however many refusals.
      const lines = server.stderr().split("\n").filter((l) => l.includes("descriptor socket: refused") && l.includes("another uid")).length
      assert.isAtLeast(lines, 1)
      assert.isAtMost(lines, Math.ceil((Date.now() - started) / 10_000) + 1)
    }).pipe(Effect.provide(ZmqSocketsLive))), 180_000)

  it.live.runIf(root)("items 9, 11: one uid over its per-uid slots does not block another uid; a request sent a byte a second is cut 5 s after accept", () =>
    Effect.scoped(Effect.gen(function*() {
      const endpoint = ipcEndpoint()
      const socket = `${endpoint.slice("ipc://".length)}.fds`
      const flags = [...BASE, "--ipc-group", "nogroup", "--fd-socket-max-connections", "6", "--fd-socket-max-connections-per-uid", "2"]
      const { httpPort } = yield* startServer(endpoint, flags, 60_000)
      assert.deepStrictEqual([statSync(socket).mode & 0o777, statSync(socket).gid], [0o660, NOGROUP])
      const c = yield* client(endpoint)
      // nobody (in the socket's group) keeps trying to hold 10: it gets its 2, the rest are refused, again and again.
      const a = yield* attacker(["hold", socket, "10", "--reopen", "300"], { uid: NOBODY, gid: NOGROUP })
      const perUid = Buffer.from(pack({
        ok: false,
        code: "overloaded",
        message: "descriptor socket: this uid has 2 connections open, the most one uid may (--fd-socket-max-connections-per-uid 2); retry later",
        field: "fd-socket-max-connections-per-uid"
      })).toString("hex")
      yield* a.next("holding", (e) => ((e["replies"] as Record<string, number>)[perUid] ?? 0) >= 8, 60_000)
      for (let id = 1; id <= 3; id++) yield* servesEveryoneElse(c, httpPort, id)
      const status = yield* fdSocketOf(httpPort)
      assert.isAtMost(status.connections, 2)
      assert.isAtLeast(status.refusals.connections_per_uid, 8)
      assert.strictEqual(status.refusals.connections, 0)

      // The slow loris: a byte a second keeps nothing alive past the deadline, counted from accept.
      const slow = yield* attacker(["slowloris", socket, "1000"])
      const cut = yield* slow.next("cut", () => true, 60_000)
      assert.deepStrictEqual(decode(cut["reply"]), {
        ok: false,
        code: "invalid_argument",
        message: "descriptor request: not complete within 5 s of the connect; send the whole framed request, its descriptors on its first bytes, at once"
      })
      assert.isAtLeast(cut["after_ms"] as number, 5_000)
      assert.isBelow(cut["after_ms"] as number, 60_000, "cut while it kept sending")
      assert.isAtLeast(cut["sent_bytes"] as number, 4 + 3)
      a.release()
      yield* a.next("done")
      const after = yield* fdSocketOf(httpPort)
      // nobody's held connections were cut at the deadline too, and reopened: at least the slow loris's and theirs.
      assert.isAtLeast(after.refusals.deadline, 1)
      assert.strictEqual(yield* metricReaches(httpPort, "connections_per_uid", after.refusals.connections_per_uid), after.refusals.connections_per_uid)
      assert.strictEqual(yield* metricReaches(httpPort, "deadline", after.refusals.deadline), after.refusals.deadline)
    }).pipe(Effect.provide(ZmqSocketsLive))), 180_000)
})
