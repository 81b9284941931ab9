/**
 * What `mpcache replay` is asked to do (its flags, parsed: src/cli/commands/replay.ts)
 * and how a replay fails to run (`ReplayError`). The driver is Driver.ts.
 */
import { Schema } from "effect"
import type { CurveKeyFiles, TransferMode } from "./Messages.ts"
import type { ReplayRouterPolicy } from "./ReplaySummary.ts"
import type { ModelPreset } from "./Synth.ts"

export interface ReplayOptions {
  readonly tracePath: string
  /** First N usable requests; all when undefined. */
  readonly requests: number | undefined
  /** Requests with more input tokens are skipped (and counted); undefined = none skipped. */
  readonly maxInputTokens: number | undefined
  /** Engine workers per server. */
  readonly workers: number
  /** Servers the replay starts (each its own L1 and workers); 1 without `--servers`. */
  readonly servers: number
  /** Given to every server the replay starts as `--l2-url` (issue 15); undefined: no L2. */
  readonly l2Url: string | undefined
  /** With `l2Url`: every server's `--l2-key-prefix` (a run of its own in a shared store); undefined: the server's default. */
  readonly l2KeyPrefix?: string | undefined
  /**
   * How requests are spread over the servers (issue 28 item 6): `round-robin` (each conversation's turns in turn,
   * Routing.ts) or `kv-aware` (KvRouter.ts: the longest prefix each server's KV event stream says it holds).
   */
  readonly router: ReplayRouterPolicy
  /** SIGTERM and restart one of the replay's servers (in turn) after every this many completed requests; undefined: never. */
  readonly restartServerEveryRequests?: number | undefined
  /** With `l2Url`: every server's `--l2-lookup-timeout-ms`; undefined: the server's default. */
  readonly l2LookupTimeoutMs: number | undefined
  /** How the workers move KV (`--transfer-mode`). */
  readonly transferMode: TransferMode
  /** `cuda`: LMCache-driven workers keep their KV cache in device memory (CUDA IPC); needs a GPU. */
  readonly device: "cpu" | "cuda"
  /** Trace time is divided by this (2 = twice as fast). */
  readonly rate: number
  /** Ignore timestamps: send each request as soon as a worker is free. */
  readonly maxRate: boolean
  readonly model: ModelPreset
  readonly l1SizeGb: number
  /** A running server's ZeroMQ endpoint; undefined = start our own. */
  readonly server: string | undefined
  /** Base URL of that server's HTTP frontend (status, metrics). */
  readonly httpUrl: string
  readonly killEverySeconds: number | undefined
  /** SIGKILL a worker after every this many completed requests (`--kill-every-requests`): chaos driven by the run's progress, so it happens on a fast machine as on a slow one. */
  readonly killEveryRequests?: number | undefined
  readonly pauseEverySeconds: number | undefined
  /** How long a paused worker stays stopped. */
  readonly pauseSeconds: number
  /** Our own server's `--worker-disconnect-grace-seconds`. */
  readonly disconnectGraceSeconds: number
  /** Whether our own servers prefault their L1 pools (`--l1-prefault`, as serve's); absent: they do. */
  readonly l1Prefault?: boolean | undefined
  readonly chunkSizeTokens: number
  readonly blockSizeTokens: number
  readonly heartbeatIntervalMs: number
  /**
   * CURVE (docs/security.md): `"generate"` turns it on for the replay's own
   * server with per-run keys (RunKeys.ts); key files speak it to `server`
   * (a running CURVE server: `--curve-server-public-key-file`,
   * `--curve-secret-key-file`); undefined: off.
   */
  readonly curve: "generate" | CurveKeyFiles | undefined
  /** Progress output: a bar on a terminal, plain lines otherwise, nothing when false. */
  readonly progress: boolean
}

/** The replay could not run (server or workers failed to start). */
export class ReplayError extends Schema.TaggedError<ReplayError>()("ReplayError", { message: Schema.String }) {}
