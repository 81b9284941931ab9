/**
 * The L2 store on Redis (issue 15 item 2): node-redis (`redis`) in one-node
 * or Cluster mode, binary values as Buffer, acquired and released with the
 * layer's scope. Nothing queues while a node is down (`disableOfflineQueue`:
 * a command fails at once), and every command has a timeout (the client's
 * `--l2-transfer-timeout-ms`, and the caller's, usually shorter, through
 * `withTimeout`).
 *
 * The layer never fails: when Redis is unreachable at start it logs a
 * WARNING and keeps connecting in the background (doubling delays up to
 * 2 s); until then every command fails with L2Error, which the breaker
 * turns into L1-only answers. Once connected, node-redis reconnects by
 * itself and, in Cluster mode, rediscovers slots and follows MOVED/ASK.
 */
import { Deferred, Duration, Effect, Layer } from "effect"
import { createClient, createCluster, RESP_TYPES } from "redis"
import type { L2Config } from "../services/server/l2/L2Config.ts"
import { L2Error, L2Store, withTimeout } from "../services/server/l2/L2Store.ts"

/** The few calls the store makes, the same on a client and a cluster. */
interface Connection {
  readonly exists: (key: string) => Promise<number>
  readonly get: (key: string) => Promise<Buffer | null>
  readonly set: (key: string, value: Buffer, ttlSeconds: number) => Promise<unknown>
  readonly del: (key: string) => Promise<number>
  readonly ping: () => Promise<unknown>
  readonly connect: () => Promise<unknown>
  readonly destroy: () => void
  readonly isReady: () => boolean
}

const BINARY = { [RESP_TYPES.BLOB_STRING]: Buffer } as const
/** Reconnect delays once connected: 50 ms doubling to 2 s, forever (node-redis's own loop). */
/** Delay from a node's first reconnection attempt to a re-read of the cluster's slot map, ms. */
const TOPOLOGY_REFRESH_MS = 1_000

const reconnectStrategy = (retries: number) => Math.min(50 * 2 ** retries, 2000)
const setOptions = (ttlSeconds: number) => ttlSeconds > 0 ? { condition: "NX" as const, expiration: { type: "EX" as const, value: ttlSeconds } } : { condition: "NX" as const }

/** What a node-redis client and a cluster client both offer, as the store calls it. */
interface Commands {
  readonly exists: (key: string) => Promise<number>
  readonly get: (key: string) => Promise<Buffer | null>
  readonly set: (key: string, value: Buffer, options: ReturnType<typeof setOptions>) => Promise<unknown>
  readonly del: (key: string) => Promise<number>
  readonly connect: () => Promise<unknown>
  readonly destroy: () => void
  readonly isReady: boolean
}

const adapt = (c: Commands, ping: () => Promise<unknown>): Connection => ({
  exists: (k) => c.exists(k),
  get: (k) => c.get(k),
  set: (k, v, ttl) => c.set(k, v, setOptions(ttl)),
  del: (k) => c.del(k),
  ping,
  connect: () => c.connect(),
  destroy: () => c.destroy(),
  isReady: () => c.isReady
})

const connectionOf = (l2: L2Config, onError: (e: Error) => void): Connection => {
  const { url } = l2
  const auth = { ...(url.username === undefined ? {} : { username: url.username }), ...(url.password === undefined ? {} : { password: url.password }) }
  const commandOptions = { timeout: l2.transferTimeoutMs }
  const socket = { connectTimeout: l2.transferTimeoutMs, reconnectStrategy, ...(url.tls ? { tls: true as const } : {}) }
  if (url.mode === "single") {
    const node = url.nodes[0]!
    const c = createClient({ socket: { ...socket, host: node.host, port: node.port }, ...auth, disableOfflineQueue: true, commandOptions })
      .withTypeMapping(BINARY)
    c.on("error", onError)
    return adapt(c, () => c.ping())
  }
  const c = createCluster({
    rootNodes: url.nodes.map((n) => ({ socket: { ...socket, host: n.host, port: n.port } })),
    defaults: { ...auth, disableOfflineQueue: true, socket },
    commandOptions,
    // A killed master's slots stay routed to it until the slot map is read again; node-redis does that once
    // a node has been reconnecting this long (its default, 5 s, left writes failing well past a replica's
    // promotion). Each refresh asks a live node only.
    topologyRefreshOnReconnectionAttemptStrategy: TOPOLOGY_REFRESH_MS
  }).withTypeMapping(BINARY)
  c.on("error", onError)
  // PING has no key: any node answers it.
  return adapt(c, () => c.sendCommand(undefined, true, ["PING"]))
}

const NOT_CONNECTED = "not connected yet"
const CONNECT_TIMED_OUT = "connect timed out"

const messageOf = (e: unknown): string => e instanceof Error ? (e.message === "" ? e.name : e.message) : String(e)

/** The L2Store on the Redis of `l2.url`. */
export const layerL2Redis = (l2: L2Config): Layer.Layer<L2Store> =>
  Layer.effect(
    L2Store,
    Effect.gen(function*() {
      let connection: Connection | undefined
      let lastError = NOT_CONNECTED
      const onError = (e: Error) => {
        lastError = messageOf(e)
      }
      // Ends with the first connect attempt, whatever its outcome: the breaker's first PING waits for it.
      const firstAttempt = yield* Deferred.make<void>()
      // Connect in the background until it works; the server serves meanwhile (L1 only).
      yield* Effect.gen(function*() {
        let delayMs = 100
        let warned = false
        while (true) {
          const c = connectionOf(l2, onError)
          const failed = yield* Effect.tryPromise({ try: () => c.connect(), catch: messageOf }).pipe(
            Effect.timeoutOrElse({ duration: Duration.millis(Math.max(l2.transferTimeoutMs, 1000)), orElse: () => Effect.fail(CONNECT_TIMED_OUT) }),
            Effect.match({ onSuccess: () => undefined, onFailure: (e) => e })
          )
          if (failed === undefined) {
            connection = c
            yield* Deferred.succeed(firstAttempt, undefined)
            return yield* Effect.logInfo(`L2 ${l2.url.display}: connected`)
          }
          c.destroy()
          // A connect that timed out keeps the socket's own error (ECONNREFUSED, …) when there is one.
          if (failed !== CONNECT_TIMED_OUT || lastError === NOT_CONNECTED) lastError = failed
          if (!warned) {
            warned = true
            yield* Effect.logWarning(`L2 ${l2.url.display} is unreachable (${failed}); serving from L1 only, connecting in the background`)
          }
          yield* Deferred.succeed(firstAttempt, undefined)
          yield* Effect.sleep(Duration.millis(delayMs))
          delayMs = Math.min(delayMs * 2, 2000)
        }
      }).pipe(Effect.forkScoped)
      yield* Effect.addFinalizer(() => Effect.sync(() => connection?.destroy()))

      const call = <A>(op: string, timeoutMs: number, f: (c: Connection) => Promise<A>) =>
        withTimeout(
          op,
          timeoutMs,
          Effect.suspend(() => {
            const c = connection
            if (c === undefined) return Effect.fail(new L2Error({ op, reason: "failed", message: `not connected to ${l2.url.display}: ${lastError}` }))
            return Effect.tryPromise({ try: () => f(c), catch: (e) => new L2Error({ op, reason: "failed", message: messageOf(e) }) })
          })
        )

      return {
        exists: (keys, t) =>
          call("EXISTS", t, (c) => Promise.all(keys.map((k) => c.exists(k)))).pipe(Effect.map((ns) => ns.map((n) => n > 0))),
        get: (key, t) => call("GET", t, (c) => c.get(key)).pipe(Effect.map((v) => v ?? undefined)),
        setNx: (key, value, ttl, t) =>
          call("SET", t, (c) => c.set(key, Buffer.from(value.buffer, value.byteOffset, value.byteLength), ttl)).pipe(Effect.map((r) => r !== null)),
        del: (key, t) => call("DEL", t, (c) => c.del(key)).pipe(Effect.asVoid),
        // The breaker's start probe comes before the first connect attempt has ended; it waits for it (under its timeout).
        ping: (t) =>
          withTimeout("PING", t, Deferred.await(firstAttempt).pipe(Effect.andThen(call("PING", t, (c) => c.ping())), Effect.asVoid)),
        connectionError: () => (connection !== undefined && connection.isReady() ? null : lastError)
      }
    })
  )
