/**
 * Real redis-server processes for the L2 tests (issue 15, DESIGN §9): one
 * node, or a Redis Cluster of 3 masters + 3 replicas made with
 * `redis-cli --cluster create`, on free loopback ports in a temporary folder
 * (`--save '' --appendonly no`: nothing outlives the test). Helpers kill a
 * master with SIGKILL and wait for its replica's promotion, take every node
 * down and bring them back on the same ports and cluster config files, set
 * `maxmemory`, create an ACL user limited to a key pattern and say which
 * master owns a key's slot.
 *
 * Every process is stopped by pid when the scope closes and, should the test
 * process end first, from its `exit` handler; the folder is removed with it.
 * Commands go through the real `redis-cli`, so the harness needs no client
 * library and proves nothing about the one mpcache uses.
 */
import { execFile, execFileSync, spawn, type ChildProcess } from "node:child_process"
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Data, Effect, Scope } from "effect"
import { canBind } from "./QuietPort.ts"

export const REDIS_SERVER = process.env["MPCACHE_REDIS_SERVER"] ?? "/usr/bin/redis-server"
export const REDIS_CLI = process.env["MPCACHE_REDIS_CLI"] ?? "/usr/bin/redis-cli"

/** The harness could not start, reach or stop a node: `port` names it, `logTail` is the end of its log. */
export class RedisFleetError extends Data.TaggedError("RedisFleetError")<{
  readonly port: number
  readonly message: string
  readonly logTail: string
}> {}

/** A node answered with an error reply (`code` is its first word: NOPERM, WRONGPASS, MOVED, OOM …). */
export class RedisReplyError extends Data.TaggedError("RedisReplyError")<{
  readonly port: number
  readonly code: string
  readonly message: string
}> {}

/** An ACL user's credentials for `RedisFleet.command`. */
export interface RedisAuth {
  readonly user: string
  readonly pass: string
}

/** One line of `CLUSTER NODES`, as seen by a live node. */
export interface ClusterNodeView {
  readonly id: string
  readonly port: number
  readonly flags: ReadonlyArray<string>
  /** The id of the master this node replicates, or undefined for a master. */
  readonly masterId: string | undefined
  /** Inclusive slot ranges it serves (empty for replicas). */
  readonly slots: ReadonlyArray<readonly [number, number]>
}

/** One node of a fleet, by itself (the shape the L2 tests use: synchronous `cli` for short checks). */
export interface RedisNode {
  readonly port: number
  /** `redis://127.0.0.1:PORT`. */
  readonly url: string
  /** `rediss://127.0.0.1:TLS_PORT` when the fleet was started with `tls`, else undefined. */
  readonly tlsUrl: string | undefined
  /** Runs `redis-cli -p PORT ...args` (5 s at most) and returns its stdout, trimmed; throws when redis-cli fails. */
  readonly cli: (...args: ReadonlyArray<string>) => string
  /** `SET key value` with binary `value` (`redis-cli -x`, the value on stdin), as any client of the node can; throws unless OK. */
  readonly setBytes: (key: string, value: Uint8Array) => void
  /** `GET key` as bytes (undefined when absent; redis-cli prints a bulk string raw, then a newline). */
  readonly getBytes: (key: string) => Buffer | undefined
  /** SIGKILL, and waits for the exit. */
  readonly kill: Effect.Effect<void>
  /** Starts it again on its port, with its cluster config file (no data: nothing is saved), once it answers PING. */
  readonly restart: Effect.Effect<void, RedisFleetError>
}

export interface RedisFleet {
  /** Every node, in creation order (for a cluster: masters first). */
  readonly nodes: ReadonlyArray<RedisNode>
  /** The temporary folder; each node logs to `<dir>/<port>/redis.log`. */
  readonly dir: string
  /** Every node's port, in creation order (for a cluster: the first three were made masters). */
  readonly ports: ReadonlyArray<number>
  readonly cluster: boolean
  /** `redis://127.0.0.1:P` for one node; `redis+cluster://127.0.0.1:P1,…` (every node as a seed) for a cluster (issue 15 §1). */
  readonly url: string
  /** `url` with `auth` as its user info (`redis://user:pass@…`, `redis+cluster://user:pass@…`): the url of an ACL user. */
  readonly urlAs: (auth: RedisAuth) => string
  /** Whether the node on `port` runs now. */
  readonly isUp: (port: number) => boolean
  /** The pid of the node on `port`, or undefined when it is down. */
  readonly pid: (port: number) => number | undefined
  /**
   * Runs one command on the node at `port` through redis-cli (optionally as `auth`); succeeds with
   * the raw reply text (trimmed), fails with RedisReplyError for an error reply or a refused AUTH.
   */
  readonly command: (port: number, args: ReadonlyArray<string>, auth?: RedisAuth) => Effect.Effect<string, RedisReplyError | RedisFleetError>
  /** Sends `lines` (one command each) through one redis-cli on `port`, following MOVED with `-c`; one reply line per command. */
  readonly pipeline: (port: number, lines: ReadonlyArray<string>) => Effect.Effect<ReadonlyArray<string>, RedisFleetError>
  /** `CLUSTER NODES` as the live node `port` (default: the first live one) sees it. */
  readonly topology: (port?: number) => Effect.Effect<ReadonlyArray<ClusterNodeView>, RedisFleetError | RedisReplyError>
  /** Ports of the masters that serve slots now. */
  readonly masters: () => Effect.Effect<ReadonlyArray<number>, RedisFleetError | RedisReplyError>
  /** The same, synchronously (`CLUSTER NODES` of the first live node that answers); [] when none does. */
  readonly masterPorts: () => ReadonlyArray<number>
  /** The port of the master owning `key`'s slot (`CLUSTER KEYSLOT` + `CLUSTER NODES`); the only node without cluster mode. */
  readonly masterOf: (key: string) => Effect.Effect<number, RedisFleetError | RedisReplyError>
  /** For each key, the port of the master owning its slot (one redis-cli for all the KEYSLOTs). */
  readonly mastersOf: (keys: ReadonlyArray<string>) => Effect.Effect<ReadonlyArray<number>, RedisFleetError | RedisReplyError>
  /**
   * SIGKILLs the master on `port` and waits (at most `timeoutMs`, default 60 s) until one of its
   * replicas serves its slots and every live node says `cluster_state:ok`; returns that replica's port.
   */
  readonly killMaster: (port: number, timeoutMs?: number) => Effect.Effect<number, RedisFleetError | RedisReplyError>
  /** SIGKILLs every live node and waits for their exits. */
  readonly killAll: () => Effect.Effect<void>
  /** SIGKILLs the node on `port` (any role) and waits for its exit. */
  readonly killNode: (port: number) => Effect.Effect<void>
  /**
   * Starts every node that is down on its own port with its own cluster config file, then waits
   * (at most `timeoutMs`, default 60 s) until the fleet is healthy; ACL users and memory limits set
   * through this fleet are applied again (the nodes keep no data and no ACLs across a restart).
   */
  readonly restartAll: (timeoutMs?: number) => Effect.Effect<void, RedisFleetError | RedisReplyError>
  /** `maxmemory` (bytes) and `maxmemory-policy` (default allkeys-lru) on every node. */
  readonly setMaxmemory: (bytes: number, policy?: string) => Effect.Effect<void, RedisFleetError | RedisReplyError>
  /**
   * `ACL SETUSER <user> reset on ><pass> ~<keyPattern> <commands>` on every node (commands default `+@all`):
   * a user that may touch only keys matching `keyPattern`, e.g. `mpc:*`.
   */
  readonly createAclUser: (
    user: string,
    pass: string,
    keyPattern: string,
    commands?: string
  ) => Effect.Effect<void, RedisFleetError | RedisReplyError>
  /** Waits until the fleet is healthy (see `startRedisCluster`), at most `timeoutMs` (default 60 s). */
  readonly waitHealthy: (timeoutMs?: number) => Effect.Effect<void, RedisFleetError | RedisReplyError>
}

export interface RedisFleetOptions {
  /** Cluster only: `cluster-node-timeout`, ms (default 3000: a SIGKILLed master is replaced within seconds, a loaded machine does not fail nodes spuriously). */
  readonly nodeTimeoutMs?: number
  /** Extra `--name value` pairs for every redis-server. */
  readonly extraArgs?: ReadonlyArray<string>
  /** How long each node may take to answer PING after its start, ms (default 20 s). */
  readonly startTimeoutMs?: number
  /**
   * One node only: also serve TLS (`--tls-port`, on the port P + 10000 that the free-port check
   * reserves for a cluster bus, unused by a lone node) with these PEM files; clients are not asked
   * for certificates. The plain port stays (the harness's redis-cli uses it). See `RedisNode.tlsUrl`.
   */
  readonly tls?: { readonly certFile: string; readonly keyFile: string; readonly caFile: string }
}

/** Whether both binaries exist (the L2 suites are skipped loudly without them: RedisSuite.ts). */
export const redisAvailable = () => existsSync(REDIS_SERVER) && existsSync(REDIS_CLI)

// Processes started by any fleet in this test process, killed by pid should it end before their scope closes.
const live = new Map<number, ChildProcess>()
const dirs = new Set<string>()
let exitHookInstalled = false
const installExitHook = () => {
  if (exitHookInstalled) return
  exitHookInstalled = true
  process.once("exit", () => {
    for (const [pid] of live) {
      try {
        process.kill(pid, "SIGKILL")
      } catch {
        // already gone
      }
    }
    for (const dir of dirs) rmSync(dir, { recursive: true, force: true })
  })
}

const ERROR_CODES = new Set([
  "ERR",
  "NOPERM",
  "WRONGPASS",
  "NOAUTH",
  "MOVED",
  "ASK",
  "CLUSTERDOWN",
  "OOM",
  "READONLY",
  "WRONGTYPE",
  "BUSY",
  "LOADING",
  "MASTERDOWN",
  "TRYAGAIN",
  "CROSSSLOT",
  "NOSCRIPT",
  "EXECABORT"
])

// A port P with P and P + 10000 (the cluster bus) free, from 20000–29999: below the ephemeral range
// and RedisFleet's own in QuietPort's split, so other tests do not take it between this check and redis-server's bind.
const taken = new Set<number>()
const freePort = async (): Promise<number> => {
  for (let i = 0; i < 500; i++) {
    const p = 20000 + Math.floor(Math.random() * 10000)
    if (taken.has(p)) continue
    if ((await canBind(p)) && (await canBind(p + 10000))) {
      taken.add(p)
      return p
    }
  }
  throw new Error("RedisFleet: no free port pair (P, P + 10000) in 20000–29999 after 500 tries")
}

/** A lone node's TLS port is its port + this (free-port checked with it, as a cluster bus port is). */
const TLS_PORT_OFFSET = 10000

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms))

const logTailOf = (dir: string, port: number, lines = 20) => {
  const path = join(dir, String(port), "redis.log")
  if (!existsSync(path)) return `(no log at ${path})`
  return readFileSync(path, "utf8").trimEnd().split("\n").slice(-lines).join("\n")
}

const parseInfo = (text: string): Record<string, string> =>
  Object.fromEntries(
    text.split(/\r?\n/).flatMap((l) => {
      const i = l.indexOf(":")
      return i > 0 ? [[l.slice(0, i), l.slice(i + 1).trim()]] : []
    })
  )

/** Parses `CLUSTER NODES` (https://redis.io/commands/cluster-nodes): id addr flags master … link slots…. */
export const parseClusterNodes = (text: string): ReadonlyArray<ClusterNodeView> =>
  text.split(/\r?\n/).filter((l) => l.trim() !== "").map((line) => {
    const f = line.trim().split(" ")
    const addr = f[1] ?? ""
    const port = Number(addr.split("@")[0]!.split(":").pop())
    const slots = f.slice(8).filter((s) => !s.startsWith("[")).map((s): readonly [number, number] => {
      const [a, b] = s.split("-")
      return [Number(a), Number(b ?? a)]
    })
    return { id: f[0]!, port, flags: (f[2] ?? "").split(","), masterId: f[3] === "-" ? undefined : f[3], slots }
  })

/** Where redis-server is, or undefined when it is not installed (the L2 suites are then skipped, loudly: RedisSuite.ts). */
export const redisServerPath: string | undefined = existsSync(REDIS_SERVER) ? REDIS_SERVER : undefined

/**
 * One node, not in cluster mode, with `options` (or just extra redis-server arguments, e.g.
 * `["--maxmemory-policy", "allkeys-lru"]`); the fleet and its only node in one (`redis.cli(…)`,
 * `redis.kill`, `redis.restart`, `redis.port`); stopped with the scope.
 */
export const startRedis = (
  options: RedisFleetOptions | ReadonlyArray<string> = {}
): Effect.Effect<RedisFleet & RedisNode, RedisFleetError | RedisReplyError, Scope.Scope> =>
  Effect.map(startFleet(1, 0, false, isArgs(options) ? { extraArgs: options } : options), (fleet) => ({ ...fleet, ...fleet.nodes[0]! }))

const isArgs = (o: RedisFleetOptions | ReadonlyArray<string>): o is ReadonlyArray<string> => Array.isArray(o)

/**
 * A Redis Cluster of `masters` masters (default 3, at least 3: redis-cli's minimum) with `replicas`
 * replicas each (default 1), made with `redis-cli --cluster create … --cluster-replicas R
 * --cluster-yes`, once every node says `cluster_state:ok` with all 16384 slots assigned and ok,
 * knows every node, every replica's link to its master is up, and all agree on who serves which
 * slots; stopped with the scope.
 */
export const startRedisCluster = (
  masters = 3,
  replicas = 1,
  options: RedisFleetOptions = {}
): Effect.Effect<RedisFleet, RedisFleetError | RedisReplyError, Scope.Scope> =>
  masters < 3 || !Number.isInteger(masters) || replicas < 0 || !Number.isInteger(replicas)
    ? Effect.fail(new RedisFleetError({ port: 0, message: `a cluster needs at least 3 masters and 0 or more replicas (got ${masters} and ${replicas})`, logTail: "" }))
    : startFleet(masters * (1 + replicas), replicas, true, options)

const startFleet = (
  count: number,
  replicas: number,
  cluster: boolean,
  options: RedisFleetOptions
): Effect.Effect<RedisFleet, RedisFleetError | RedisReplyError, Scope.Scope> =>
  Effect.acquireRelease(
    Effect.tryPromise({
      try: () => makeFleet(count, replicas, cluster, options),
      catch: (e) => (e instanceof RedisFleetError || e instanceof RedisReplyError ? e : new RedisFleetError({ port: 0, message: String(e), logTail: "" }))
    }),
    (h) => Effect.promise(() => h.close())
  ).pipe(Effect.map((h) => h.fleet))

interface FleetHandle {
  readonly fleet: RedisFleet
  readonly close: () => Promise<void>
}

const makeFleet = async (count: number, replicas: number, cluster: boolean, options: RedisFleetOptions): Promise<FleetHandle> => {
  installExitHook()
  const dir = mkdtempSync(join(tmpdir(), "mpcache-redis-"))
  dirs.add(dir)
  const procs = new Map<number, ChildProcess>()
  const startTimeoutMs = options.startTimeoutMs ?? 20_000
  // Settings made through the fleet, applied again to nodes that restart.
  const settings: Array<ReadonlyArray<string>> = []

  const fail = (port: number, message: string) => new RedisFleetError({ port, message, logTail: logTailOf(dir, port) })

  const cliRaw = (port: number, args: ReadonlyArray<string>, stdin?: string, auth?: RedisAuth) =>
    new Promise<{ stdout: string; stderr: string }>((resolve, reject) => {
      const authArgs = auth ? ["--user", auth.user, "--pass", auth.pass, "--no-auth-warning"] : []
      const child = execFile(
        REDIS_CLI,
        ["-h", "127.0.0.1", "-p", String(port), ...authArgs, ...args],
        { timeout: 15_000, maxBuffer: 64 * 1024 * 1024 },
        (err, stdout, stderr) => {
          if (err && (err.killed || typeof err.code !== "number")) {
            reject(fail(port, `redis-cli ${args.join(" ")} did not finish: ${err.message} ${stderr}`))
          } else resolve({ stdout, stderr })
        }
      )
      if (stdin !== undefined) child.stdin!.end(stdin)
      else child.stdin!.end()
    })

  const commandP = async (port: number, args: ReadonlyArray<string>, auth?: RedisAuth) => {
    const { stdout, stderr } = await cliRaw(port, args, undefined, auth)
    const authFailed = stderr.match(/AUTH failed: (\w+)/)
    if (authFailed) throw new RedisReplyError({ port, code: authFailed[1]!, message: stderr.trim() })
    if (/Could not connect|Connection refused/.test(stderr)) throw fail(port, `cannot connect: ${stderr.trim()}`)
    const out = stdout.trim()
    const code = out.match(/^([A-Z]+)[ \n]/)?.[1] ?? (ERROR_CODES.has(out) ? out : undefined)
    if (code !== undefined && ERROR_CODES.has(code) && out.split("\n").length === 1) throw new RedisReplyError({ port, code, message: out })
    return out
  }

  const livePorts = () => [...procs.keys()]

  const spawnNode = async (port: number) => {
    const nodeDir = join(dir, String(port))
    mkdirSync(nodeDir, { recursive: true })
    const args = [
      "--port", String(port),
      "--bind", "127.0.0.1",
      "--save", "",
      "--appendonly", "no",
      "--dir", nodeDir,
      "--logfile", join(nodeDir, "redis.log"),
      "--daemonize", "no",
      ...(cluster
        ? ["--cluster-enabled", "yes", "--cluster-config-file", join(nodeDir, "nodes.conf"), "--cluster-node-timeout", String(options.nodeTimeoutMs ?? 3000)]
        : []),
      ...(options.tls === undefined || cluster
        ? []
        : [
          "--tls-port", String(port + TLS_PORT_OFFSET),
          "--tls-cert-file", options.tls.certFile,
          "--tls-key-file", options.tls.keyFile,
          "--tls-ca-cert-file", options.tls.caFile,
          "--tls-auth-clients", "no"
        ]),
      ...(options.extraArgs ?? [])
    ]
    const child = spawn(REDIS_SERVER, args, { stdio: "ignore" })
    if (child.pid === undefined) throw fail(port, `could not spawn ${REDIS_SERVER}`)
    procs.set(port, child)
    live.set(child.pid, child)
    child.once("exit", () => {
      live.delete(child.pid!)
      if (procs.get(port) === child) procs.delete(port)
    })
    const started = Date.now()
    for (;;) {
      if (child.exitCode !== null || child.signalCode !== null) {
        throw fail(port, `redis-server on port ${port} exited (${child.exitCode ?? child.signalCode}) before answering PING`)
      }
      const r = await cliRaw(port, ["PING"]).catch(() => undefined)
      if (r?.stdout.trim() === "PONG") return
      if (Date.now() - started > startTimeoutMs) throw fail(port, `redis-server on port ${port} did not answer PING within ${startTimeoutMs} ms`)
      await sleep(100)
    }
  }

  const killP = async (port: number) => {
    const child = procs.get(port)
    if (child === undefined) return
    const exited = new Promise<void>((r) => (child.exitCode !== null || child.signalCode !== null ? r() : child.once("exit", () => r())))
    child.kill("SIGKILL")
    await exited
  }

  const topologyP = async (port?: number) => {
    const at = port ?? livePorts()[0]
    if (at === undefined) throw fail(0, "no node is up")
    return parseClusterNodes(await commandP(at, ["CLUSTER", "NODES"]))
  }

  // Healthy: every live node answers; in a cluster each says cluster_state:ok with all slots
  // assigned and ok, and all live nodes agree on which (live) master serves each slot range.
  const healthProblem = async (): Promise<string | undefined> => {
    const ports = livePorts()
    if (ports.length === 0) return "no node is up"
    if (!cluster) {
      const r = await commandP(ports[0]!, ["PING"]).catch((e: unknown) => String(e))
      return r === "PONG" ? undefined : `port ${ports[0]}: ${r}`
    }
    const views: Array<string> = []
    for (const p of ports) {
      const info = parseInfo(await commandP(p, ["CLUSTER", "INFO"]))
      if (info["cluster_state"] !== "ok") return `port ${p}: cluster_state:${info["cluster_state"]}`
      if (info["cluster_slots_assigned"] !== "16384" || info["cluster_slots_ok"] !== "16384") {
        return `port ${p}: cluster_slots_assigned:${info["cluster_slots_assigned"]} cluster_slots_ok:${info["cluster_slots_ok"]}`
      }
      if (info["cluster_known_nodes"] !== String(count)) return `port ${p}: cluster_known_nodes:${info["cluster_known_nodes"]}`
      const view = await topologyP(p)
      const masters = view.filter((n) => n.slots.length > 0)
      const down = masters.find((m) => !procs.has(m.port) || m.flags.includes("fail") || m.flags.includes("fail?"))
      if (down) return `port ${p} sees slots on ${down.port} (${down.flags.join(",")}${procs.has(down.port) ? "" : ", down"})`
      // Every other live node replicates a serving master, as this node sees it.
      const stray = view.find((n) => procs.has(n.port) && n.slots.length === 0 && !masters.some((m) => m.id === n.masterId))
      if (stray) return `port ${p} sees ${stray.port} (${stray.flags.join(",")}) neither serving slots nor replicating a master that does`
      if (view.find((n) => n.port === p)?.masterId !== undefined) {
        const link = parseInfo(await commandP(p, ["INFO", "replication"]))["master_link_status"]
        if (link !== "up") return `port ${p}: master_link_status:${link}`
      }
      views.push(masters.map((m) => `${m.port}:${m.slots.map(([a, b]) => `${a}-${b}`).join(",")}`).sort().join(" "))
    }
    const distinct = new Set(views)
    return distinct.size === 1 ? undefined : `nodes disagree on the slot owners: ${[...distinct].join(" | ")}`
  }

  const waitHealthyP = async (timeoutMs = 60_000) => {
    const started = Date.now()
    let problem: string | undefined = "not checked"
    while (Date.now() - started < timeoutMs) {
      problem = await healthProblem().catch((e: unknown) => (e instanceof Error ? e.message : String(e)))
      if (problem === undefined) return
      await sleep(200)
    }
    const port = Number(problem?.match(/port (\d+)/)?.[1] ?? livePorts()[0] ?? 0)
    throw fail(port, `the ${cluster ? "cluster" : "node"} was not healthy within ${timeoutMs} ms: ${problem}`)
  }

  const applySetting = async (args: ReadonlyArray<string>) => {
    for (const p of livePorts()) await commandP(p, args)
  }

  const ports: Array<number> = []
  const close = async () => {
    await Promise.all(livePorts().map(killP))
    rmSync(dir, { recursive: true, force: true })
    dirs.delete(dir)
    for (const p of ports) taken.delete(p)
  }

  try {
    for (let i = 0; i < count; i++) {
      // A port taken by someone else between the check and the bind: try another.
      for (let attempt = 0; ; attempt++) {
        const port = await freePort()
        try {
          await spawnNode(port)
          ports.push(port)
          break
        } catch (e) {
          await killP(port)
          if (attempt >= 3 || !/Address already in use/.test(logTailOf(dir, port))) throw e
        }
      }
    }
    if (cluster) {
      const create = await new Promise<{ code: number | null; out: string }>((resolve) => {
        execFile(
          REDIS_CLI,
          ["--cluster", "create", ...ports.map((p) => `127.0.0.1:${p}`), "--cluster-replicas", String(replicas), "--cluster-yes"],
          { timeout: 60_000 },
          (err, stdout, stderr) => resolve({ code: err ? (typeof err.code === "number" ? err.code : -1) : 0, out: `${stdout}${stderr}` })
        )
      })
      if (create.code !== 0 || !/All 16384 slots covered/.test(create.out)) {
        throw fail(ports[0]!, `redis-cli --cluster create failed (${create.code}): ${create.out.slice(-2000)}`)
      }
    }
    await waitHealthyP()
  } catch (e) {
    await close()
    throw e
  }

  const masterOfSlot = (topology: ReadonlyArray<ClusterNodeView>, slot: number) => {
    const m = topology.find((n) => n.slots.some(([a, b]) => slot >= a && slot <= b))
    if (m === undefined) throw fail(ports[0]!, `no master serves slot ${slot}`)
    return m.port
  }

  const mastersOfP = async (keys: ReadonlyArray<string>) => {
    if (!cluster) return keys.map(() => ports[0]!)
    const at = livePorts()[0]!
    const { stdout } = await cliRaw(at, [], keys.map((k) => `CLUSTER KEYSLOT ${k}\n`).join(""))
    const slots = stdout.trim().split("\n").map(Number)
    if (slots.length !== keys.length || slots.some((s) => !Number.isInteger(s))) {
      throw fail(at, `CLUSTER KEYSLOT for ${keys.length} keys answered: ${stdout.slice(0, 200)}`)
    }
    const topology = await topologyP(at)
    return slots.map((s) => masterOfSlot(topology, s))
  }

  const lift = <A>(f: () => Promise<A>): Effect.Effect<A, RedisFleetError | RedisReplyError> =>
    Effect.tryPromise({
      try: f,
      catch: (e) => (e instanceof RedisFleetError || e instanceof RedisReplyError ? e : new RedisFleetError({ port: 0, message: String(e), logTail: "" }))
    })

  const cliSync = (port: number, args: ReadonlyArray<string>) =>
    execFileSync(REDIS_CLI, ["-h", "127.0.0.1", "-p", String(port), ...args], { encoding: "utf8", timeout: 5_000 }).trim()
  const nodes: Array<RedisNode> = ports.map((port) => ({
    port,
    url: `redis://127.0.0.1:${port}`,
    tlsUrl: options.tls === undefined || cluster ? undefined : `rediss://127.0.0.1:${port + TLS_PORT_OFFSET}`,
    cli: (...args) => cliSync(port, args),
    setBytes: (key, value) => {
      const reply = execFileSync(REDIS_CLI, ["-h", "127.0.0.1", "-p", String(port), "-x", "SET", key], { input: value, encoding: "utf8", timeout: 5_000 }).trim()
      if (reply !== "OK") throw new Error(`SET ${key} on ${port} answered ${reply}`)
    },
    getBytes: (key) => {
      if (cliSync(port, ["EXISTS", key]) !== "1") return undefined
      const out = execFileSync(REDIS_CLI, ["-h", "127.0.0.1", "-p", String(port), "GET", key], { timeout: 5_000, maxBuffer: 256 * 2 ** 20 })
      return out.subarray(0, out.length - 1)
    },
    kill: Effect.promise(() => killP(port)),
    restart: lift(async () => {
      if (!procs.has(port)) await spawnNode(port)
      for (const s of settings) await commandP(port, s)
    }) as Effect.Effect<void, RedisFleetError>
  }))
  const fleetUrl = cluster ? `redis+cluster://${ports.map((p) => `127.0.0.1:${p}`).join(",")}` : `redis://127.0.0.1:${ports[0]}`
  const fleet: RedisFleet = {
    nodes,
    dir,
    ports,
    cluster,
    url: fleetUrl,
    urlAs: (auth) => {
      const [scheme, rest] = fleetUrl.split("://")
      return `${scheme}://${encodeURIComponent(auth.user)}:${encodeURIComponent(auth.pass)}@${rest}`
    },
    isUp: (port) => procs.has(port),
    pid: (port) => procs.get(port)?.pid,
    command: (port, args, auth) => lift(() => commandP(port, args, auth)),
    pipeline: (port, lines) =>
      lift(async () => {
        const { stdout } = await cliRaw(port, cluster ? ["-c"] : [], lines.map((l) => `${l}\n`).join(""))
        // redis-cli -c notes each redirect it followed on a line of its own: not a reply.
        return stdout.replace(/\n$/, "").split("\n").filter((l) => !l.startsWith("-> Redirected to slot"))
      }) as Effect.Effect<ReadonlyArray<string>, RedisFleetError>,
    topology: (port) => lift(() => topologyP(port)),
    masters: () => lift(async () => (await topologyP()).filter((n) => n.slots.length > 0).map((n) => n.port)),
    masterPorts: () => {
      for (const p of livePorts()) {
        try {
          return parseClusterNodes(cliSync(p, ["CLUSTER", "NODES"])).filter((n) => n.slots.length > 0).map((n) => n.port)
        } catch {
          continue
        }
      }
      return []
    },
    masterOf: (key) => lift(async () => (await mastersOfP([key]))[0]!),
    mastersOf: (keys) => lift(() => mastersOfP(keys)),
    killMaster: (port, timeoutMs = 60_000) =>
      lift(async () => {
        if (!cluster) throw fail(port, "killMaster needs a cluster")
        const before = await topologyP(port)
        const me = before.find((n) => n.port === port && n.flags.includes("myself"))
        if (me === undefined || me.slots.length === 0) throw fail(port, `port ${port} is not a master serving slots`)
        const replicas = before.filter((n) => n.masterId === me.id).map((n) => n.port)
        if (replicas.length === 0) throw fail(port, `master ${port} has no replica to promote`)
        await killP(port)
        const started = Date.now()
        let promoted: number | undefined
        while (Date.now() - started < timeoutMs) {
          const view = await topologyP(replicas[0]).catch(() => [])
          promoted = view.find((n) => replicas.includes(n.port) && n.flags.includes("master") && n.slots.length > 0)?.port
          if (promoted !== undefined) break
          await sleep(200)
        }
        if (promoted === undefined) throw fail(replicas[0]!, `no replica of ${port} (${replicas.join(", ")}) was promoted within ${timeoutMs} ms`)
        await waitHealthyP(Math.max(1_000, timeoutMs - (Date.now() - started)))
        return promoted
      }),
    killNode: (port) => Effect.promise(() => killP(port)),
    killAll: () => Effect.promise(() => Promise.all(livePorts().map(killP)).then(() => undefined)),
    restartAll: (timeoutMs) =>
      lift(async () => {
        for (const p of ports) if (!procs.has(p)) await spawnNode(p)
        await waitHealthyP(timeoutMs)
        for (const s of settings) await applySetting(s)
      }),
    setMaxmemory: (bytes, policy = "allkeys-lru") =>
      lift(async () => {
        const s = ["CONFIG", "SET", "maxmemory", String(bytes), "maxmemory-policy", policy]
        settings.push(s)
        await applySetting(s)
      }),
    createAclUser: (user, pass, keyPattern, commands = "+@all") =>
      lift(async () => {
        const s = ["ACL", "SETUSER", user, "reset", "on", `>${pass}`, `~${keyPattern}`, ...commands.split(" ")]
        settings.push(s)
        await applySetting(s)
      }),
    waitHealthy: (timeoutMs) => lift(() => waitHealthyP(timeoutMs))
  }
  return { fleet, close }
}
