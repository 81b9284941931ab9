/**
 * One load process of bench:soak. The parent forks it per role with an IPC
 * channel (`startSoakLoad`); the child sets its role up, says `ready`, then
 * runs exactly the number of operations each `run` message asks for and
 * answers `done` with what it saw; `stop` closes everything it opened
 * (UNREGISTER, sockets) and exits. Roles (shapes in bench/soak/shape.ts):
 *
 * - `ping`: raw PING [nil] through the benches' DEALER client
 *   (bench/lib/pingClient.ts `pingLoop`), 2 DEALERs each with one PING in
 *   flight, new DEALERs (new connections) for every run; round trips in µs.
 * - `sessions`: a WorkerAdapter with a PagedKvCache in POSIX shm stores the
 *   PREFIXES prefixes once at setup; every operation is then one
 *   LOOKUP/QUERY_PREFETCH_STATUS/END_SESSION triple through the
 *   SchedulerAdapter, on a fresh request id, hitting a stored prefix.
 * - `unended`: LOOKUPs (with their QUERY polls) never ended: every other one
 *   hits a stored prefix (its read locks stay until the lock TTL), the rest
 *   ask for a model no one registered.
 * - `prepare`: an engine-driven context (EngineDrivenWorkerAdapter); every
 *   operation is one PREPARE_STORE of a fresh one-chunk key, never committed.
 * - `register`: REGISTER_KV_CACHE / UNREGISTER_KV_CACHE cycles of a new
 *   WorkerAdapter (new instance id, new connection) over one PagedKvCache.
 *
 * Every run is bounded by its count and by the requests' own timeouts.
 */
import { fork, type ChildProcess } from "node:child_process"
import { Effect, Exit, Layer, ManagedRuntime, References, Scope } from "effect"
import { ClientLive } from "../../src/layers/Client.ts"
import { loggerLayer } from "../../src/layers/Logging.ts"
import type { NativeMemory } from "../../src/native/Native.ts"
import type { CacheKey } from "../../src/schema/CacheKey.ts"
import { PrepareStore } from "../../src/schema/Op.ts"
import { makeEngineDrivenWorkerAdapterWith } from "../../src/services/client/EngineDrivenWorkerAdapter.ts"
import { makeMqClient } from "../../src/services/client/MqClient.ts"
import { makePagedKvCache } from "../../src/services/client/PagedKvCache.ts"
import { makeSchedulerAdapter, type SchedulerAdapterShape } from "../../src/services/client/SchedulerAdapter.ts"
import { makeWorkerAdapter } from "../../src/services/client/WorkerAdapter.ts"
import type { ZmqSockets } from "../../src/services/zmq/Sockets.ts"
import type { Tracker } from "../lib/children.ts"
import { pingLoop, type PingRun } from "../lib/pingClient.ts"
import {
  BLOCK_TOKENS,
  CHUNK_TOKENS,
  DTYPE,
  freshTokens,
  HEAD_SIZE,
  KV_GEOMETRY,
  MODEL_ED,
  MODEL_LM,
  MODEL_NOBODY,
  NUM_HEADS,
  NUM_LAYERS,
  PREFIX_TOKENS,
  PREFIXES,
  prefixTokens
} from "./shape.ts"
import { summarizeUs, type LatencySummary } from "../lib/stats.ts"

export type SoakRole = "ping" | "sessions" | "unended" | "prepare" | "register"

/** What one run did. */
export interface RunDone {
  readonly count: number
  readonly seconds: number
  /** sessions/unended: lookups that did not hit the whole stored prefix (the unknown model's excepted). */
  readonly misses: number
  /** prepare: chunks the server reserved for the PREPAREs of this run. */
  readonly reserved: number
  /** ping: round trips of this run, µs. */
  readonly ping?: LatencySummary
}

type ToChild = { readonly type: "run"; readonly count: number } | { readonly type: "stop" }
type FromChild =
  | { readonly type: "ready" }
  | ({ readonly type: "done" } & RunDone)
  | { readonly type: "failed"; readonly why: string }

/** The parent's handle on one load process. */
export interface SoakLoad {
  readonly role: SoakRole
  readonly ready: Promise<void>
  /** Runs exactly `count` operations; resolves with what the child saw. */
  readonly run: (count: number) => Promise<RunDone>
  /** Asks the child to close what it opened and exit; SIGKILL after `timeoutMs`. */
  readonly stop: (timeoutMs: number) => Promise<void>
  /** Rejects when the child fails or exits before `stop()`. */
  readonly failed: Promise<never>
}

/** Forks the load process of `role` against `endpoint`; its segment names start with `tag`. */
export const startSoakLoad = (role: SoakRole, endpoint: string, tag: string, tracker: Tracker): SoakLoad => {
  const child: ChildProcess = fork(import.meta.filename, [role, endpoint, tag], { stdio: ["ignore", "inherit", "inherit", "ipc"] })
  tracker.add(child)
  let stopping = false
  let onReady: () => void = () => {}
  const ready = new Promise<void>((resolve) => {
    onReady = resolve
  })
  const waiters: Array<(d: RunDone) => void> = []
  const failed = new Promise<never>((_, reject) => {
    child.on("message", (m: FromChild) => {
      if (m.type === "ready") onReady()
      else if (m.type === "done") waiters.shift()?.(m)
      else reject(new Error(`soak load "${role}" failed: ${m.why}`))
    })
    child.once("exit", (code, signal) => {
      tracker.delete(child)
      if (!stopping) reject(new Error(`soak load "${role}" exited (code ${code}, signal ${signal})`))
    })
  })
  failed.catch(() => {}) // observed where it is raced
  return {
    role,
    ready: Promise.race([ready, failed]),
    run: (count) =>
      Promise.race([
        new Promise<RunDone>((resolve) => {
          waiters.push(resolve)
          child.send({ type: "run", count } satisfies ToChild)
        }),
        failed
      ]),
    stop: (timeoutMs) =>
      new Promise((resolve) => {
        stopping = true
        if (child.exitCode !== null || child.signalCode !== null) return resolve()
        const timer = setTimeout(() => child.kill("SIGKILL"), timeoutMs)
        child.once("exit", () => {
          clearTimeout(timer)
          resolve()
        })
        child.send({ type: "stop" } satisfies ToChild)
      }),
    failed
  }
}

// ------------------------------------------------------------- child side

const REQUEST_TIMEOUT_MS = 30_000
/** Operations in flight per Effect-client role: enough to keep the server busy on a small machine. */
const CONCURRENCY: Record<Exclude<SoakRole, "ping">, number> = { sessions: 8, unended: 8, prepare: 4, register: 2 }
const PING_CLIENTS = 2

/** `total` split into `parts` near-equal non-negative integers. */
const split = (total: number, parts: number): Array<number> =>
  Array.from({ length: parts }, (_, i) => Math.floor(((i + 1) * total) / parts) - Math.floor((i * total) / parts))

/** A PingRun's latency sink that stops its loop after exactly `limit` PINGs (pingLoop checks `stopped` before each send). */
class Countdown extends Array<number> {
  readonly #limit: number
  readonly #into: Array<number>
  readonly #onLimit: () => void
  constructor(limit: number, into: Array<number>, onLimit: () => void) {
    super()
    this.#limit = limit
    this.#into = into
    this.#onLimit = onLimit
  }
  override push(...items: Array<number>): number {
    this.#into.push(...items)
    if (this.#into.length >= this.#limit) this.#onLimit()
    return 0
  }
}

type Env = NativeMemory | ZmqSockets | Scope.Scope

const childMain = async (): Promise<void> => {
  const role = process.argv[2] as SoakRole
  const endpoint = process.argv[3]!
  const tag = process.argv[4]!
  const reply = (m: FromChild): void => {
    process.send!(m)
  }
  const runtime = ManagedRuntime.make(
    Layer.mergeAll(ClientLive, loggerLayer("pretty"), Layer.succeed(References.MinimumLogLevel, "Warn"))
  )
  const scope = await runtime.runPromise(Scope.make())
  const inScope = <A, E>(effect: Effect.Effect<A, E, Env>): Promise<A> => runtime.runPromise(Scope.provide(scope)(effect))
  let serial = 0
  const many = <E>(count: number, concurrency: number, once: (n: number) => Effect.Effect<number, E, Env>) =>
    inScope(
      Effect.map(
        Effect.forEach(Array.from({ length: count }, () => serial++), once, { concurrency }),
        (xs) => xs.reduce((a, b) => a + b, 0)
      )
    )

  /** The role's setup, then one run of `count` operations: returns misses and reservations. */
  const setup = async (): Promise<(count: number) => Promise<Omit<RunDone, "count" | "seconds">>> => {
    switch (role) {
      case "ping":
        return async (count) => {
          const latencies: Array<number> = []
          await Promise.all(split(count, PING_CLIENTS).map((n) => {
            if (n === 0) return Promise.resolve()
            const mine: Array<number> = []
            const run: PingRun = { measuring: true, stopped: false, latenciesUs: new Countdown(n, mine, () => (run.stopped = true)) }
            return pingLoop(endpoint, run, "mpcache").then(() => void latencies.push(...mine))
          }))
          return { misses: 0, reserved: 0, ping: summarizeUs(latencies) }
        }
      case "sessions": {
        const { scheduler } = await inScope(Effect.gen(function*() {
          const cache = yield* makePagedKvCache({ namePrefix: `${tag}-sessions`, ...KV_GEOMETRY })
          const worker = yield* makeWorkerAdapter({ endpoint, modelName: MODEL_LM, worldSize: 1, kvRank: 0, requestTimeoutMs: REQUEST_TIMEOUT_MS })
          yield* worker.registerPagedKvCache(cache)
          const blockIds = Array.from({ length: PREFIX_TOKENS / BLOCK_TOKENS }, (_, i) => i + 1)
          for (let i = 0; i < PREFIXES; i++) {
            const ok = yield* worker.store({ requestId: `prefix-${i}`, tokenIds: prefixTokens(i), start: 0, end: PREFIX_TOKENS, blockIds })
            if (!ok) return yield* Effect.die(new Error(`STORE of prefix ${i} answered ok = false`))
          }
          const scheduler = yield* makeSchedulerAdapter({ endpoint, modelName: MODEL_LM, worldSize: 1, requestTimeoutMs: REQUEST_TIMEOUT_MS })
          return { scheduler }
        }))
        return async (count) => {
          const misses = await many(count, CONCURRENCY.sessions, (n) =>
            Effect.gen(function*() {
              const requestId = `triple-${n}`
              const hit = yield* scheduler.lookup(requestId, prefixTokens(n % PREFIXES))
              yield* scheduler.endSession(requestId)
              return hit === PREFIX_TOKENS ? 0 : 1
            }))
          return { misses, reserved: 0 }
        }
      }
      case "unended": {
        const schedulers = await inScope(Effect.gen(function*() {
          const make = (modelName: string) => makeSchedulerAdapter({ endpoint, modelName, worldSize: 1, requestTimeoutMs: REQUEST_TIMEOUT_MS })
          return { stored: yield* make(MODEL_LM), nobody: yield* make(MODEL_NOBODY) }
        }))
        return async (count) => {
          const misses = await many(count, CONCURRENCY.unended, (n) => {
            const s: SchedulerAdapterShape = n % 2 === 0 ? schedulers.stored : schedulers.nobody
            const tokens = n % 2 === 0 ? prefixTokens(n % PREFIXES) : freshTokens(1, n, PREFIX_TOKENS)
            return Effect.map(s.lookup(`unended-${n}`, tokens), (hit) => (n % 2 === 0 && hit !== PREFIX_TOKENS ? 1 : 0))
          })
          return { misses, reserved: 0 }
        }
      }
      case "prepare": {
        const { client, instanceId } = await inScope(Effect.gen(function*() {
          const client = yield* makeMqClient({ endpoint, requestTimeoutMs: REQUEST_TIMEOUT_MS })
          const adapter = yield* makeEngineDrivenWorkerAdapterWith(client, {
            modelName: MODEL_ED,
            worldSize: 1,
            kvRank: 0,
            blockSizeTokens: BLOCK_TOKENS,
            numLayers: NUM_LAYERS,
            hiddenDimSize: NUM_HEADS * HEAD_SIZE,
            dtype: DTYPE,
            requestTimeoutMs: REQUEST_TIMEOUT_MS
          })
          yield* adapter.register
          return { client, instanceId: adapter.instanceId }
        }))
        return async (count) => {
          const reserved = await many(count, CONCURRENCY.prepare, (n) => {
            const key: CacheKey = {
              model_name: MODEL_ED,
              world_size: 1,
              worker_id: 0,
              token_ids: freshTokens(2, n, CHUNK_TOKENS),
              start: 0,
              end: CHUNK_TOKENS,
              request_id: `prepare-${n}`,
              cache_salt: ""
            }
            return Effect.map(client.request(PrepareStore, [key, instanceId]), (r) => r.context.chunk_indices.length)
          })
          return { misses: 0, reserved }
        }
      }
      case "register": {
        const cache = await inScope(makePagedKvCache({ namePrefix: `${tag}-register`, ...KV_GEOMETRY }))
        return async (count) => {
          await many(count, CONCURRENCY.register, () =>
            Effect.scoped(Effect.gen(function*() {
              const worker = yield* makeWorkerAdapter({ endpoint, modelName: MODEL_LM, worldSize: 1, kvRank: 0, requestTimeoutMs: REQUEST_TIMEOUT_MS })
              yield* worker.registerPagedKvCache(cache)
              return 0
            })))
          return { misses: 0, reserved: 0 }
        }
      }
    }
  }

  const fail = (error: unknown): void => {
    reply({ type: "failed", why: error instanceof Error ? error.stack ?? error.message : String(error) })
    process.exitCode = 1
    process.disconnect()
  }
  let once: (count: number) => Promise<Omit<RunDone, "count" | "seconds">>
  try {
    once = await setup()
  } catch (error) {
    return fail(error)
  }
  // One run at a time: the parent waits for each `done` before the next `run`.
  let queue = Promise.resolve()
  process.on("message", (m: ToChild) => {
    queue = queue.then(async () => {
      if (m.type === "stop") {
        await runtime.runPromise(Scope.close(scope, Exit.void)).catch(() => {})
        await runtime.dispose().catch(() => {})
        process.disconnect()
        return
      }
      const t0 = performance.now()
      try {
        const r = await once(m.count)
        reply({ type: "done", count: m.count, seconds: (performance.now() - t0) / 1000, ...r })
      } catch (error) {
        fail(error)
      }
    })
  })
  reply({ type: "ready" })
}

if (process.send !== undefined && process.argv[1] === import.meta.filename) await childMain()
