/**
 * The descriptor socket's listener in this process (src/native/addon/fdlisten.cc; issue 24 items 2, 9 and
 * 11), over real Unix sockets with real descriptors:
 *
 * - connections over the caps, in all and per uid, are answered with the refusal given and closed at accept,
 *   counted per reason and signalled; a connection that goes frees its slot;
 * - only memfds reach JS: anything else a request passes is let go of by the addon (fd -1, its kind named)
 *   and counted until it is closed; a passed memfd counts until closePassed.
 *
 * The uid rule and the deadline need another uid and 5 s: test/e2e/fdSocketAttacks.test.ts.
 */
import { spawnSync } from "node:child_process"
import { randomUUID } from "node:crypto"
import { closeSync, constants, openSync, readdirSync, readlinkSync, rmSync, writeFileSync } from "node:fs"
import { connect, type Socket } from "node:net"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Fiber, Queue } from "effect"
import { closePassed, createMemfd, type FdListenOptions, KV_SEALS, listenFds, sendFds } from "../../src/native/FdPassing.ts"
import { pack, unpack } from "../../src/schema/Frame.ts"
import { eventually } from "../support/LiveFleet.ts"

const socketPath = () => join(tmpdir(), `mpcache-fdl-${randomUUID()}.fds`)

/** Options with recognisable refusal payloads. */
const options = (maxConnections: number, maxConnectionsPerUid: number): FdListenOptions => ({
  maxConnections,
  maxConnectionsPerUid,
  maxPassedDescriptors: 64,
  allowedUid: -1,
  refusals: {
    uid: pack({ refused: "uid" }),
    connections: pack({ refused: "connections" }),
    connections_per_uid: pack({ refused: "connections_per_uid" }),
    deadline: pack({ refused: "deadline" })
  }
})

/** A connection that sends nothing; closed with the scope. */
const idle = (path: string) =>
  Effect.acquireRelease(
    Effect.callback<Socket, Error>((resume) => {
      const s = connect(path, () => resume(Effect.succeed(s)))
      s.once("error", (e) => resume(Effect.fail(e)))
    }),
    (s) => Effect.sync(() => s.destroy())
  )

/** Everything the server sends on `s` until it closes it: the decoded payload of its one frame. */
const answerOf = (s: Socket) =>
  Effect.callback<unknown>((resume) => {
    const chunks: Array<Buffer> = []
    s.on("data", (d: Buffer) => chunks.push(d))
    s.once("close", () => {
      const all = Buffer.concat(chunks)
      resume(Effect.succeed(all.length >= 4 ? unpack(all.subarray(4, 4 + all.readUInt32BE(0)))?.value : undefined))
    })
  })

/** Descriptors of this process whose link is `target`. */
const openOn = (target: string) =>
  readdirSync("/proc/self/fd").filter((fd) => {
    try {
      return readlinkSync(`/proc/self/fd/${fd}`) === target
    } catch {
      return false
    }
  }).length

describe("descriptor socket listener", () => {
  it.live("over the per-uid cap and over the total cap a connection is refused at accept, counted and signalled; a closed one frees its slot", () =>
    Effect.scoped(Effect.gen(function*() {
      const path = socketPath()
      const { listener, refused } = yield* listenFds(path, options(3, 2))
      const first = yield* idle(path)
      yield* idle(path)
      assert.strictEqual((yield* eventually(Effect.sync(() => listener.stats()), (s) => s.connections === 2, 10_000)).connections, 2)
      // A third of the same uid: its own cap of 2.
      assert.deepStrictEqual(yield* answerOf(yield* idle(path)), { refused: "connections_per_uid" })
      yield* Queue.take(refused)
      assert.deepStrictEqual(listener.stats().refusals, { uid: 0, connections: 0, connections_per_uid: 1, deadline: 0 })
      // A slot freed is a slot taken again, with no refusal.
      first.destroy()
      yield* eventually(Effect.sync(() => listener.stats().connections), (n) => n === 1, 10_000)
      yield* idle(path)
      assert.strictEqual((yield* eventually(Effect.sync(() => listener.stats()), (s) => s.connections === 2, 10_000)).connections, 2)
      assert.deepStrictEqual(listener.stats().refusals, { uid: 0, connections: 0, connections_per_uid: 1, deadline: 0 })

      // Per-uid cap = total: the total refuses first.
      const other = socketPath()
      const full = yield* listenFds(other, options(2, 2))
      yield* idle(other)
      yield* idle(other)
      yield* eventually(Effect.sync(() => full.listener.stats().connections), (n) => n === 2, 10_000)
      assert.deepStrictEqual(yield* answerOf(yield* idle(other)), { refused: "connections" })
      yield* Queue.take(full.refused)
      const stats = full.listener.stats()
      assert.deepStrictEqual({ ...stats.refusals, accepted: stats.accepted }, { uid: 0, connections: 1, connections_per_uid: 0, deadline: 0, accepted: 3 })
    })), 30_000)

  it.live("only memfds reach JS: a fifo and a regular file passed with a memfd are let go of by the addon, named, and counted until closed", () =>
    Effect.scoped(Effect.gen(function*() {
      const path = socketPath()
      const { listener, requests } = yield* listenFds(path, options(8, 8))
      const fifo = join(tmpdir(), `mpcache-fdl-fifo-${randomUUID()}`)
      assert.strictEqual(spawnSync("mkfifo", [fifo]).status, 0)
      const file = join(tmpdir(), `mpcache-fdl-file-${randomUUID()}`)
      writeFileSync(file, Buffer.alloc(4096))
      yield* Effect.addFinalizer(() => Effect.sync(() => [fifo, file].forEach((p) => rmSync(p, { force: true }))))
      const open = (p: string) => Effect.acquireRelease(Effect.sync(() => openSync(p, constants.O_RDWR | constants.O_NONBLOCK)), (fd) => Effect.sync(() => closeSync(fd)))
      const fifoFd = yield* open(fifo)
      const fileFd = yield* open(file)
      const memfd = yield* createMemfd(`fdl-${randomUUID().slice(0, 8)}`, 4096)
      const exchange = yield* Effect.forkChild(sendFds(path, pack({ any: "payload" }), [fifoFd, memfd, fileFd], 10_000))
      const req = yield* Queue.take(requests)
      assert.deepStrictEqual(req.fds.map((f) => ({ ...f, fd: f.fd < 0 ? -1 : "held", identity: f.identity === "" ? "" : "set" })), [
        { fd: -1, size: -1, seals: -1, regular: false, kind: "fifo", access: "rw", identity: "" },
        { fd: "held", size: 4096, seals: KV_SEALS, regular: true, kind: "regular file", access: "rw", identity: "set" },
        { fd: -1, size: -1, seals: -1, regular: true, kind: "regular file", access: "rw", identity: "" }
      ])
      assert.deepStrictEqual(unpack(req.payload)?.value, { any: "payload" })
      // The fifo and the file went to the closer thread: only the memfd stays counted, and only our own copies stay open.
      assert.strictEqual((yield* eventually(Effect.sync(() => listener.stats().heldDescriptors), (n) => n === 1, 10_000)), 1)
      assert.strictEqual(yield* eventually(Effect.sync(() => openOn(fifo)), (n) => n === 1, 10_000), 1)
      assert.strictEqual(yield* eventually(Effect.sync(() => openOn(file)), (n) => n === 1, 10_000), 1)
      yield* closePassed(listener, req.fds[1]!.fd)
      assert.deepStrictEqual({ held: listener.stats().heldDescriptors, closing: listener.stats().closingDescriptors }, { held: 0, closing: 0 })
      listener.reply(req.conn, pack({ ok: "answered" }))
      assert.deepStrictEqual(unpack(yield* Fiber.join(exchange))?.value, { ok: "answered" })
    })), 30_000)
})
