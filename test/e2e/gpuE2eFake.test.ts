/**
 * scripts/gpu-e2e.ts against the fake libcudart (test/support/fakecudart):
 * a server process, an exporter process with "device" memory, store,
 * retrieve into the script's own device memory, SIGKILL of the exporter,
 * reap, and device memory back to the baseline — every CUDA call through the
 * fake, whose shared counters then show each IPC handle closed exactly once;
 * and a zeroed IPC handle refused at REGISTER, nothing kept (issue 13 item 4).
 */
import { spawn } from "node:child_process"
import { fileURLToPath } from "node:url"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { buildFakeCudart, readFakeState, removeFakeCudart } from "../support/FakeCudart.ts"

const SCRIPT = fileURLToPath(new URL("../../scripts/gpu-e2e.ts", import.meta.url))

describe("gpu-e2e against the fake libcudart", () => {
  it.live("store, retrieve byte-exact across processes, SIGKILL the exporter: reaped, its handle closed once, memory back", () =>
    Effect.gen(function*() {
      const fake = buildFakeCudart()
      yield* Effect.addFinalizer(() => Effect.sync(() => removeFakeCudart(fake)))
      const run = yield* Effect.callback<{ code: number | null; stdout: string; stderr: string }>((resume) => {
        const child = spawn(process.execPath, [SCRIPT], {
          stdio: ["ignore", "pipe", "pipe"],
          env: { ...process.env, MPCACHE_CUDART: fake.library }
        })
        let stdout = ""
        let stderr = ""
        child.stdout.on("data", (d: Buffer) => (stdout += d.toString()))
        child.stderr.on("data", (d: Buffer) => (stderr += d.toString()))
        child.on("close", (code) => resume(Effect.succeed({ code, stdout, stderr })))
        return Effect.sync(() => child.kill("SIGKILL"))
      })
      assert.strictEqual(run.code, 0, run.stderr + run.stdout)
      const result = JSON.parse(run.stdout.trim().split("\n").pop() ?? "{}") as {
        ok: boolean
        library: string
        exporterBytes: number
        mismatches: number
        freeBytes: { baseline: number; withExporter: number; afterKill: number; afterReap: number }
        reaped: string
        refusedHandle: { actual: string; ms: number; counted: { status: number; metric: number } }
      }
      assert.isTrue(result.ok)
      assert.strictEqual(result.library, fake.library)
      assert.strictEqual(result.mismatches, 0)
      assert.strictEqual(result.freeBytes.withExporter, result.freeBytes.baseline - result.exporterBytes)
      assert.strictEqual(result.freeBytes.afterKill, result.freeBytes.baseline - result.exporterBytes)
      assert.strictEqual(result.freeBytes.afterReap, result.freeBytes.baseline)
      assert.include(result.reaped, "(reason disconnect)")
      // A zeroed IPC handle: the fake refuses it as a driver does (issue 13 item 4), answered with its error, counted once.
      assert.deepStrictEqual(
        { actual: result.refusedHandle.actual, counted: result.refusedHandle.counted },
        { actual: "cudaIpcOpenMemHandle failed with cudaErrorInvalidValue (cudaError 1: invalid argument)", counted: { status: 1, metric: 1 } }
      )
      // The exact error (not the client's RequestTimeout) is the proof that the fault never hung the request;
      // no wall-clock bound (a loaded machine answers slower, and that is no failure).

      // Every process that loaded the fake shares its counters: the server opened B's and A's
      // handles once each and closed each once (A's at the reap, B's at B's unregister).
      const state = readFakeState(fake)
      assert.strictEqual(state.violations, 0)
      assert.strictEqual(state.ipcOpens, 2)
      assert.strictEqual(state.ipcCloses, 2)
      assert.deepStrictEqual(state.slots.map((s) => [s.opens, s.closes, s.importRefs, s.unlinked]), [[1, 1, 0, true], [1, 1, 0, true]])
    }).pipe(Effect.scoped), { timeout: 120_000 })
})
