/**
 * One real redis-server for the L2 tests (issue 15): a child process on a
 * free loopback port in a temporary folder (`--save '' --appendonly no`),
 * stopped by pid with the scope. A minimal stand-in, to be replaced by the
 * fleet harness (test/support/RedisFleet.ts, single node and cluster) at
 * merge: the tests use only `redisServerPath`, `startRedis`,
 * `startRedisCluster` and the handles.
 */
import { execFileSync, spawn, type ChildProcess } from "node:child_process"
import { existsSync, mkdtempSync, rmSync } from "node:fs"
import { createServer } from "node:net"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Effect, Schedule, Scope } from "effect"

/** Where redis-server is, or undefined when it is not installed (the L2 suites are then skipped, loudly). */
export const redisServerPath: string | undefined = ["/usr/bin/redis-server", "/usr/local/bin/redis-server"].find((p) => existsSync(p))
const redisCliPath = ["/usr/bin/redis-cli", "/usr/local/bin/redis-cli"].find((p) => existsSync(p)) ?? "redis-cli"

/** A running redis-server. */
export interface RedisProcess {
  readonly port: number
  /** `redis://127.0.0.1:PORT`. */
  readonly url: string
  /** Runs `redis-cli -p PORT ...args` and returns its stdout (trimmed). */
  readonly cli: (...args: ReadonlyArray<string>) => string
  /** SIGKILL, and wait for the exit. */
  readonly kill: Effect.Effect<void>
  /** Starts it again on the same port (empty: nothing is saved). */
  readonly restart: Effect.Effect<void>
}

const freePort = () =>
  Effect.callback<number>((resume) => {
    const s = createServer()
    s.listen(0, "127.0.0.1", () => {
      const address = s.address()
      const port = typeof address === "object" && address !== null ? address.port : 0
      s.close(() => resume(Effect.succeed(port)))
    })
  })

/** redis-server on a free port with `extraArgs` (e.g. `--maxmemory 3mb`), once it answers PING; stopped with the scope. */
export const startRedis = (extraArgs: ReadonlyArray<string> = []): Effect.Effect<RedisProcess, Error, Scope.Scope> =>
  Effect.gen(function*() {
    if (redisServerPath === undefined) return yield* Effect.fail(new Error("redis-server is not installed"))
    const server = redisServerPath
    const port = yield* freePort()
    const dir = mkdtempSync(join(tmpdir(), "mpcache-redis-"))
    let child: ChildProcess | undefined
    const cli = (...args: ReadonlyArray<string>) =>
      execFileSync(redisCliPath, ["-p", String(port), ...args], { encoding: "utf8", timeout: 5000 }).trim()
    const answers = Effect.try({ try: () => cli("PING"), catch: (e) => e as Error }).pipe(
      Effect.filterOrFail((r) => r === "PONG", (r) => new Error(`redis-server on ${port} answered ${r}`))
    )
    const start = Effect.gen(function*() {
      child = spawn(server, ["--port", String(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir, ...extraArgs], {
        stdio: "ignore"
      })
      yield* answers.pipe(Effect.retry(Schedule.spaced("50 millis").pipe(Schedule.upTo({ times: 100 }))))
    })
    const kill = Effect.callback<void>((resume) => {
      const c = child
      if (c === undefined || c.exitCode !== null || c.signalCode !== null) return resume(Effect.void)
      c.once("exit", () => resume(Effect.void))
      c.kill("SIGKILL")
    })
    yield* Effect.addFinalizer(() => kill.pipe(Effect.andThen(Effect.sync(() => rmSync(dir, { recursive: true, force: true })))))
    yield* start
    return { port, url: `redis://127.0.0.1:${port}`, cli, kill, restart: start.pipe(Effect.orDie) }
  })

/** A running Redis Cluster: its nodes (masters first, as created), and the `redis+cluster://` url of its seeds. */
export interface RedisCluster {
  readonly nodes: ReadonlyArray<RedisProcess>
  readonly url: string
  /** The ports of the nodes that are masters now (`CLUSTER NODES` of a live node). */
  readonly masterPorts: () => ReadonlyArray<number>
}

/**
 * A cluster of `masters` masters with `replicas` replicas each, made with
 * `redis-cli --cluster create … --cluster-yes`, once every node says
 * `cluster_state:ok`; every node stopped with the scope.
 */
export const startRedisCluster = (masters: number, replicas: number): Effect.Effect<RedisCluster, Error, Scope.Scope> =>
  Effect.gen(function*() {
    const nodes: Array<RedisProcess> = []
    for (let i = 0; i < masters * (1 + replicas); i++) {
      nodes.push(yield* startRedis(["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000"]))
    }
    yield* Effect.try({
      try: () =>
        execFileSync(redisCliPath, [
          "--cluster", "create", ...nodes.map((n) => `127.0.0.1:${n.port}`), "--cluster-replicas", String(replicas), "--cluster-yes"
        ], { encoding: "utf8", timeout: 30_000 }),
      catch: (e) => e as Error
    })
    const allOk = Effect.try({ try: () => nodes.every((n) => /cluster_state:ok/.test(n.cli("CLUSTER", "INFO"))), catch: (e) => e as Error }).pipe(
      Effect.filterOrFail((ok) => ok, () => new Error("cluster_state is not ok on every node"))
    )
    yield* allOk.pipe(Effect.retry(Schedule.spaced("100 millis").pipe(Schedule.upTo({ times: 150 }))))
    const masterPorts = () => {
      for (const n of nodes) {
        try {
          // <id> <ip:port@cport> <flags> …: flags such as "myself,master" or "master,fail".
          return n.cli("CLUSTER", "NODES").split("\n").map((l) => l.split(" "))
            .filter((f) => f.length > 2 && f[2]!.split(",").includes("master") && !f[2]!.includes("fail"))
            .map((f) => Number(/:(\d+)@/.exec(f[1]!)?.[1]))
        } catch {
          continue
        }
      }
      return []
    }
    return { nodes, url: `redis+cluster://${nodes.slice(0, masters).map((n) => `127.0.0.1:${n.port}`).join(",")}`, masterPorts }
  })
