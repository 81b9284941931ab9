/**
 * One fixture for running a suite with CURVE off and on (issue 14: "the
 * existing Python-free integration tests run both with CURVE off and on,
 * one parameterised suite, not two copies"):
 *
 *   describe.each(CURVE_MODES)("… (CURVE $curve)", ({ curve }) => {
 *     const fx = curveFixture(curve)
 *     … testServer({ curve: fx }) … makeMqClient({ endpoint, ...fx.client() }) …
 *     … startCli(["serve", …, ...fx.serverArgs]) … worker args { …, ...fx.client() } …
 *   })
 *
 * With CURVE on it makes fresh keys (test/support/CurveKeys.ts): a server
 * pair and one client pair per listed name, all of one admin tenant by
 * default, so clients of a suite share its cache_salt as they do with CURVE
 * off. With CURVE off every field is empty.
 */
import type { ServerConfigInput } from "../../src/services/server/ServerConfig.ts"
import type { DealerCurve } from "../../src/services/zmq/Sockets.ts"
import { makeTestKeys, type TestKeys } from "./CurveKeys.ts"

/** The modes of a parameterised suite, for `describe.each`. */
export const CURVE_MODES: ReadonlyArray<{ readonly curve: boolean }> = [{ curve: false }, { curve: true }]

export interface CurveFixture {
  readonly curve: boolean
  /** The key files; undefined with CURVE off. */
  readonly keys: TestKeys | undefined
  /** The in-process server's config fields (`curveSecretKeyFile`, `curveAuthorizedKeys`). */
  readonly serverConfig: Partial<ServerConfigInput>
  /** The same as `mpcache serve` flags. */
  readonly serverArgs: ReadonlyArray<string>
  /** The client options (MqClientOptions, the adapters' options) of client `name` (default "client"): `{ curve }` or `{}`. */
  readonly client: (name?: string) => { readonly curve?: DealerCurve }
  /** The same as client CLI flags (`--curve-server-public-key-file`, `--curve-secret-key-file`). */
  readonly clientArgs: (name?: string) => ReadonlyArray<string>
}

/**
 * The fixture of one mode. `clients`: name → the rest of its authorized-keys
 * line (tenant and flags); default one admin tenant "test" for "client".
 * Fails (throws, at collection time) when a suite asks for a name it did not list.
 */
export const curveFixture = (curve: boolean, clients: Record<string, string> = { client: "test admin" }): CurveFixture => {
  if (!curve) return { curve, keys: undefined, serverConfig: {}, serverArgs: [], client: () => ({}), clientArgs: () => [] }
  const keys = makeTestKeys(clients)
  const pair = (name: string) => {
    const p = keys.clients[name]
    if (p === undefined) throw new Error(`curveFixture: no client "${name}" (listed: ${Object.keys(clients).join(", ")})`)
    return p
  }
  return {
    curve,
    keys,
    serverConfig: { curveSecretKeyFile: keys.serverSecretFile, curveAuthorizedKeys: keys.authorizedKeysFile },
    serverArgs: ["--curve-secret-key-file", keys.serverSecretFile, "--curve-authorized-keys", keys.authorizedKeysFile],
    client: (name = "client") => {
      const { serverPublicKey, secretKey, publicKey } = pair(name)
      return { curve: { serverPublicKey, secretKey, publicKey } }
    },
    clientArgs: (name = "client") => ["--curve-server-public-key-file", keys.serverPublicFile, "--curve-secret-key-file", pair(name).secretFile]
  }
}
