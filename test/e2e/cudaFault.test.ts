/**
 * CUDA faults end to end (issue 13 item 4): real processes, the fake
 * libcudart (test/support/fakecudart) loaded by the server and by the CUDA
 * worker, failing on demand in the server only. A cuda_ipc handle the driver
 * refuses, a device lost mid-STORE (the copy's synchronize reports
 * cudaErrorLaunchFailure) and an ECC error mid-RETRIEVE that leaves the
 * server's CUDA context sticky-broken each end that request with
 * `invalid_argument` naming the instance, the descriptor, the device and the
 * CUDA error, within a second; the instance is released through its
 * finalizer (none left in `/api/status`, its mappings gone); the server keeps
 * serving a cpu_shm worker that transfers all along, and another worker's
 * bytes in L1 come back intact; `/api/status` (fault_guard.cuda_faults) and
 * `/metrics` (mpcache_guarded_faults_total{kind,call}) count the same faults.
 */
import { randomUUID } from "node:crypto"
import { afterAll } from "vitest"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { runJsonScript } from "../support/Cli.ts"
import { CUDA_ERRORS, FAKE_DEVICES, readFakeState, removeFakeCudart, useFakeCudartInProcess } from "../support/FakeCudart.ts"
import { assertRetrievesIntact, ipcEndpoint, startServer, startWorker, statusOf } from "../support/LiveFleet.ts"
import { childScript } from "../support/ChildScripts.ts"

// Children (the server and the workers) inherit MPCACHE_CUDART.
const fake = useFakeCudartInProcess()
afterAll(() => removeFakeCudart(fake))
const [DEV0] = FAKE_DEVICES

const WORKER = childScript("worker-main")
const CUDA_WORKER = childScript("cuda-fault-worker")

/** mpcache_guarded_faults_total as "kind/call" → count, from /metrics. */
const faultMetrics = (port: number) =>
  Effect.promise(() => fetch(`http://127.0.0.1:${port}/metrics`).then((r) => r.text())).pipe(
    Effect.map((text) => {
      const out: Record<string, number> = {}
      for (const m of text.matchAll(/^mpcache_guarded_faults_total\{([^}]*)\} (\d+(?:\.\d+)?)$/gm)) {
        const labels = Object.fromEntries([...m[1]!.matchAll(/(\w+)="([^"]*)"/g)].map((l) => [l[1]!, l[2]!]))
        out[`${labels["kind"]}/${labels["call"]}`] = Number(m[2])
      }
      return out
    })
  )

type Outcome = { readonly ok?: boolean; readonly ms: number; readonly error?: Record<string, unknown> }

/** The reply to a CUDA failure of `call` with `error` on the worker's kv_caches[0] (one allocation, one handle). */
const cudaError = (op: string, instanceId: unknown, call: string, name: keyof typeof CUDA_ERRORS, text: string, refused = false) => {
  const error = `${name} (cudaError ${CUDA_ERRORS[name]}: ${text})`
  const tail = op === "register_kv_cache" ? "nothing of the instance is kept" : "its context is released: register it again once the device is healthy"
  return {
    _tag: "InvalidArgument",
    op,
    instance_id: instanceId,
    field: "kv_caches[0]",
    expected: refused
      ? `a CUDA IPC handle from cudaIpcGetMemHandle of a live process on this host, on device ${DEV0}`
      : `a usable CUDA IPC mapping on device ${DEV0}`,
    actual: `${call} failed with ${error}`,
    message: refused
      ? `${op}: instance ${instanceId}: kv_caches[0] (cuda_ipc on device ${DEV0}): the CUDA driver refused the IPC handle: ${call} failed with ${error}; expected a handle from cudaIpcGetMemHandle of a live process on this host, on that device; nothing of the instance is kept`
      : `${op}: instance ${instanceId}: kv_caches[0] (cuda_ipc on device ${DEV0}): ${call} failed with ${error}; the device memory cannot be used (a device lost, an ECC error or a sticky CUDA error); ${tail}`
  }
}

describe("CUDA faults: a refused handle, a device lost mid-copy, a sticky error", () => {
  it.live("each answered invalid_argument within a second, the instance released, the server alive, the cpu_shm workers' transfers and bytes intact, status = metrics", () =>
    Effect.scoped(Effect.gen(function*() {
      const endpoint = ipcEndpoint()
      const { server, httpPort } = yield* startServer(endpoint, ["--l1-size-gb", "0.25"], 60_000)
      // A cpu_shm worker's chunks in L1 before anything fails.
      const a = yield* runJsonScript(WORKER, {
        endpoint,
        mode: "store",
        namePrefix: `mpcache-cudafault-a-${randomUUID()}`,
        seed: 42,
        blockIds: Array.from({ length: 20 }, (_, i) => i + 1),
        tokenCount: 330,
        requestId: "req-a"
      })
      assert.strictEqual(a.code, 0, a.stderr)
      assert.strictEqual(a.result["ok"], true)
      // Another cpu_shm worker transferring all along: a STORE every 10 ms.
      const daemon = yield* startWorker(endpoint, 1_000, 10)
      const storesSoFar = () => Number([...daemon.worker.stdout().matchAll(/"event":"store","n":(\d+),"ok":true/g)].pop()?.[1] ?? 0)

      // 1. A handle the driver refuses (its first byte flipped): REGISTER fails, nothing is kept.
      const refused = yield* runJsonScript(CUDA_WORKER, {
        endpoint,
        mode: "refused",
        deviceUuid: DEV0,
        blockIds: [],
        tokenCount: 0,
        requestId: "req-refused"
      })
      assert.strictEqual(refused.code, 0, refused.stderr)
      const register = refused.result["register"] as Outcome
      assert.deepStrictEqual(
        register.error,
        cudaError("register_kv_cache", refused.result["instanceId"], "cudaIpcOpenMemHandle", "cudaErrorInvalidValue", "invalid argument", true)
      )
      // The exact error (not the client's RequestTimeout) is the proof that the fault never hung the request;
      // no wall-clock bound (a loaded machine answers slower, and that is no failure).

      // 2. The device is lost under the second copy of a 2-chunk STORE: the synchronize reports it.
      const before = storesSoFar()
      const lost = yield* runJsonScript(CUDA_WORKER, {
        endpoint,
        mode: "store-fail",
        deviceUuid: DEV0,
        blockIds: [1, 2, 3, 4, 5, 6, 7, 8],
        tokenCount: 128,
        requestId: "req-lost",
        failure: { point: "sync", error: CUDA_ERRORS.cudaErrorLaunchFailure, mode: "once", skip: 1 }
      })
      assert.strictEqual(lost.code, 0, lost.stderr)
      const lostError = cudaError("store", lost.result["instanceId"], "cudaStreamSynchronize", "cudaErrorLaunchFailure", "unspecified launch failure")
      const store = lost.result["store"] as Outcome
      assert.deepStrictEqual(store.error, lostError)
      // The id's context is gone; its next request gets the same error, not not_registered.
      assert.deepStrictEqual((lost.result["storeAfter"] as Outcome).error, lostError)
      // The cpu_shm daemon kept storing meanwhile.
      assert.isAbove(storesSoFar(), before)

      // 3. An uncorrectable ECC error at the first copy of a RETRIEVE, sticky: the server's CUDA context is
      //    unusable from then on, so the same worker's REGISTER again is refused too.
      const ecc = yield* runJsonScript(CUDA_WORKER, {
        endpoint,
        mode: "retrieve-fail",
        deviceUuid: DEV0,
        blockIds: [10, 11, 12, 13],
        tokenCount: 64,
        requestId: "req-ecc",
        failure: { point: "memcpy", error: CUDA_ERRORS.cudaErrorECCUncorrectable, mode: "sticky" }
      })
      assert.strictEqual(ecc.code, 0, ecc.stderr)
      const eccId = ecc.result["instanceId"]
      assert.strictEqual((ecc.result["stored"] as Outcome).ok, true)
      assert.strictEqual(ecc.result["hitTokens"], 64)
      const retrieve = ecc.result["retrieve"] as Outcome
      const eccText = "uncorrectable ECC error encountered"
      assert.deepStrictEqual(retrieve.error, cudaError("retrieve", eccId, "cudaMemcpyAsync", "cudaErrorECCUncorrectable", eccText))
      assert.deepStrictEqual(
        (ecc.result["storeAfter"] as Outcome).error,
        cudaError("store", eccId, "cudaMemcpyAsync", "cudaErrorECCUncorrectable", eccText)
      )
      assert.deepStrictEqual(
        (ecc.result["registerAgain"] as Outcome).error,
        cudaError("register_kv_cache", eccId, "cudaSetDevice", "cudaErrorECCUncorrectable", eccText)
      )
      // The broken context's release fails too; the server logs it and drops the mapping all the same.
      assert.match(server.stderr(), /releasing the mapping of cuda:GPU-facec0da-0000-4000-8000-000000000000:[0-9a-f]+ failed: release of cuda:[^:]+:[0-9a-f]+: cudaSetDevice failed: uncorrectable ECC error encountered \(cudaErrorECCUncorrectable, cudaError 214\)/)

      // The server is alive and still serves the cpu_shm workers: A's chunks come back byte for byte.
      assert.strictEqual(server.child.exitCode, null)
      assert.strictEqual(server.child.signalCode, null)
      yield* assertRetrievesIntact(endpoint, `mpcache-cudafault-c-${randomUUID()}`)
      const n = storesSoFar()
      yield* daemon.worker.waitForStdout(new RegExp(`"event":"store","n":${n + 2},"ok":true`))
      assert.notInclude(daemon.worker.stdout(), "store_error")
      assert.notInclude(daemon.worker.stdout(), `"ok":false`)

      // Status and metrics agree: four CUDA faults, no shrunk segment; only the daemon's context is left,
      // with its two cpu_shm segments (2 × 16 blocks × 16 tokens × 16 fp16, K and V).
      const doc = yield* statusOf(httpPort)
      assert.deepStrictEqual(doc.fault_guard, { guarded_faults: 0, cuda_faults: 4 })
      assert.deepStrictEqual(yield* faultMetrics(httpPort), {
        "cuda_handle_refused/cudaIpcOpenMemHandle": 1,
        "cuda_error/cudaStreamSynchronize": 1,
        "cuda_error/cudaMemcpyAsync": 1,
        "cuda_error/cudaSetDevice": 1
      })
      assert.deepStrictEqual(doc.instances.map((i) => i.instance_id), [daemon.instanceId])
      assert.deepStrictEqual(doc.native, { open_mappings: 2, mapped_bytes: 2 * (2 * 16 * 16 * 16 * 2) })
      // Once the daemon has stopped (its STOREs reserve all along): L1 holds no reservation or read lock that a
      // failed STORE or RETRIEVE left behind, and nothing is mapped.
      yield* daemon.worker.stop("SIGTERM")
      const quiet = yield* statusOf(httpPort)
      assert.deepStrictEqual(
        { reserved: quiet.l1.reserved_objects, locked: quiet.l1.locked_objects, instances: quiet.instances, native: quiet.native },
        { reserved: 0, locked: 0, instances: [], native: { open_mappings: 0, mapped_bytes: 0 } }
      )
      // The fake saw the two failures it injected and no misuse (no copy left queued on a closed mapping).
      const state = readFakeState(fake)
      assert.deepStrictEqual({ failures: state.failures, violations: state.violations }, { failures: 2, violations: 0 })
    })), 180_000)
})
