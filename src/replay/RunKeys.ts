/**
 * Per-run CURVE keys for `mpcache replay --curve` (issue 14 item 1: replay
 * speaks CURVE): when the replay starts its own server with CURVE, it makes
 * a server key pair and one client key pair in a fresh private folder
 * (mode 0700, key files 0600), and an authorized-keys file listing the
 * client as tenant `replay`, admin. The driver's scheduler and every worker
 * use the one client key (one tenant: they share the cache, as vLLM's
 * scheduler and workers do). The folder is removed when the scope closes.
 */
import { randomBytes } from "node:crypto"
import { mkdtempSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Effect, type Scope } from "effect"
import { newKeyPair } from "../services/auth/Curve.ts"
import type { CurveKeyFiles } from "./Messages.ts"

/** The files of one run: the server's flags and the clients' key files. */
export interface RunKeys {
  readonly dir: string
  /** `serve --curve-secret-key-file`. */
  readonly serverSecretFile: string
  /** `serve --curve-authorized-keys`. */
  readonly authorizedKeysFile: string
  /** What the scheduler and the workers read. */
  readonly client: CurveKeyFiles
  /**
   * `serve --http-token-file` and the token in it: a CURVE server's L1 listing answers only behind one
   * (docs/security.md), and the kv-aware router's audit reads it.
   */
  readonly httpTokenFile: string
  readonly httpToken: string
}

/** Writes the run's keys for the life of the Scope (removed at its close). Dies when the temp folder cannot be written. */
export const makeRunKeys: Effect.Effect<RunKeys, never, Scope.Scope> = Effect.acquireRelease(
  Effect.sync(() => {
    const dir = mkdtempSync(join(tmpdir(), "mpcache-replay-keys-"))
    const server = newKeyPair()
    const client = newKeyPair()
    const httpToken = randomBytes(32).toString("hex")
    const file = (name: string, text: string, mode: number) => {
      const path = join(dir, name)
      writeFileSync(path, `${text}\n`, { mode, flag: "wx" })
      return path
    }
    return {
      dir,
      serverSecretFile: file("server.key", server.secretKey, 0o600),
      authorizedKeysFile: file("authorized_keys", `# mpcache replay, this run only\n${client.publicKey} replay admin`, 0o600),
      client: {
        serverPublicKeyFile: file("server.pub", server.publicKey, 0o644),
        secretKeyFile: file("replay.key", client.secretKey, 0o600)
      },
      httpTokenFile: file("http.token", httpToken, 0o600),
      httpToken
    }
  }),
  (keys) => Effect.sync(() => rmSync(keys.dir, { recursive: true, force: true }))
)
