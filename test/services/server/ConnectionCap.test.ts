import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import type { AcceptedSocket } from "../../../src/native/OwnSockets.ts"
import { makeConnectionCap } from "../../../src/services/server/internal/ConnectionCap.ts"

/** Accepted sockets as the scan would list them; shutdown removes one only when `closes` says libzmq got to it. */
const fakeListener = () => {
  const open: Array<AcceptedSocket> = []
  const shut: Array<number> = []
  let nextFd = 10
  return {
    open,
    shut,
    accept: () => {
      const s = { fd: nextFd, inode: 1000 + nextFd }
      nextFd++
      open.push(s)
      return s
    },
    close: (inode: number) => {
      const i = open.findIndex((s) => s.inode === inode)
      if (i >= 0) open.splice(i, 1)
    },
    io: {
      scan: Effect.sync(() => [...open]),
      shutdown: (s: AcceptedSocket) => {
        if (!open.some((o) => o.inode === s.inode)) return false
        shut.push(s.inode)
        return true
      }
    }
  }
}

describe("ConnectionCap (issue 24 item 11)", () => {
  it.effect("past the cap the newest are shut down, once each, even while libzmq has not closed them yet", () =>
    Effect.scoped(Effect.gen(function*() {
      const l = fakeListener()
      const cap = yield* makeConnectionCap("zmq", 4, l.io)
      const oldest = l.accept()
      yield* cap.accepted
      for (let i = 0; i < 3; i++) {
        l.accept()
        yield* cap.accepted
      }
      // At the cap: nothing shut.
      yield* Effect.yieldNow
      assert.deepStrictEqual(l.shut, [])
      for (let i = 0; i < 3; i++) {
        l.accept()
        yield* cap.accepted
        // Each scan runs as a fiber; let it finish before the next accept.
        for (let k = 0; k < 5; k++) yield* Effect.yieldNow
      }
      // Three past the cap, none closed by libzmq yet: each shut down exactly once, never the oldest.
      assert.strictEqual(new Set(l.shut).size, l.shut.length)
      assert.strictEqual(l.shut.length, 3)
      assert.isFalse(l.shut.includes(oldest.inode))
      assert.deepStrictEqual(cap.stats(), { connections: 7, max: 4, refused: 3 })
      // libzmq closes them: its monitor tells the cap.
      for (const inode of [...l.shut]) {
        l.close(inode)
        yield* cap.ended
      }
      assert.deepStrictEqual(cap.stats(), { connections: 4, max: 4, refused: 3 })
    })))
})
