/**
 * The segment keys and the segment demand of registration descriptors
 * (DESIGN §3.2: several descriptors may share one segment, which is mapped
 * once; issue 24 item 4: the demand is counted before anything per layer).
 */
import { assert, describe, it } from "@effect/vitest"
import type { TensorDescriptor } from "../../../src/schema/TensorDescriptor.ts"
import { cudaSegmentKey, segmentDemand, segmentKeyOf } from "../../../src/services/kv/KvCacheLayout.ts"

const base = { device_uuid: "cpu", dtype: "float16", shape: [2, 1, 16, 1, 8], stride: [128, 128, 8, 8, 1], storage_offset: 0 } as const
const shm = (name: string, nbytes: number): TensorDescriptor => ({ ...base, kind: "cpu_shm", shm_name: name, nbytes })
const memfd = (token: number, index: number, nbytes: number): TensorDescriptor => ({
  ...base,
  kind: "cpu_memfd",
  fd_token: new Uint8Array(16).fill(token),
  fd_index: index,
  nbytes
})
const ipc = (handle: number, nbytes: number): TensorDescriptor => ({
  ...base,
  kind: "cuda_ipc",
  device_uuid: "GPU-1",
  ipc_handle: new Uint8Array(64).fill(handle),
  nbytes
})

describe("segmentKeyOf", () => {
  it("is the shm name, the memfd token and index, or the device and IPC handle", () => {
    assert.strictEqual(segmentKeyOf(shm("kv-L0", 4096)), "kv-L0")
    assert.strictEqual(segmentKeyOf(memfd(1, 2, 4096)), `memfd:${"01".repeat(16)}:2`)
    assert.strictEqual(segmentKeyOf(ipc(3, 4096)), cudaSegmentKey("GPU-1", new Uint8Array(64).fill(3)))
    assert.strictEqual(segmentKeyOf(ipc(3, 4096)), `cuda:GPU-1:${"03".repeat(64)}`)
  })
})

describe("segmentDemand", () => {
  it("counts each segment once (its largest claim) and splits host from device bytes", () => {
    const d = segmentDemand([shm("a", 4096), shm("a", 8192), memfd(1, 0, 100), memfd(1, 1, 200), memfd(1, 0, 100), ipc(5, 1 << 20), ipc(5, 1 << 20)], 5)
    assert.deepStrictEqual(d, { segments: 4, hostBytes: 8192 + 100 + 200, deviceBytes: 1 << 20, over: false })
  })

  it("exactly at the limit is not over; one more is, and the walk stops there", () => {
    const many = Array.from({ length: 10 }, (_, i) => shm(`s${i}`, 4096))
    assert.deepStrictEqual(segmentDemand(many.slice(0, 3), 3), { segments: 3, hostBytes: 3 * 4096, deviceBytes: 0, over: false })
    assert.deepStrictEqual(segmentDemand(many, 3), { segments: 4, hostBytes: 4 * 4096, deviceBytes: 0, over: true })
  })
})
