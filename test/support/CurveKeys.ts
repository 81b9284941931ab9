/**
 * CURVE key files for tests: a fresh directory (mode 0700) with the
 * server's pair and one pair per named client, and an authorized-keys file
 * listing the clients with their lines' flags.
 */
import { mkdtempSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as zmq from "zeromq"
import type { DealerCurve } from "../../src/services/zmq/Sockets.ts"

export interface TestKeys {
  readonly dir: string
  readonly serverSecretFile: string
  readonly serverPublicFile: string
  readonly authorizedKeysFile: string
  readonly serverPublicKey: string
  /** Each client's DealerCurve and its key file, by name. */
  readonly clients: Record<string, DealerCurve & { readonly secretFile: string }>
  /** Rewrites the authorized-keys file with only these clients (then send SIGHUP or call reload). */
  readonly authorize: (lines: Record<string, string>) => void
}

/** `clients`: name → the rest of its authorized-keys line (tenant and flags), e.g. `{ a: "tenantA admin" }`. */
export const makeTestKeys = (clients: Record<string, string>, extra: ReadonlyArray<string> = []): TestKeys => {
  const dir = mkdtempSync(join(tmpdir(), "mpcache-keys-"))
  // Key material of tests: gone when the test process ends.
  process.once("exit", () => rmSync(dir, { recursive: true, force: true }))
  const server = zmq.curveKeyPair()
  const serverSecretFile = join(dir, "server.key")
  const serverPublicFile = join(dir, "server.pub")
  writeFileSync(serverSecretFile, `${server.secretKey}\n`, { mode: 0o600 })
  writeFileSync(serverPublicFile, `${server.publicKey}\n`)
  const out: Record<string, DealerCurve & { readonly secretFile: string }> = {}
  for (const name of [...Object.keys(clients), ...extra]) {
    const pair = zmq.curveKeyPair()
    const secretFile = join(dir, `${name}.key`)
    writeFileSync(secretFile, `${pair.secretKey}\n`, { mode: 0o600 })
    out[name] = { serverPublicKey: server.publicKey, secretKey: pair.secretKey, publicKey: pair.publicKey, secretFile }
  }
  const authorizedKeysFile = join(dir, "authorized_keys")
  const authorize = (lines: Record<string, string>) =>
    writeFileSync(
      authorizedKeysFile,
      ["# test clients", ...Object.entries(lines).map(([name, rest]) => `${out[name]!.publicKey} ${rest}`), ""].join("\n")
    )
  authorize(clients)
  return { dir, serverSecretFile, serverPublicFile, authorizedKeysFile, serverPublicKey: server.publicKey, clients: out, authorize }
}
