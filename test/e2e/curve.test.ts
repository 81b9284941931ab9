/**
 * CURVE and the fail-closed defaults with real processes (issue 14 items 1,
 * 2): `mpcache serve` with an allowlist; `mpcache ping` with an authorized
 * key, an unlisted key, no CURVE, and a key removed by SIGHUP; a
 * non-loopback bind without CURVE; the ipc socket file's mode.
 */
import { statSync } from "node:fs"
import { networkInterfaces } from "node:os"
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { runCli, startCli } from "../support/Cli.ts"
import { makeTestKeys } from "../support/CurveKeys.ts"

/** The machine's own non-loopback IPv4 address (only a refused bind is tried on it: no traffic leaves loopback). */
const ownAddress = (): string | undefined =>
  Object.values(networkInterfaces()).flat().find((i) => i !== undefined && i.family === "IPv4" && !i.internal)?.address

describe("CURVE and fail-closed binds (real processes)", () => {
  it.live("a non-loopback bind without CURVE exits 2 naming the flag, before binding", () =>
    Effect.gen(function*() {
      const address = ownAddress() ?? "0.0.0.0"
      const r = yield* runCli(["serve", "--host", address, "--port", "45991", "--http-port", "0"])
      assert.strictEqual(r.code, 2)
      assert.include(r.stderr, `--host: ${address} is not a loopback address: serving beyond loopback needs CURVE`)
    }))

  it.live("an unlisted key, a client without CURVE and a key removed by SIGHUP get nothing; an authorized client keeps working; the ipc socket is 0600", () =>
    Effect.scoped(Effect.gen(function*() {
      const keys = makeTestKeys({ a: "tenantA", b: "tenantB" }, ["stranger"])
      const endpoint = `ipc://${join(keys.dir, "mpcache.sock")}`
      const server = yield* startCli([
        "serve", "--endpoint", endpoint, "--http-port", "0", "--l1-size-gb", "0.05", "--no-l1-prefault",
        "--curve-secret-key-file", keys.serverSecretFile, "--curve-authorized-keys", keys.authorizedKeysFile
      ])
      yield* server.waitForStderr(/MQ server listening/, 45_000)
      assert.strictEqual(statSync(endpoint.slice("ipc://".length)).mode & 0o777, 0o600)
      const ping = (name: string | undefined) =>
        runCli([
          "ping", "--endpoint", endpoint, "--timeout-seconds", "1",
          ...(name === undefined ? [] : ["--curve-server-public-key-file", keys.serverPublicFile, "--curve-secret-key-file", keys.clients[name]!.secretFile])
        ])
      const ok = yield* ping("a")
      assert.strictEqual(ok.code, 0)
      assert.strictEqual(ok.stdout.trim(), "true")
      assert.strictEqual((yield* ping("b")).code, 0)
      const stranger = yield* ping("stranger")
      assert.strictEqual(stranger.code, 1)
      assert.include(stranger.stderr, "no reply within 1000 ms")
      const plain = yield* ping(undefined)
      assert.strictEqual(plain.code, 1)
      assert.include(plain.stderr, "no reply within 1000 ms")
      keys.authorize({ a: "tenantA" })
      server.child.kill("SIGHUP")
      yield* server.waitForStderr(/reloaded the authorized keys: 1 key/, 30_000)
      const removed = yield* ping("b")
      assert.strictEqual(removed.code, 1)
      assert.include(removed.stderr, "no reply within 1000 ms")
      assert.strictEqual((yield* ping("a")).code, 0)
      assert.match(server.stderr(), /refused a client \(unknown_key\)/)
      // A client without CURVE fails the handshake with ERR_ZMTP_MECHANISM_MISMATCH, unless it notices the
      // mismatch first and hangs up, which the server then sees as a protocol error (EPIPE): either is a refusal.
      assert.match(server.stderr(), /refused a client \((mechanism|protocol)\): (a client without CURVE connected|handshake failed)/)
      const stopped = yield* server.stop("SIGTERM")
      assert.strictEqual(stopped.code, 0)
    })), 150_000)

  it.live("a malformed authorized-keys line fails start with exit 2 naming the file and line", () =>
    Effect.gen(function*() {
      const keys = makeTestKeys({ a: "tenantA" })
      keys.authorize({ a: "tenantA bogus-flag" })
      const r = yield* runCli([
        "serve", "--port", "45992", "--http-port", "0",
        "--curve-secret-key-file", keys.serverSecretFile, "--curve-authorized-keys", keys.authorizedKeysFile
      ])
      assert.strictEqual(r.code, 2)
      assert.include(r.stderr, `${keys.authorizedKeysFile}:2: unknown flag "bogus-flag" (flags: admin, salt-group=NAME)`)
    }))
})
