/**
 * `mpcache replay`: runs a production trace (by default the Mooncake
 * conversation trace shipped in data/) through real worker processes, with
 * optional churn, and prints what happened. Exit status 1 when contexts
 * leaked, mappings stayed open, or any retrieved byte was wrong. With
 * `--report PATH.html` it also writes the run as one self-contained HTML
 * file of SVG charts (ReportHtml.ts, issue 17), before the checks decide the
 * exit status. CURVE (issue 14): `--curve` starts the replay's own server
 * with CURVE and per-run keys; with `--server`, `--curve-server-public-key-file`
 * and `--curve-secret-key-file` speak CURVE to a running server.
 */
import { writeFileSync } from "node:fs"
import path from "node:path"
import { Console, Effect, Option } from "effect"
import { CliError, Command, Flag } from "effect/cli"
import { packageRoot } from "../../PackageFiles.ts"
import { loggerLayer } from "../../layers/Logging.ts"
import { runReplay } from "../../replay/Driver.ts"
import { formatSummary, mustBeZero } from "../../replay/Report.ts"
import { reportHtml } from "../../replay/ReportHtml.ts"
import { MODEL_PRESETS } from "../../replay/Synth.ts"
import { CommandFailed } from "../CommandFailed.ts"
import * as F from "./flags.ts"

// From the package root (src/PackageFiles.ts), so the bundled command finds it as the sources do.
const DEFAULT_TRACE = path.join(packageRoot, "data", "mooncake-traces", "conversation_trace.jsonl")

const positive = (name: string, description: string) =>
  Flag.Finite(name).pipe(Flag.withDescription(description), Flag.filter((n) => n > 0, (n) => `must be above 0 (got ${n})`))

const flags = {
  trace: Flag.String("trace").pipe(Flag.withDescription("Mooncake-format JSONL trace"), Flag.withDefault(DEFAULT_TRACE)),
  requests: Flag.Int("requests").pipe(
    Flag.withDescription("Replay the first N requests (default: all)"),
    Flag.filter((n) => n >= 1, (n) => `must be at least 1 (got ${n})`),
    Flag.optional
  ),
  maxInputTokens: Flag.Int("max-input-tokens").pipe(
    Flag.withDescription("Skip (and count) requests with more input tokens than this: bounds each worker's KV cache"),
    Flag.filter((n) => n >= 1, (n) => `must be at least 1 (got ${n})`),
    Flag.optional
  ),
  workers: Flag.Int("workers").pipe(
    Flag.withDescription("Engine worker processes"),
    Flag.withDefault(2),
    Flag.filter((n) => n >= 1 && n <= 64, (n) => `must be from 1 to 64 (got ${n})`)
  ),
  rate: positive("rate", "Scale the trace's timestamps: 2 replays twice as fast").pipe(Flag.withDefault(1)),
  maxRate: Flag.Boolean("max-rate").pipe(Flag.withDescription("Ignore timestamps: send requests as fast as workers take them"), Flag.withDefault(false)),
  device: Flag.Literals("device", ["cpu", "cuda"] as const).pipe(
    Flag.withDescription("Where workers keep their KV cache: cpu (POSIX shared memory) or cuda (device memory, CUDA IPC; needs a GPU)"),
    Flag.withDefault<"cpu" | "cuda">("cpu")
  ),
  transferMode: Flag.Literals("transfer-mode", ["lmcache-driven", "engine-driven"] as const).pipe(
    Flag.withDescription(
      "How workers move KV: lmcache-driven (the server copies from each worker's registered KV cache) or engine-driven (workers copy their chunks through the server's shared L1 pool: PREPARE/COMMIT)"
    ),
    Flag.withDefault<"lmcache-driven" | "engine-driven">("lmcache-driven")
  ),
  model: Flag.Literals("model", ["small", "llama3-8b"] as const).pipe(
    Flag.withDescription("KV shape preset: small (2 layers × 2 × 16, runs in seconds) or llama3-8b (32 × 8 × 128 float16)"),
    Flag.withDefault<"small" | "llama3-8b">("small")
  ),
  l1SizeGb: positive("l1-size-gb", "L1 capacity of each of the replay's own servers").pipe(Flag.withDefault(1)),
  servers: Flag.Int("servers").pipe(
    Flag.withDescription(
      "Start this many servers, each with its own L1 and --workers workers; each conversation's turns go to them round-robin (with --l2-url they share one L2)"
    ),
    Flag.withDefault(1),
    Flag.filter((n) => n >= 1 && n <= 16, (n) => `must be from 1 to 16 (got ${n})`)
  ),
  l2Url: Flag.String("l2-url").pipe(
    Flag.withDescription("Give every server the replay starts this L2 (mpcache serve --l2-url: redis://host:port or redis+cluster://host:port,…)"),
    Flag.optional
  ),
  server: Flag.String("server").pipe(
    Flag.withDescription("Use a running server at this ZeroMQ endpoint instead of starting one"),
    Flag.optional
  ),
  httpUrl: Flag.String("http-url").pipe(
    Flag.withDescription("HTTP frontend of --server (status and metrics)"),
    Flag.withDefault("http://127.0.0.1:8080")
  ),
  l2LookupTimeoutMs: Flag.Int("l2-lookup-timeout-ms").pipe(
    Flag.withDescription("With --l2-url: each server's --l2-lookup-timeout-ms (default: the server's own)"),
    Flag.filter((n) => n >= 1, (n) => `must be at least 1 (got ${n})`),
    Flag.optional
  ),
  killEvery: positive("kill-every", "SIGKILL a random worker every S seconds and start a replacement").pipe(Flag.optional),
  killEveryRequests: Flag.Int("kill-every-requests").pipe(
    Flag.withDescription("SIGKILL a random worker after every N completed requests and start a replacement (chaos by progress, not time)"),
    Flag.filter((n) => n >= 1, (n) => `must be at least 1 (got ${n})`),
    Flag.optional
  ),
  pauseEvery: positive("pause-every", "SIGSTOP a random worker every S seconds, SIGCONT it after --pause-seconds").pipe(Flag.optional),
  pauseSeconds: positive("pause-seconds", "How long a paused worker stays stopped").pipe(Flag.withDefault(3)),
  disconnectGrace: Flag.Finite("worker-disconnect-grace-seconds").pipe(
    Flag.withDescription("Disconnect grace of the replay's own server"),
    Flag.withDefault(2),
    Flag.filter((n) => n > 0, (n) => `must be above 0 (got ${n})`)
  ),
  chunkSize: Flag.Int("chunk-size").pipe(Flag.withDescription("Chunk size of the replay's own server, tokens"), Flag.withDefault(256)),
  curve: Flag.Boolean("curve").pipe(
    Flag.withDescription("Start the replay's own server with CURVE, with a per-run key pair and authorized-keys file (removed at the end)"),
    Flag.withDefault(false)
  ),
  curveServerPublicKeyFile: F.curveServerPublicKeyFile,
  curveSecretKeyFile: F.curveSecretKeyFile,
  json: Flag.Boolean("json").pipe(Flag.withDescription("Print the summary as JSON on stdout"), Flag.withDefault(false)),
  report: Flag.String("report").pipe(
    Flag.withDescription("Also write an HTML report with charts (latency, hit ratio vs a perfect LRU, workers and churn, bytes) to this path"),
    Flag.optional
  )
}

export const replay = Command.make("replay", flags, (f) =>
  Effect.gen(function*() {
    const { summary, timeline } = yield* Effect.scoped(
      runReplay(
        {
          tracePath: f.trace,
          requests: Option.getOrUndefined(f.requests),
          maxInputTokens: Option.getOrUndefined(f.maxInputTokens),
          workers: f.workers,
          servers: f.servers,
          l2Url: Option.getOrUndefined(f.l2Url),
          l2LookupTimeoutMs: Option.getOrUndefined(f.l2LookupTimeoutMs),
          transferMode: f.transferMode,
          device: f.device,
          rate: f.rate,
          maxRate: f.maxRate,
          model: MODEL_PRESETS[f.model]!,
          l1SizeGb: f.l1SizeGb,
          server: Option.getOrUndefined(f.server),
          httpUrl: f.httpUrl.replace(/\/+$/, ""),
          killEverySeconds: Option.getOrUndefined(f.killEvery),
          killEveryRequests: Option.getOrUndefined(f.killEveryRequests),
          pauseEverySeconds: Option.getOrUndefined(f.pauseEvery),
          pauseSeconds: f.pauseSeconds,
          disconnectGraceSeconds: f.disconnectGrace,
          chunkSizeTokens: f.chunkSize,
          blockSizeTokens: 16,
          heartbeatIntervalMs: 2_000,
          curve: f.curve
            ? "generate"
            : Option.isSome(f.curveServerPublicKeyFile) && Option.isSome(f.curveSecretKeyFile)
            ? { serverPublicKeyFile: f.curveServerPublicKeyFile.value, secretKeyFile: f.curveSecretKeyFile.value }
            : undefined,
          progress: true
        },
        (line, final) => {
          if (process.stderr.isTTY) process.stderr.write(`\r${line}${final ? "\n" : ""}`)
          else process.stderr.write(`${line}\n`)
        }
      )
    ).pipe(
      Effect.catch((e) =>
        Console.error(`mpcache replay: ${e.message}`).pipe(
          Effect.andThen(Effect.fail(new CommandFailed({ message: e.message, exitCode: 1 })))
        )
      )
    )
    yield* Console.log(f.json ? JSON.stringify(summary, null, 2) : formatSummary(summary))
    if (Option.isSome(f.report)) {
      const path = f.report.value
      yield* Effect.try({
        try: () => writeFileSync(path, reportHtml(summary, timeline)),
        catch: (e) => new CommandFailed({ message: `cannot write --report ${path}: ${e instanceof Error ? e.message : String(e)}`, exitCode: 1 })
      }).pipe(Effect.tapError((e) => Console.error(`mpcache replay: ${e.message}`)))
      yield* Console.error(`mpcache replay: report written to ${path}`)
    }
    const bad = Object.entries(mustBeZero(summary)).filter(([, v]) => v !== 0)
    if (bad.length > 0) {
      const message = `replay failed its checks: ${bad.map(([k, v]) => `${k} = ${v}`).join(", ")}`
      yield* Console.error(`mpcache replay: ${message}`)
      return yield* new CommandFailed({ message, exitCode: 1 })
    }
  }).pipe(Effect.provide(loggerLayer("pretty")))).pipe(
  Command.validate((f) => {
    const invalid = (message: string) => Effect.fail(new CliError.ValidationError({ message }))
    if (f.device === "cuda" && f.transferMode === "engine-driven") {
      return invalid("--device cuda applies to --transfer-mode lmcache-driven (engine-driven workers copy through the server's host pool)")
    }
    const keyFlags = Option.isSome(f.curveServerPublicKeyFile) || Option.isSome(f.curveSecretKeyFile)
    if (f.curve && Option.isSome(f.server)) {
      return invalid("--curve makes keys for the replay's own server; to speak CURVE to --server give --curve-server-public-key-file and --curve-secret-key-file")
    }
    if (keyFlags && Option.isNone(f.server)) {
      return invalid("--curve-server-public-key-file and --curve-secret-key-file apply to --server (a running CURVE server); for the replay's own server use --curve")
    }
    if (Option.isSome(f.curveServerPublicKeyFile) !== Option.isSome(f.curveSecretKeyFile)) {
      return invalid(Option.isSome(f.curveSecretKeyFile)
        ? "--curve-secret-key-file needs --curve-server-public-key-file too"
        : "--curve-server-public-key-file needs --curve-secret-key-file too")
    }
    if (Option.isSome(f.l2LookupTimeoutMs) && Option.isNone(f.l2Url)) return invalid("--l2-lookup-timeout-ms applies with --l2-url")
    if (Option.isSome(f.server) && (f.servers > 1 || Option.isSome(f.l2Url))) {
      return invalid("--servers and --l2-url apply to the servers the replay starts, not to --server (a running server has its own flags)")
    }
    return Effect.void
  }),
  Command.withDescription("Replay a production trace through real worker processes (see README: Run it on a real trace)")
)
