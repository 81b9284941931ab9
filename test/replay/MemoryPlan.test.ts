import { assert, describe, it } from "@effect/vitest"
import { MEMORY_HEADROOM, planMemory, PROCESS_OVERHEAD_BYTES, refusal, type ReplayShape } from "../../src/replay/MemoryPlan.ts"

const GiB = 2 ** 30
// llama3-8b: 32 layers × 8 heads × 128 × float16, K and V: 131,072 bytes per token.
const llama: ReplayShape = {
  workers: 2,
  transferMode: "lmcache-driven",
  device: "cpu",
  kvBytesPerToken: 2 * 32 * 8 * 128 * 2,
  maxTokens: 87_040,
  blockSizeTokens: 16,
  l1Bytes: 4 * GiB
}

describe("MemoryPlan", () => {
  it("an LMCache-driven worker's KV cache is the longest request's blocks plus one, all in /dev/shm", () => {
    const needs = planMemory(llama)
    const cache = (87_040 / 16 + 1) * 16 * 131_072
    assert.deepStrictEqual(needs, {
      workerKvBytes: cache,
      shmBytes: 2 * cache + 4 * GiB,
      totalBytes: 2 * cache + 4 * GiB + 4 * PROCESS_OVERHEAD_BYTES,
      processes: 4
    })
  })

  it("engine-driven workers hold the request's chunk objects in their heap; cuda workers in device memory", () => {
    assert.deepStrictEqual(planMemory({ ...llama, transferMode: "engine-driven" }), {
      workerKvBytes: 87_040 * 131_072,
      shmBytes: 4 * GiB,
      totalBytes: 2 * 87_040 * 131_072 + 4 * GiB + 4 * PROCESS_OVERHEAD_BYTES,
      processes: 4
    })
    assert.deepStrictEqual(planMemory({ ...llama, device: "cuda" }), {
      workerKvBytes: 0,
      shmBytes: 4 * GiB,
      totalBytes: 4 * GiB + 4 * PROCESS_OVERHEAD_BYTES,
      processes: 4
    })
  })

  it("refuses past 90 % of MemAvailable or past the free space of /dev/shm, naming the figures and the flags", () => {
    const needs = planMemory(llama)
    const fits = { memAvailableBytes: Math.ceil(needs.totalBytes / MEMORY_HEADROOM) + 1, shmFreeBytes: needs.shmBytes }
    assert.strictEqual(refusal(llama, needs, fits), undefined)
    assert.isString(refusal(llama, needs, { ...fits, shmFreeBytes: needs.shmBytes - 1 }))
    const message = refusal(llama, needs, { memAvailableBytes: 24 * GiB, shmFreeBytes: 12 * GiB })!
    assert.strictEqual(
      message,
      "this replay needs 25.9 GiB of memory (2 worker(s) × 10.6 GiB of KV cache for the longest request, 87040 tokens; " +
        "4.0 GiB of L1; 4 processes × 0.2 GiB), 25.3 GiB of it in /dev/shm, but this machine has 24.0 GiB available " +
        "(MemAvailable; a replay plans at most 90 % of it) and 12.0 GiB free in /dev/shm. Lower --workers, " +
        "--max-input-tokens (skips longer requests), --requests or --l1-size-gb, or use --model small."
    )
  })
})
