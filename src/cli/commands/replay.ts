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
import { randomUUID } from "node:crypto"
import { writeFileSync } from "node:fs"
import path from "node:path"
import { Console, Effect, Option } from "effect"
import { CliError, Command, Flag } from "effect/cli"
import { packageRoot } from "../../PackageFiles.ts"
import { loggerLayer } from "../../layers/Logging.ts"
import { runReplay } from "../../replay/Driver.ts"
import { formatSummary, mustBeZero, policyComparison } from "../../replay/Report.ts"
import type { ReplayOptions } from "../../replay/ReplayOptions.ts"
import type { ReplayRouterPolicy } from "../../replay/ReplaySummary.ts"
import { reportHtml } from "../../replay/ReportHtml.ts"
import { MODEL_PRESETS } from "../../replay/Synth.ts"
import { CommandFailed } from "../CommandFailed.ts"
import * as F from "./flags.ts"
import { MAX_CHUNK_SIZE_TOKENS } from "../../schema/Limits.ts"
import { rules } from "../../services/server/ServerConfig.ts"

// From the package root (src/PackageFiles.ts), so the bundled command finds it as the sources do.
const DEFAULT_TRACE = path.join(packageRoot, "data", "mooncake-traces", "conversation_trace.jsonl")

/** A number above 0, its rule and default shown in --help. */
const positive = (name: string, description: string, shown: string | number) =>
  Flag.Finite(name).pipe(
    Flag.withDescription(F.described(`${description}; > 0`, shown)),
    Flag.filter((n) => n > 0, (n) => `must be above 0 (got ${n})`)
  )

const POLICIES: ReadonlyArray<ReplayRouterPolicy> = ["round-robin", "kv-aware"]

/** `--router`: one policy or a comma list of distinct ones, run one after the other on the same trace. */
const routersOf = (s: string): ReadonlyArray<ReplayRouterPolicy> | string => {
  const list = s.split(",").map((p) => p.trim())
  const bad = list.find((p) => !POLICIES.includes(p as ReplayRouterPolicy))
  if (bad !== undefined) return `must be ${POLICIES.join(" or ")}, or a comma list of them (got "${bad}")`
  if (new Set(list).size !== list.length) return `names a policy twice (got "${s}")`
  return list as ReadonlyArray<ReplayRouterPolicy>
}

/** The replay's defaults, each shown in --help. */
const DEFAULTS = {
  workers: 2,
  rate: 1,
  device: "cpu",
  transferMode: "lmcache-driven",
  model: "small",
  l1SizeGb: 1,
  servers: 1,
  httpUrl: "http://127.0.0.1:8080",
  pauseSeconds: 3,
  disconnectGraceSeconds: 2,
  l1Prefault: true,
  chunkSize: 256
} as const

const flags = {
  trace: Flag.String("trace").pipe(
    Flag.withDescription(F.described("Mooncake-format JSONL trace", "the conversation trace shipped in data/mooncake-traces/")),
    Flag.withDefault(DEFAULT_TRACE)
  ),
  requests: Flag.Int("requests").pipe(
    Flag.withDescription(F.described("Replay the first N requests; >= 1", "all")),
    Flag.filter((n) => n >= 1, (n) => `must be at least 1 (got ${n})`),
    Flag.optional
  ),
  maxInputTokens: Flag.Int("max-input-tokens").pipe(
    Flag.withDescription(F.described("Skip (and count) requests with more input tokens than this: bounds each worker's KV cache; >= 1", "none skipped")),
    Flag.filter((n) => n >= 1, (n) => `must be at least 1 (got ${n})`),
    Flag.optional
  ),
  workers: Flag.Int("workers").pipe(
    Flag.withDescription(F.described("Engine worker processes, 1 to 64", DEFAULTS.workers)),
    Flag.withDefault(DEFAULTS.workers),
    Flag.filter((n) => n >= 1 && n <= 64, (n) => `must be from 1 to 64 (got ${n})`)
  ),
  rate: positive("rate", "Scale the trace's timestamps: 2 replays twice as fast", DEFAULTS.rate).pipe(Flag.withDefault(DEFAULTS.rate)),
  maxRate: Flag.Boolean("max-rate").pipe(
    Flag.withDescription(F.described("Ignore timestamps: send requests as fast as workers take them", false)),
    Flag.withDefault(false)
  ),
  device: Flag.Literals("device", ["cpu", "cuda"] as const).pipe(
    Flag.withDescription(F.described("Where workers keep their KV cache: cpu (POSIX shared memory) or cuda (device memory, CUDA IPC; needs a GPU)", DEFAULTS.device)),
    Flag.withDefault<"cpu" | "cuda">(DEFAULTS.device)
  ),
  transferMode: Flag.Literals("transfer-mode", ["lmcache-driven", "engine-driven"] as const).pipe(
    Flag.withDescription(F.described(
      "How workers move KV: lmcache-driven (the server copies from each worker's registered KV cache) or engine-driven (workers copy their chunks through the server's shared L1 pool: PREPARE/COMMIT)",
      DEFAULTS.transferMode
    )),
    Flag.withDefault<"lmcache-driven" | "engine-driven">(DEFAULTS.transferMode)
  ),
  model: Flag.Literals("model", ["small", "llama3-8b"] as const).pipe(
    Flag.withDescription(F.described("KV shape preset: small (2 layers × 2 × 16, runs in seconds) or llama3-8b (32 × 8 × 128 float16)", DEFAULTS.model)),
    Flag.withDefault<"small" | "llama3-8b">(DEFAULTS.model)
  ),
  l1SizeGb: positive("l1-size-gb", "L1 capacity of each of the replay's own servers, GiB", DEFAULTS.l1SizeGb).pipe(Flag.withDefault(DEFAULTS.l1SizeGb)),
  servers: Flag.Int("servers").pipe(
    Flag.withDescription(F.described(
      "Start this many servers, 1 to 16, each with its own L1 and --workers workers; each conversation's turns go to them round-robin (with --l2-url they share one L2)",
      DEFAULTS.servers
    )),
    Flag.withDefault(DEFAULTS.servers),
    Flag.filter((n) => n >= 1 && n <= 16, (n) => `must be from 1 to 16 (got ${n})`)
  ),
  router: Flag.String("router").pipe(
    Flag.withDescription(F.described(
      "How requests go to the servers: round-robin (each conversation's turns in turn) or kv-aware (each request to the server whose KV event stream says it holds the longest prefix; ends with an index audit); a comma list runs the trace once per policy on fresh servers and compares them",
      "round-robin"
    )),
    Flag.withDefault("round-robin"),
    Flag.filter((s) => typeof routersOf(s) !== "string", (s) => routersOf(s) as string)
  ),
  restartServerEveryRequests: Flag.Int("restart-server-every-requests").pipe(
    Flag.withDescription(F.described("SIGTERM and restart one of the replay's servers, in turn, after every N completed requests (its workers re-register); >= 1", "none")),
    Flag.filter((n) => n >= 1, (n) => `must be at least 1 (got ${n})`),
    Flag.optional
  ),
  l2Url: Flag.String("l2-url").pipe(
    Flag.withDescription(F.described("Give every server the replay starts this L2 (mpcache serve --l2-url: redis://host:port or redis+cluster://host:port,…)", "none: no L2")),
    Flag.optional
  ),
  server: Flag.String("server").pipe(
    Flag.withDescription(F.described("Use a running server at this ZeroMQ endpoint instead of starting one", "none: the replay starts its own")),
    Flag.optional
  ),
  httpUrl: Flag.String("http-url").pipe(
    Flag.withDescription(F.described("HTTP frontend of --server (status and metrics)", DEFAULTS.httpUrl)),
    Flag.withDefault(DEFAULTS.httpUrl)
  ),
  l2LookupTimeoutMs: Flag.Int("l2-lookup-timeout-ms").pipe(
    Flag.withDescription(F.described("With --l2-url: each server's --l2-lookup-timeout-ms; >= 1", "the server's own")),
    Flag.filter((n) => n >= 1, (n) => `must be at least 1 (got ${n})`),
    Flag.optional
  ),
  killEvery: positive("kill-every", "SIGKILL a random worker every S seconds and start a replacement", "none").pipe(Flag.optional),
  killEveryRequests: Flag.Int("kill-every-requests").pipe(
    Flag.withDescription(F.described("SIGKILL a random worker after every N completed requests and start a replacement (chaos by progress, not time); >= 1", "none")),
    Flag.filter((n) => n >= 1, (n) => `must be at least 1 (got ${n})`),
    Flag.optional
  ),
  pauseEvery: positive("pause-every", "SIGSTOP a random worker every S seconds, SIGCONT it after --pause-seconds", "none").pipe(Flag.optional),
  pauseSeconds: positive("pause-seconds", "How long a paused worker stays stopped", DEFAULTS.pauseSeconds).pipe(Flag.withDefault(DEFAULTS.pauseSeconds)),
  disconnectGrace: Flag.Finite("worker-disconnect-grace-seconds").pipe(
    Flag.withDescription(F.described("Disconnect grace of the replay's own server, seconds; > 0", DEFAULTS.disconnectGraceSeconds)),
    Flag.withDefault(DEFAULTS.disconnectGraceSeconds),
    Flag.filter((n) => n > 0, (n) => `must be above 0 (got ${n})`)
  ),
  l1Prefault: Flag.Boolean("l1-prefault").pipe(
    Flag.withDescription(F.described("Prefault the L1 pools of the replay's own servers at their start, as mpcache serve does (--no-l1-prefault to skip)", DEFAULTS.l1Prefault)),
    Flag.withDefault(DEFAULTS.l1Prefault)
  ),
  chunkSize: Flag.Int("chunk-size").pipe(
    Flag.withDescription(F.described(`Chunk size of the replay's own server, tokens, 1 to ${MAX_CHUNK_SIZE_TOKENS}`, DEFAULTS.chunkSize)),
    Flag.withDefault(DEFAULTS.chunkSize),
    Flag.filter((n) => rules.chunkSize(n) === undefined, (n) => rules.chunkSize(n) ?? "")
  ),
  curve: Flag.Boolean("curve").pipe(
    Flag.withDescription(F.described("Start the replay's own server with CURVE, with a per-run key pair and authorized-keys file (removed at the end)", false)),
    Flag.withDefault(false)
  ),
  curveServerPublicKeyFile: F.curveServerPublicKeyFile,
  curveSecretKeyFile: F.curveSecretKeyFile,
  json: Flag.Boolean("json").pipe(Flag.withDescription(F.described("Print the summary as JSON on stdout", false)), Flag.withDefault(false)),
  report: Flag.String("report").pipe(
    Flag.withDescription(F.described("Also write an HTML report with charts (latency, hit ratio vs a perfect LRU, workers and churn, bytes) to this path", "none")),
    Flag.optional
  )
}

export const replay = Command.make("replay", flags, (f) =>
  Effect.gen(function*() {
    const policies = routersOf(f.router) as ReadonlyArray<ReplayRouterPolicy>
    const options = (router: ReplayRouterPolicy): ReplayOptions => ({
      tracePath: f.trace,
      requests: Option.getOrUndefined(f.requests),
      maxInputTokens: Option.getOrUndefined(f.maxInputTokens),
      workers: f.workers,
      servers: f.servers,
      l2Url: Option.getOrUndefined(f.l2Url),
      // Policies compared over one L2 each write keys of their own: one policy's run must not warm the next's.
      l2KeyPrefix: policies.length > 1 && Option.isSome(f.l2Url) ? `mpc-${router}-${randomUUID().slice(0, 8)}` : undefined,
      l2LookupTimeoutMs: Option.getOrUndefined(f.l2LookupTimeoutMs),
      router,
      restartServerEveryRequests: Option.getOrUndefined(f.restartServerEveryRequests),
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
      l1Prefault: f.l1Prefault,
      chunkSizeTokens: f.chunkSize,
      blockSizeTokens: 16,
      heartbeatIntervalMs: 2_000,
      curve: f.curve
        ? "generate"
        : Option.isSome(f.curveServerPublicKeyFile) && Option.isSome(f.curveSecretKeyFile)
        ? { serverPublicKeyFile: f.curveServerPublicKeyFile.value, secretKeyFile: f.curveSecretKeyFile.value }
        : undefined,
      progress: true
    })
    // One policy after the other, each on servers of its own (started and stopped with its scope).
    const runs = yield* Effect.forEach(policies, (router) =>
      Effect.scoped(
        runReplay(options(router), (line, final) => {
          const tagged = policies.length > 1 ? `[${router}] ${line}` : line
          if (process.stderr.isTTY) process.stderr.write(`\r${tagged}${final ? "\n" : ""}`)
          else process.stderr.write(`${tagged}\n`)
        })
      ).pipe(
        Effect.catch((e) =>
          Console.error(`mpcache replay: ${e.message}`).pipe(
            Effect.andThen(Effect.fail(new CommandFailed({ message: e.message, exitCode: 1 })))
          )
        )
      ))
    const summaries = runs.map((r) => r.summary)
    if (f.json) yield* Console.log(JSON.stringify(summaries.length === 1 ? summaries[0] : { runs: summaries }, null, 2))
    else yield* Console.log([...summaries.map(formatSummary), ...(summaries.length > 1 ? policyComparison(summaries) : [])].join("\n"))
    if (Option.isSome(f.report)) {
      const path = f.report.value
      const { summary, timeline } = runs[0]!
      yield* Effect.try({
        try: () => writeFileSync(path, reportHtml(summary, timeline, summaries)),
        catch: (e) => new CommandFailed({ message: `cannot write --report ${path}: ${e instanceof Error ? e.message : String(e)}`, exitCode: 1 })
      }).pipe(Effect.tapError((e) => Console.error(`mpcache replay: ${e.message}`)))
      yield* Console.error(`mpcache replay: report written to ${path}${runs.length > 1 ? ` (charts of the ${policies[0]} run)` : ""}`)
    }
    const bad = summaries.flatMap((s) =>
      Object.entries(mustBeZero(s)).filter(([, v]) => v !== 0).map(([k, v]) => (summaries.length > 1 ? `${s.router.policy}: ${k} = ${v}` : `${k} = ${v}`))
    )
    if (bad.length > 0) {
      const message = `replay failed its checks: ${bad.join(", ")}`
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
    if (Option.isSome(f.server) && (f.router !== "round-robin" || Option.isSome(f.restartServerEveryRequests))) {
      return invalid("--router kv-aware and --restart-server-every-requests apply to the servers the replay starts, not to --server")
    }
    if (Option.isSome(f.server) && (f.servers > 1 || Option.isSome(f.l2Url))) {
      return invalid("--servers and --l2-url apply to the servers the replay starts, not to --server (a running server has its own flags)")
    }
    return Effect.void
  }),
  Command.withDescription("Replay a production trace through real worker processes (see README: Run it on a real trace)")
)
