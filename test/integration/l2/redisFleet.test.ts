/**
 * The Redis harness the L2 tests stand on (test/support/RedisFleet.ts, issue
 * 15), against real redis-server processes: a 3 + 3 cluster comes up healthy,
 * mpcache-shaped keys (no hash tags) spread over every master, a SIGKILLed
 * master's replica takes over, the whole cluster comes back after every node
 * went down, and an ACL user limited to `mpc:*` is refused elsewhere.
 */
import { assert, it } from "@effect/vitest"
import { Effect } from "effect"
import { startRedis, startRedisCluster } from "../../support/RedisFleet.ts"
import { redisSuite } from "../../support/RedisSuite.ts"

// The key shape of issue 15 §3: <prefix>:v1:<model>@<kv rank>@<chunk hash hex>.
const chunkKey = (i: number) => `mpc:v1:small-f16-256-2x2x16@0@${(i * 2654435761 >>> 0).toString(16).padStart(8, "0")}${i.toString(16).padStart(24, "0")}`

const infoField = (text: string, field: string) => text.split(/\r?\n/).find((l) => l.startsWith(`${field}:`))?.slice(field.length + 1).trim()

redisSuite("RedisFleet (real redis-server)", () => {
  it.live("one node: PING, SET and GET; SIGKILLed and restarted empty on its port; stopped by pid with the scope", () =>
    Effect.gen(function*() {
      const pids: Array<number> = []
      yield* Effect.scoped(Effect.gen(function*() {
        const fleet = yield* startRedis()
        assert.strictEqual(fleet.url, `redis://127.0.0.1:${fleet.ports[0]}`)
        assert.strictEqual(yield* fleet.command(fleet.ports[0]!, ["SET", chunkKey(1), "v"]), "OK")
        assert.strictEqual(yield* fleet.command(fleet.ports[0]!, ["GET", chunkKey(1)]), "v")
        assert.strictEqual(yield* fleet.masterOf(chunkKey(1)), fleet.ports[0])
        assert.strictEqual(fleet.cli("EXISTS", chunkKey(1)), "1")
        const first = fleet.pid(fleet.port)!
        yield* fleet.kill
        assert.isFalse(fleet.isUp(fleet.port))
        assert.throws(() => process.kill(first, 0), /ESRCH/)
        yield* fleet.restart
        assert.strictEqual(fleet.cli("PING"), "PONG")
        assert.strictEqual(fleet.cli("DBSIZE"), "0")
        pids.push(fleet.pid(fleet.ports[0]!)!)
      }))
      // kill(pid, 0) throws ESRCH once the process is gone.
      assert.throws(() => process.kill(pids[0]!, 0), /ESRCH/)
    }), 60_000)

  it.live("a cluster of 3 masters + 3 replicas: cluster_state:ok on every node; 1000 chunk keys land on all 3 masters; a SIGKILLed master's replica is promoted; all nodes down and back is ok again", () =>
    Effect.scoped(Effect.gen(function*() {
      const fleet = yield* startRedisCluster()
      assert.strictEqual(fleet.ports.length, 6)
      for (const p of fleet.ports) {
        const info = yield* fleet.command(p, ["CLUSTER", "INFO"])
        assert.strictEqual(infoField(info, "cluster_state"), "ok")
        assert.strictEqual(infoField(info, "cluster_slots_ok"), "16384")
        assert.strictEqual(infoField(info, "cluster_known_nodes"), "6")
      }
      const masters = yield* fleet.masters()
      assert.strictEqual(masters.length, 3)
      assert.sameMembers([...fleet.masterPorts()], [...masters])
      assert.sameMembers([...masters], fleet.ports.slice(0, 3))
      const topology = yield* fleet.topology()
      assert.strictEqual(topology.filter((n) => n.masterId !== undefined).length, 3)

      // Written through redis-cli -c (MOVED followed), then counted on each master.
      const keys = Array.from({ length: 1000 }, (_, i) => chunkKey(i))
      const replies = yield* fleet.pipeline(fleet.ports[0]!, keys.map((k) => `SET ${k} x`))
      assert.deepStrictEqual(replies, keys.map(() => "OK"))
      const owners = yield* fleet.mastersOf(keys)
      const perMaster = new Map<number, number>()
      for (const p of owners) perMaster.set(p, (perMaster.get(p) ?? 0) + 1)
      assert.deepStrictEqual([...perMaster.keys()].sort(), [...masters].sort())
      let total = 0
      for (const m of masters) {
        const n = Number(yield* fleet.command(m, ["DBSIZE"]))
        assert.strictEqual(n, perMaster.get(m), `master ${m} holds the keys whose slots it owns`)
        assert.isAbove(n, 0)
        total += n
      }
      assert.strictEqual(total, 1000)

      // kill -9 of the master owning key 0: its replica serves the slots, with the replicated keys.
      const victim = owners[0]!
      const promoted = yield* fleet.killMaster(victim)
      assert.isFalse(fleet.isUp(victim))
      assert.notStrictEqual(promoted, victim)
      assert.strictEqual(yield* fleet.masterOf(keys[0]!), promoted)
      assert.strictEqual(infoField(yield* fleet.command(promoted, ["CLUSTER", "INFO"]), "cluster_state"), "ok")
      assert.strictEqual(yield* fleet.command(promoted, ["GET", keys[0]!]), "x")
      assert.sameMembers([...(yield* fleet.masters())], [...masters.filter((m) => m !== victim), promoted])

      // Every node down, then back on the same ports and config files: ok again, the old master a replica.
      yield* fleet.killAll()
      for (const p of fleet.ports) assert.isFalse(fleet.isUp(p))
      yield* fleet.restartAll()
      for (const p of fleet.ports) {
        assert.isTrue(fleet.isUp(p))
        assert.strictEqual(infoField(yield* fleet.command(p, ["CLUSTER", "INFO"]), "cluster_state"), "ok")
      }
      assert.strictEqual((yield* fleet.masters()).length, 3)
      assert.strictEqual(yield* fleet.pipeline(fleet.ports[0]!, [`SET ${keys[0]} y`, `GET ${keys[0]}`]).pipe(Effect.map((r) => r.join(","))), "OK,y")
    })), 180_000)

  it.live("an ACL user limited to mpc:* may SET mpc: keys and is refused (NOPERM) on others; a wrong password is WRONGPASS", () =>
    Effect.scoped(Effect.gen(function*() {
      const fleet = yield* startRedis()
      const port = fleet.ports[0]!
      yield* fleet.createAclUser("mpc", "s3cret", "mpc:*")
      const auth = { user: "mpc", pass: "s3cret" }
      assert.strictEqual(fleet.urlAs(auth), `redis://mpc:s3cret@127.0.0.1:${port}`)
      assert.strictEqual(yield* fleet.command(port, ["SET", chunkKey(7), "v"], auth), "OK")
      assert.strictEqual(yield* fleet.command(port, ["GET", chunkKey(7)], auth), "v")
      const refused = yield* fleet.command(port, ["SET", "other:key", "v"], auth).pipe(Effect.flip)
      assert.strictEqual(refused._tag, "RedisReplyError")
      assert.strictEqual(refused._tag === "RedisReplyError" ? refused.code : "", "NOPERM")
      assert.strictEqual(yield* fleet.command(port, ["EXISTS", "other:key"]), "0")
      const wrong = yield* fleet.command(port, ["PING"], { user: "mpc", pass: "nope" }).pipe(Effect.flip)
      assert.strictEqual(wrong._tag === "RedisReplyError" ? wrong.code : wrong._tag, "WRONGPASS")
    })), 60_000)

  it.live("maxmemory with allkeys-lru evicts instead of refusing writes", () =>
    Effect.scoped(Effect.gen(function*() {
      const fleet = yield* startRedis()
      const port = fleet.ports[0]!
      yield* fleet.setMaxmemory(4 * 1024 * 1024)
      assert.strictEqual(yield* fleet.command(port, ["CONFIG", "GET", "maxmemory-policy"]), "maxmemory-policy\nallkeys-lru")
      const value = "v".repeat(16 * 1024)
      const replies = yield* fleet.pipeline(port, Array.from({ length: 1000 }, (_, i) => `SET ${chunkKey(i)} ${value}`))
      assert.deepStrictEqual([...new Set(replies)], ["OK"])
      const info = yield* fleet.command(port, ["INFO", "stats"])
      assert.isAbove(Number(infoField(info, "evicted_keys")), 0)
      assert.isBelow(Number(yield* fleet.command(port, ["DBSIZE"])), 1000)
    })), 60_000)
})
