/**
 * Messages between the replay driver and its worker processes (Node IPC
 * channel of `child_process.fork`). Plain JSON; instance ids as decimal
 * strings.
 */

/**
 * How a worker moves KV: `lmcache-driven` (the server copies between the
 * worker's registered paged KV cache and L1: REGISTER_KV_CACHE, STORE,
 * RETRIEVE) or `engine-driven` (the worker copies its chunk objects itself
 * through the server's shared L1 pool: PREPARE/COMMIT).
 */
export type TransferMode = "lmcache-driven" | "engine-driven"

/** A client's CURVE key files: `--curve-server-public-key-file` and `--curve-secret-key-file`. */
export interface CurveKeyFiles {
  readonly serverPublicKeyFile: string
  readonly secretKeyFile: string
}

/** Settings a worker starts with (its first argv, JSON). */
export interface WorkerSettings {
  readonly endpoint: string
  readonly transferMode: TransferMode
  /** Where the LMCache-driven KV cache lives: POSIX shared memory, or device memory shared by CUDA IPC. */
  readonly device: "cpu" | "cuda"
  readonly modelName: string
  readonly numLayers: number
  readonly numHeads: number
  readonly headSize: number
  readonly dtype: "float16" | "bfloat16" | "float32"
  readonly blockSizeTokens: number
  /** Blocks in the worker's KV cache (block 0 is never used: vLLM's null block). */
  readonly numBlocks: number
  readonly heartbeatIntervalMs: number
  readonly namePrefix: string
  /**
   * CURVE: the key files the worker reads at start (never the keys
   * themselves: argv is readable by every user of the machine through
   * /proc/PID/cmdline); absent: no CURVE.
   */
  readonly curve?: CurveKeyFiles
}

/** One request for a worker: retrieve the hit prefix, compute the rest, store the new chunks. */
export interface RunRequest {
  readonly _tag: "Run"
  readonly index: number
  readonly requestId: string
  readonly hashIds: ReadonlyArray<number>
  readonly inputLength: number
  /** Tokens the scheduler's lookup found (a multiple of the chunk size). */
  readonly hitTokens: number
}

export interface Shutdown {
  readonly _tag: "Shutdown"
}

export type DriverMessage = RunRequest | Shutdown

export interface Ready {
  readonly _tag: "Ready"
  readonly instanceId: string
  readonly pid: number
  readonly chunkSizeTokens: number
}

/** Result of one request. Times in ms; byte counts of KV moved. */
export interface Done {
  readonly _tag: "Done"
  readonly index: number
  readonly retrieveOk: boolean
  readonly storeOk: boolean
  readonly retrievedChunks: number
  readonly storedChunks: number
  readonly retrievedBytes: number
  readonly storedBytes: number
  /**
   * Hit chunks of a RETRIEVE that brought nothing: `notSent`, the worker did not send it (degraded mode: its
   * heartbeat had failed, WorkerAdapter.ts); `failed`, it was sent and failed or was answered false.
   */
  readonly unservedRetrieveChunks: { readonly notSent: number; readonly failed: number }
  /** Chunks whose retrieved bytes differ from what this worker computes for them. */
  readonly mismatchedChunks: ReadonlyArray<number>
  readonly retrieveMs: number
  readonly storeMs: number
  readonly computeMs: number
  readonly reregistrations: number
  readonly healthy: boolean
}

export interface Failed {
  readonly _tag: "Failed"
  readonly index: number
  readonly message: string
}

export type WorkerMessage = Ready | Done | Failed
