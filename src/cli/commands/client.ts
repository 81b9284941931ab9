/**
 * Commands that talk to a running server (DESIGN §7; upstream MP CLI,
 * reference §7): `ping`, `noop`, `get-chunk-size`, `clear`, `end-session`
 * over ZeroMQ and `status` over HTTP (a readable summary, StatusSummary.ts;
 * the raw document with `--json`). Each opens a fresh client, waits at
 * most `--timeout-seconds` (5), prints the answer on stdout and exits 0, or
 * prints why on stderr and exits 1.
 */
import { Console, Effect, Option } from "effect"
import { Argument, Command, Flag } from "effect/cli"
import { HttpClient, HttpClientRequest } from "effect/http"
import { FetchHttpClient } from "effect/http"
import { loggerLayer } from "../../layers/Logging.ts"
import { makeInstanceId } from "../../schema/InstanceId.ts"
import { decodeStatusDocument } from "../../schema/Status.ts"
import { Clear, EndSession, GetChunkSize, Noop, Ping } from "../../schema/Op.ts"
import { makeMqClient, type MqClientShape } from "../../services/client/MqClient.ts"
import { readTokenFile } from "../../services/auth/BearerToken.ts"
import { CommandFailed } from "../CommandFailed.ts"
import { formatStatus } from "../StatusSummary.ts"
import * as F from "./flags.ts"

const connection = {
  host: F.host,
  port: F.port,
  endpoint: F.endpoint,
  timeoutSeconds: F.timeoutSeconds,
  curveServerPublicKeyFile: F.curveServerPublicKeyFile,
  curveSecretKeyFile: F.curveSecretKeyFile
}

interface Connection extends F.CurveFlags {
  readonly host: string
  readonly port: number
  readonly endpoint: Option.Option<string>
  readonly timeoutSeconds: number
}

const fail = (message: string) =>
  Console.error(`mpcache: ${message}`).pipe(Effect.andThen(Effect.fail(new CommandFailed({ message, exitCode: 1 }))))

/** Runs `f` against a fresh client and prints its result; any failure → stderr, exit 1. */
const withClient = <E extends { readonly message: string }>(
  c: Connection,
  f: (client: MqClientShape) => Effect.Effect<string, E>
) => {
  const keys = F.curveKeysOf(c)
  if ("error" in keys) {
    return Console.error(`mpcache: ${keys.error}`).pipe(Effect.andThen(Effect.fail(new CommandFailed({ message: keys.error, exitCode: 2 }))))
  }
  return Effect.scoped(
    Effect.gen(function*() {
      const client = yield* makeMqClient({
        endpoint: F.endpointOf(c),
        requestTimeoutMs: c.timeoutSeconds * 1000,
        lingerMs: 0,
        ...(keys.curve === undefined ? {} : { curve: keys.curve })
      })
      return yield* f(client)
    })
  ).pipe(
    Effect.matchEffect({
      onFailure: (e) => fail(e.message),
      onSuccess: (out) => Console.log(out)
    }),
    Effect.provide(loggerLayer("pretty"))
  )
}

const instanceId = Flag.String("instance-id").pipe(
  Flag.withDescription(F.described("Ping on behalf of this instance id, a decimal integer from 0 to 2^63-1", "nil (an untracked prober)")),
  Flag.filter((s) => /^\d+$/.test(s) && BigInt(s) < 1n << 63n, (s) => `must be a decimal integer from 0 to 2^63-1 (got "${s}")`),
  Flag.optional
)

export const ping = Command.make("ping", { ...connection, instanceId }, (f) =>
  withClient(f, (client) =>
    client.request(Ping, [Option.match(f.instanceId, { onNone: () => null, onSome: (s) => makeInstanceId(BigInt(s)) })])
      .pipe(Effect.map(String)))).pipe(Command.withDescription("PING the server; prints true"))

export const noop = Command.make("noop", connection, (f) =>
  withClient(f, (client) => client.request(Noop, []))).pipe(Command.withDescription("NOOP; prints OK"))

export const getChunkSize = Command.make("get-chunk-size", connection, (f) =>
  withClient(f, (client) => client.request(GetChunkSize, []).pipe(Effect.map(String)))).pipe(
    Command.withDescription("Prints the server's chunk size in tokens")
  )

export const clear = Command.make(
  "clear",
  { ...connection, force: Flag.Boolean("force").pipe(Flag.withDescription(F.described("Also drop locked objects", false)), Flag.withDefault(false)) },
  (f) => withClient(f, (client) => client.request(Clear, [f.force]).pipe(Effect.as("Cache cleared successfully.")))
).pipe(Command.withDescription("Drops the server's cached objects"))

export const endSession = Command.make(
  "end-session",
  { ...connection, requestId: Argument.String("request-id") },
  (f) => withClient(f, (client) => client.request(EndSession, [f.requestId]).pipe(Effect.as(`Session ${f.requestId} ended.`)))
).pipe(Command.withDescription("Ends a request's session (releases its lookup locks)"))

export const status = Command.make(
  "status",
  {
    httpHost: F.httpHost,
    httpPort: F.httpPort,
    timeoutSeconds: F.timeoutSeconds,
    httpTokenFile: Flag.String("http-token-file").pipe(
      Flag.withDescription(F.described("File holding the bearer token of a frontend started with --http-token-file (docs/security.md)", "none: no token")),
      Flag.optional
    ),
    json: Flag.Boolean("json").pipe(Flag.withDescription(F.described("Print the raw /api/status JSON instead of the summary", false)), Flag.withDefault(false))
  },
  (f) =>
    Effect.gen(function*() {
      const host = f.httpHost.includes(":") && !f.httpHost.startsWith("[") ? `[${f.httpHost}]` : f.httpHost
      const url = `http://${host}:${f.httpPort}/api/status`
      const client = yield* HttpClient.HttpClient
      const token = Option.isSome(f.httpTokenFile) ? yield* readTokenFile(f.httpTokenFile.value) : undefined
      const request = token === undefined ? HttpClientRequest.get(url) : HttpClientRequest.get(url).pipe(HttpClientRequest.bearerToken(token))
      const response = yield* client.execute(request).pipe(Effect.timeout(`${f.timeoutSeconds} seconds`))
      if (response.status === 401) {
        return yield* Effect.fail(new Error(`GET ${url} answered 401: ${token === undefined ? "this frontend needs a bearer token: give --http-token-file" : "the token in --http-token-file is not this frontend's"}`))
      }
      const body = yield* response.json
      if (response.status !== 200) return yield* Effect.fail(new Error(`GET ${url} answered ${response.status}`))
      if (f.json) return JSON.stringify(body, null, 2)
      // The summary needs the document's shape: a server of another version fails naming the field.
      const doc = yield* decodeStatusDocument(body).pipe(
        Effect.mapError((e) => new Error(`${url} is not a status document this client reads (try --json): ${e.message}`))
      )
      return formatStatus(doc)
    }).pipe(
      Effect.matchEffect({
        onFailure: (e) => fail(`status: ${e instanceof Error ? e.message : String(e)}`),
        onSuccess: (out) => Console.log(out)
      }),
      Effect.provide(FetchHttpClient.layer),
      Effect.provide(loggerLayer("pretty"))
    )
).pipe(Command.withDescription("Prints a summary of the server's /api/status (instances and their states), read over HTTP from --http-host/--http-port (not the ZeroMQ --port); --json: the raw document"))
