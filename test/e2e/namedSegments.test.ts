/**
 * Named segments with their limits said (issue 13 item 3), end to end:
 * `--named-segments deny` refuses a cpu_shm REGISTER with invalid_argument;
 * an invalid value exits 2 naming the flag; `--unlink-reaped-segments`
 * unlinks a SIGKILLed worker's /dev/shm names after its disconnect reap,
 * except a name a new process re-created meanwhile (another inode), which
 * is kept.
 */
import { spawnSync } from "node:child_process"
import { randomUUID } from "node:crypto"
import { existsSync, readdirSync, rmSync, statSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { addonPath } from "../../src/native/Native.ts"
import { runCli, runJsonScript, startCli, startScript } from "../support/Cli.ts"
import { childScript } from "../support/ChildScripts.ts"

const SHRINK = childScript("shrink-worker")
const DAEMON = childScript("worker-daemon")

const ipcEndpoint = () => `ipc://${join(tmpdir(), `mpcache-named-${randomUUID()}.sock`)}`

const startServer = (endpoint: string, flags: ReadonlyArray<string>) =>
  Effect.gen(function*() {
    const server = yield* startCli(["serve", "--endpoint", endpoint, "--http-port", "0", "--chunk-size", "64", "--l1-size-gb", "0.25", ...flags])
    yield* server.waitForStderr(/MQ server listening on/, 60_000)
    return server
  })

/** /dev/shm names starting with `prefix`, sorted. */
const namesOf = (prefix: string) => readdirSync("/dev/shm").filter((n) => n.startsWith(prefix)).sort()

/** Removes what a SIGKILLed worker (or the test) left under `prefix`, when the scope closes. */
const cleanUp = (prefix: string) =>
  Effect.addFinalizer(() => Effect.sync(() => namesOf(prefix).forEach((n) => rmSync(`/dev/shm/${n}`, { force: true }))))

const startWorker = (endpoint: string, namePrefix: string) =>
  Effect.gen(function*() {
    yield* cleanUp(namePrefix)
    const worker = yield* startScript(DAEMON, [JSON.stringify({ endpoint, namePrefix, heartbeatIntervalMs: 1_000, storeEveryMs: 60_000 })])
    const [, instanceId] = yield* worker.waitForStdout(/"event":"registered","instanceId":"(\d+)"/, 30_000)
    yield* worker.waitForStdout(/"event":"store","n":1,"ok":true/, 30_000)
    return { worker, instanceId: instanceId! }
  })

describe("--named-segments", () => {
  it.live("deny: a cpu_shm REGISTER is refused with invalid_argument saying named segments are disabled", () =>
    Effect.scoped(Effect.gen(function*() {
      const endpoint = ipcEndpoint()
      yield* startServer(endpoint, ["--named-segments", "deny"])
      const r = yield* runJsonScript(SHRINK, {
        endpoint,
        mode: "register-only",
        namePrefix: `mpcache-named-deny-${randomUUID()}`,
        geometry: { numLayers: 2, numBlocks: 16, blockSizeTokens: 16, numHeads: 1, headSize: 16 },
        blockIds: [],
        tokenCount: 0,
        requestId: "deny",
        shrinkTo: 1
      })
      assert.strictEqual(r.code, 0, r.stderr)
      const id = r.result["instanceId"]
      assert.deepStrictEqual((r.result["register"] as { error: unknown }).error, {
        _tag: "InvalidArgument",
        op: "register_kv_cache",
        instance_id: id,
        field: "kv_caches[0].kind",
        expected: "a descriptor kind other than cpu_shm",
        actual: "cpu_shm",
        message: `register_kv_cache: instance ${id}: kv_caches[0] is a named shared-memory segment (cpu_shm), and named segments are disabled on this server (--named-segments deny)`
      })
    })), 60_000)

  it.live("a value other than allow or deny exits 2 naming the flag", () =>
    Effect.gen(function*() {
      const r = yield* runCli(["serve", "--named-segments", "maybe"])
      assert.strictEqual(r.code, 2)
      assert.include(r.stderr, `Invalid value for flag --named-segments: "maybe". Expected: "allow" | "deny"`)
    }))
})

describe("--unlink-reaped-segments", () => {
  it.live("after a disconnect reap: the worker's names are gone, a name a new process re-created is kept", () =>
    Effect.scoped(Effect.gen(function*() {
      const endpoint = ipcEndpoint()
      const server = yield* startServer(endpoint, ["--unlink-reaped-segments", "--worker-disconnect-grace-seconds", "1"])
      const gonePrefix = `mpcache-named-gone-${randomUUID()}`
      const keptPrefix = `mpcache-named-kept-${randomUUID()}`
      const gone = yield* startWorker(endpoint, gonePrefix)
      const kept = yield* startWorker(endpoint, keptPrefix)
      const goneNames = namesOf(gonePrefix)
      const keptNames = namesOf(keptPrefix)
      assert.strictEqual(goneNames.length, 2)
      assert.strictEqual(keptNames.length, 2)
      const oldInode = statSync(`/dev/shm/${keptNames[0]}`).ino
      gone.worker.child.kill("SIGKILL")
      kept.worker.child.kill("SIGKILL")
      // "A restarted worker": another process removes one stale name and creates it anew (another inode), before the reap.
      const recreate = spawnSync(process.execPath, [
        "-e",
        `const a = require(${JSON.stringify(addonPath)}); a.shmUnlink(${JSON.stringify(keptNames[0])}); a.shmCreate(${JSON.stringify(keptNames[0])}, 4096)`
      ], { encoding: "utf8" })
      assert.strictEqual(recreate.status, 0, recreate.stderr)
      const newInode = statSync(`/dev/shm/${keptNames[0]}`).ino
      assert.notStrictEqual(newInode, oldInode)
      // The events: the reaps' unlink decisions, logged per name.
      for (const name of goneNames) yield* server.waitForStderr(new RegExp(`unlinked /dev/shm/${name} of reaped instance ${gone.instanceId}`), 30_000)
      yield* server.waitForStderr(
        new RegExp(`kept /dev/shm/${keptNames[0]} of reaped instance ${kept.instanceId}: the name now names another segment \\(re-created\\)`),
        30_000
      )
      yield* server.waitForStderr(new RegExp(`unlinked /dev/shm/${keptNames[1]} of reaped instance ${kept.instanceId}`), 30_000)
      assert.deepStrictEqual(goneNames.filter((n) => existsSync(`/dev/shm/${n}`)), [])
      assert.deepStrictEqual(namesOf(keptPrefix), [keptNames[0]])
      assert.strictEqual(statSync(`/dev/shm/${keptNames[0]}`).ino, newInode)
      assert.strictEqual(statSync(`/dev/shm/${keptNames[0]}`).size, 4096)
    })), 90_000)
})
