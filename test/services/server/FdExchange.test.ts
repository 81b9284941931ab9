/**
 * The descriptor socket's service over a real Unix socket and real memfds
 * (issue 13 item 2), its time on the TestClock: a request's descriptors are
 * held by its token until REGISTER claims it (then closed with the claim)
 * or until its time to live passes (then the sweep closes them). Counted in
 * this process's /proc/self/fd. What tokens hold is bounded in all and per
 * ZeroMQ connection (issue 24 item 8), and /api/status says so.
 */
import { randomUUID } from "node:crypto"
import { closeSync, openSync, readdirSync, readlinkSync, rmSync, statSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Exit, Scope } from "effect"
import { TestClock } from "effect/testing"
import { createMemfd, F_SEAL, KV_SEALS, sendFds } from "../../../src/native/FdPassing.ts"
import { pack, unpack } from "../../../src/schema/Frame.ts"
import { makeInstanceId } from "../../../src/schema/InstanceId.ts"
import { ServerInfo } from "../../../src/schema/Op.ts"
import { FdExchange } from "../../../src/services/server/FdExchange.ts"
import { descriptorBudgetDefaults } from "../../../src/services/server/DescriptorBudget.ts"

/** Descriptors of this process open on a memfd named `name`. */
const openOn = (name: string) =>
  readdirSync("/proc/self/fd").filter((fd) => {
    try {
      return readlinkSync(`/proc/self/fd/${fd}`) === `/memfd:${name} (deleted)`
    } catch {
      return false
    }
  }).length

const layer = (socket: string) =>
  FdExchange.layerTest({ fdSocket: socket, fdTokenTtlSeconds: 5 })

const ctxOf = (peer: string) => ({ routingId: Buffer.from(peer, "hex"), peer, skipBinding: false })

/** GET_SERVER_INFO for `peer`, then one request passing `fd` twice for instance 7. */
const passTwice = (fd: number, peer: string) =>
  Effect.gen(function*() {
    const fdx = yield* FdExchange
    const info = (yield* fdx.module.rows[0]!.handle([], ctxOf(peer))) as typeof ServerInfo.Type
    const request = pack({ version: 1, nonce: info.fd_nonce, instance_id: 7, fds: 2 })
    const reply = unpack(yield* sendFds(info.fd_socket, request, [fd, fd], 5_000))?.value as Record<string, unknown>
    return { info, reply }
  })

describe("FdExchange", () => {
  it.effect("descriptors passed and never registered are closed when their token's time to live ends", () => {
    const socket = join(tmpdir(), `mpcache-fdx-${randomUUID()}.fds`)
    const name = `fdx-ttl-${randomUUID().slice(0, 8)}`
    return Effect.gen(function*() {
      const fd = yield* createMemfd(name, 8192)
      assert.strictEqual(openOn(name), 1)
      const { info, reply } = yield* passTwice(fd, "0a0b")
      assert.strictEqual(info.fd_socket, socket)
      assert.deepStrictEqual(info.features, ["cpu_memfd", "named_segments", "kv_events"])
      assert.strictEqual(reply["ok"], true)
      assert.strictEqual((reply["token"] as Uint8Array).length, 16)
      assert.strictEqual(reply["expires_in_ms"], 5_000)
      assert.deepStrictEqual(reply["fds"], [{ size: 8192, seals: KV_SEALS }, { size: 8192, seals: KV_SEALS }])
      // The server side holds its two received copies.
      assert.strictEqual(openOn(name), 3)
      const fdx = yield* FdExchange
      const pending = Effect.map(fdx.module.status!(), (b) => (b["fd_socket"] as { pending_tokens: number }).pending_tokens)
      assert.strictEqual(yield* pending, 1)
      yield* TestClock.adjust("4999 millis")
      assert.strictEqual(openOn(name), 3)
      yield* TestClock.adjust("1001 millis")
      assert.strictEqual(openOn(name), 1)
      assert.strictEqual(yield* pending, 0)
    }).pipe(Effect.scoped, Effect.provide(layer(socket)))
  })

  it.effect("a claim hands the descriptors over until its scope closes; a replay and another connection are refused", () => {
    const socket = join(tmpdir(), `mpcache-fdx-${randomUUID()}.fds`)
    const name = `fdx-claim-${randomUUID().slice(0, 8)}`
    return Effect.gen(function*() {
      const fdx = yield* FdExchange
      const fd = yield* createMemfd(name, 4096)
      const { reply } = yield* passTwice(fd, "0c0d")
      const token = reply["token"] as Uint8Array
      const hex8 = Buffer.from(token).toString("hex").slice(0, 8)
      const other = yield* Effect.flip(Effect.scoped(fdx.claim("register_kv_cache", makeInstanceId(7), "0e0f", "kv_caches[0].fd_token", token)))
      assert.strictEqual(
        other.message,
        `register_kv_cache: instance 7: kv_caches[0].fd_token ${hex8}… was issued to another ZeroMQ connection (REGISTER on the connection whose fd_nonce the descriptor request sent)`
      )
      const scope = yield* Scope.make()
      const claimed = yield* fdx.claim("register_kv_cache", makeInstanceId(7), "0c0d", "kv_caches[0].fd_token", token).pipe(Scope.provide(scope))
      assert.deepStrictEqual(claimed.fds.map((f) => f.size), [4096, 4096])
      assert.strictEqual(claimed.pid, process.pid)
      assert.strictEqual(openOn(name), 3)
      yield* Scope.close(scope, Exit.void)
      assert.strictEqual(openOn(name), 1)
      const replay = yield* Effect.flip(Effect.scoped(fdx.claim("register_kv_cache", makeInstanceId(7), "0c0d", "kv_caches[0].fd_token", token)))
      assert.strictEqual(replay.actual, "used")
      assert.include(replay.message, `${hex8}… was already used (a token registers once: pass the descriptors again for a new one)`)
    }).pipe(Effect.scoped, Effect.provide(layer(socket)))
  })

  it.effect("a request naming no live connection's nonce is refused and its descriptors closed at once", () => {
    const socket = join(tmpdir(), `mpcache-fdx-${randomUUID()}.fds`)
    const name = `fdx-nonce-${randomUUID().slice(0, 8)}`
    return Effect.gen(function*() {
      const fd = yield* createMemfd(name, 4096)
      const request = pack({ version: 1, nonce: new Uint8Array(16), instance_id: 7, fds: 1 })
      const reply = unpack(yield* sendFds(socket, request, [fd], 5_000))?.value as Record<string, unknown>
      assert.deepStrictEqual(reply, {
        ok: false,
        code: "forbidden",
        message:
          "descriptor request: the nonce is not one this server gave a live connection; ask GET_SERVER_INFO on the ZeroMQ connection that will REGISTER and send its fd_nonce"
      })
      assert.strictEqual(openOn(name), 1)
    }).pipe(Effect.scoped, Effect.provide(layer(socket)))
  })

  it.effect("on an abstract socket (@name): a regular file, a read-only memfd and a write-sealed memfd are refused, each named", () => {
    const socket = `@mpcache-fdx-${randomUUID()}`
    const name = `fdx-kinds-${randomUUID().slice(0, 8)}`
    return Effect.gen(function*() {
      const fdx = yield* FdExchange
      const info = (yield* fdx.module.rows[0]!.handle([], ctxOf("1a1b"))) as typeof ServerInfo.Type
      assert.strictEqual(info.fd_socket, socket)
      const ask = (fd: number) =>
        Effect.map(
          sendFds(socket, pack({ version: 1, nonce: info.fd_nonce, instance_id: 1, fds: 1 }), [fd], 5_000),
          (bytes) => unpack(bytes)?.value as Record<string, unknown>
        )
      const file = join(tmpdir(), `mpcache-fdx-${randomUUID()}`)
      writeFileSync(file, Buffer.alloc(4096))
      const regular = yield* Effect.acquireRelease(Effect.sync(() => openSync(file, "r+")), (fd) => Effect.sync(() => closeSync(fd)))
      assert.deepStrictEqual(yield* ask(regular), {
        ok: false,
        code: "invalid_argument",
        message:
          "descriptor request: descriptor 0 is not a read-write memfd (a regular file, access rw, seals unsupported); expected memfd_create(…, MFD_ALLOW_SEALING) memory"
      })
      rmSync(file)
      const memfd = yield* createMemfd(name, 4096, 0)
      const readOnly = yield* Effect.acquireRelease(Effect.sync(() => openSync(`/proc/self/fd/${memfd}`, "r")), (fd) => Effect.sync(() => closeSync(fd)))
      assert.strictEqual((yield* ask(readOnly))["message"], "descriptor request: descriptor 0 is not a read-write memfd (a regular file, access r, seals 0); expected memfd_create(…, MFD_ALLOW_SEALING) memory")
      const writeSealed = yield* createMemfd(`${name}-w`, 4096, F_SEAL.write | F_SEAL.seal)
      assert.strictEqual((yield* ask(writeSealed))["message"], "descriptor request: descriptor 0 is sealed against writes (seal, write); RETRIEVE writes into it")
      assert.strictEqual((yield* ask(memfd))["ok"], true)
    }).pipe(Effect.scoped, Effect.provide(layer(socket)))
  })

  it.effect("--fd-socket off: GET_SERVER_INFO names no socket and a cpu_memfd REGISTER is refused saying so", () =>
    Effect.gen(function*() {
      const fdx = yield* FdExchange
      assert.strictEqual(fdx.socketPath, undefined)
      const info = (yield* fdx.module.rows[0]!.handle([], ctxOf("2a2b"))) as typeof ServerInfo.Type
      assert.deepStrictEqual([info.fd_socket, info.features], ["", ["named_segments", "kv_events"]])
      const refused = yield* Effect.flip(Effect.scoped(fdx.claim("register_kv_cache", makeInstanceId(3), "2a2b", "kv_caches[1].fd_token", new Uint8Array(16))))
      assert.deepStrictEqual([refused.field, refused.actual, refused.message], [
        "kv_caches[1].fd_token",
        "cpu_memfd off",
        "register_kv_cache: instance 3: kv_caches[1].fd_token names passed descriptors, but this server has no descriptor socket (--fd-socket)"
      ])
    }).pipe(Effect.provide(FdExchange.layerTest({ fdSocket: "off" }))))

  it.effect("the socket file is mode 0600, or 0660 in the --ipc-group group next to an ipc endpoint", () => {
    const endpoint = `ipc://${join(tmpdir(), `mpcache-fdx-${randomUUID()}.sock`)}`
    return Effect.gen(function*() {
      const fdx = yield* FdExchange
      const st = statSync(fdx.socketPath!)
      assert.deepStrictEqual([fdx.socketPath, st.mode & 0o777, st.gid], [`${endpoint.slice("ipc://".length)}.fds`, 0o660, 1])
    }).pipe(Effect.provide(FdExchange.layerTest({ endpoint, ipcGroup: "daemon" })))
  })

  it.effect("tokens hold at most --max-passed-descriptors in all and --max-passed-descriptors-per-peer per connection: over either, overloaded naming the flag", () => {
    const socket = join(tmpdir(), `mpcache-fdx-${randomUUID()}.fds`)
    const name = `fdx-caps-${randomUUID().slice(0, 8)}`
    const caps = { ...descriptorBudgetDefaults, maxPassedDescriptors: 4, maxPassedDescriptorsPerPeer: 3 }
    return Effect.gen(function*() {
      const fdx = yield* FdExchange
      const fd = yield* createMemfd(name, 4096)
      /** GET_SERVER_INFO for `peer`, then one request passing `fd` `n` times. */
      const ask = (peer: string, n: number) =>
        Effect.gen(function*() {
          const info = (yield* fdx.module.rows[0]!.handle([], ctxOf(peer))) as typeof ServerInfo.Type
          const request = pack({ version: 1, nonce: info.fd_nonce, instance_id: 1, fds: n })
          return unpack(yield* sendFds(socket, request, Array.from({ length: n }, () => fd), 5_000))?.value as Record<string, unknown>
        })
      assert.strictEqual((yield* ask("0a01", 2))["ok"], true)
      assert.deepStrictEqual(yield* ask("0a01", 2), {
        ok: false,
        code: "overloaded",
        field: "max-passed-descriptors-per-peer",
        message:
          "descriptor request: this ZeroMQ connection's tokens hold 2 passed descriptors not yet registered; 2 more would pass --max-passed-descriptors-per-peer 3; register what it passed or retry later"
      })
      assert.strictEqual((yield* ask("0b01", 2))["ok"], true)
      assert.deepStrictEqual(yield* ask("0c01", 1), {
        ok: false,
        code: "overloaded",
        field: "max-passed-descriptors",
        message:
          "descriptor request: the server holds 4 passed descriptors for tokens not yet registered; 1 more would pass --max-passed-descriptors 4; register or retry later"
      })
      // Ours and the four the tokens hold: every refused one was closed before its answer.
      assert.strictEqual(openOn(name), 5)
      const block = Effect.map(fdx.module.status!(), (b) => b["fd_socket"] as Record<string, unknown>)
      const settled = yield* Effect.repeat(block, { until: (b) => b["connections"] === 0 })
      assert.deepStrictEqual({ ...settled, path: "" }, {
        path: "",
        require_sealed: false,
        token_ttl_seconds: 5,
        pending_tokens: 2,
        connections: 0,
        max_connections: 128,
        max_connections_per_uid: 16,
        held_descriptors: 4,
        token_descriptors: 4,
        closing_descriptors: 0,
        max_passed_descriptors: 4,
        max_passed_descriptors_per_peer: 3,
        refusals: { uid: 0, connections: 0, connections_per_uid: 0, deadline: 0 }
      })
      // A connection that goes takes its tokens' descriptors with it; the room is there again.
      yield* fdx.disconnected("0a01")
      assert.strictEqual(openOn(name), 3)
      assert.strictEqual((yield* ask("0c01", 1))["ok"], true)
      assert.deepStrictEqual([(yield* block)["held_descriptors"], (yield* block)["token_descriptors"]], [3, 3])
    }).pipe(
      Effect.scoped,
      Effect.provide(FdExchange.layerTest({ fdSocket: socket, fdTokenTtlSeconds: 5, descriptorLimit: 20_000, descriptorCaps: caps }))
    )
  })
})
