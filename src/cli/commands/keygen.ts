/**
 * `mpcache keygen NAME`: a new CURVE key pair (zeromq.js `curveKeyPair()`,
 * Curve25519, Z85 text): `NAME.key` holds the secret key on one line, mode
 * 0600; `NAME.pub` the public key on one line. Existing files are never
 * overwritten (exit 1). The public key goes into the server's
 * authorized-keys file (a client's) or to the clients
 * (`--curve-server-public-key-file`, the server's); a client reads only its
 * NAME.key: its public key derives from it.
 */
import { writeFileSync } from "node:fs"
import { Console, Effect } from "effect"
import { Argument, Command } from "effect/cli"
import * as zmq from "zeromq"
import { CommandFailed } from "../CommandFailed.ts"

export const keygen = Command.make("keygen", { name: Argument.String("name") }, ({ name }) =>
  Effect.gen(function*() {
    const pair = zmq.curveKeyPair()
    const write = (path: string, text: string, mode: number) =>
      Effect.try({
        try: () => writeFileSync(path, `${text}\n`, { mode, flag: "wx" }),
        catch: (e) => new CommandFailed({ message: `keygen: cannot create ${path}: ${e instanceof Error ? e.message : String(e)}`, exitCode: 1 })
      })
    yield* write(`${name}.key`, pair.secretKey, 0o600)
    yield* write(`${name}.pub`, pair.publicKey, 0o644)
    yield* Console.log(`wrote ${name}.key (secret, mode 0600) and ${name}.pub (public: ${pair.publicKey})`)
  }).pipe(Effect.tapError((e) => Console.error(`mpcache: ${e.message}`)))).pipe(
    Command.withDescription("Write a CURVE key pair: NAME.key (secret, mode 0600) and NAME.pub (public)")
  )
