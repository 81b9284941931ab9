/**
 * The mapping bounds' rules (issue 24 items 4 and 12, MapLimits.ts): the
 * kernel's vm.max_map_count read at start (or Linux's default with the
 * reason), and the defaults and maxima of `--max-mappings`,
 * `--max-segments-per-register` and `--max-mapped-bytes` derived from it,
 * as `validate` applies them (an invalid value names the flag and the rule).
 */
import { mkdtempSync, readFileSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import {
  DEFAULT_MAX_SEGMENTS_PER_REGISTER,
  defaultMaxMappedBytes,
  defaultMaxMappings,
  type KernelMapCount,
  maxMappingsAllowed,
  readKernelMaxMapCount,
  RESERVED_MAPS
} from "../../../src/services/server/MapLimits.ts"
import { defaults, formatIssue, validate } from "../../../src/services/server/ServerConfig.ts"

const kernel = (value: number): KernelMapCount => ({ value, source: "kernel" })
const issuesUnder = (k: KernelMapCount, over: Partial<typeof defaults>) => {
  const r = validate({ ...defaults, ...over }, k)
  return "issues" in r ? r.issues.map(formatIssue) : []
}
const limitsUnder = (k: KernelMapCount, over: Partial<typeof defaults> = {}) => {
  const r = validate({ ...defaults, ...over }, k)
  if (!("config" in r)) throw new Error(r.issues.map(formatIssue).join("\n"))
  return r.config.mapLimits
}

describe("vm.max_map_count, read at start", () => {
  it("is this machine's /proc/sys/vm/max_map_count when readable", () => {
    const value = Number(readFileSync("/proc/sys/vm/max_map_count", "utf8").trim())
    assert.deepStrictEqual(readKernelMaxMapCount(), { value, source: "kernel" })
  })

  it("falls back to Linux's default 65530 with the reason when missing or not a positive integer", () => {
    const dir = mkdtempSync(join(tmpdir(), "mpcache-maplimits-"))
    assert.deepStrictEqual(readKernelMaxMapCount(join(dir, "absent")), {
      value: 65530,
      source: "fallback",
      reason: `cannot read ${join(dir, "absent")} (ENOENT)`
    })
    writeFileSync(join(dir, "bad"), "lots\n")
    assert.deepStrictEqual(readKernelMaxMapCount(join(dir, "bad")), {
      value: 65530,
      source: "fallback",
      reason: `${join(dir, "bad")} holds "lots", not a positive integer`
    })
    writeFileSync(join(dir, "zero"), "0\n")
    assert.strictEqual(readKernelMaxMapCount(join(dir, "zero")).source, "fallback")
    writeFileSync(join(dir, "big"), "1048576\n")
    assert.deepStrictEqual(readKernelMaxMapCount(join(dir, "big")), { value: 1048576, source: "kernel" })
  })
})

describe("the derived defaults and maxima", () => {
  it("--max-mappings: half the cap by default, at most the cap less 16384 (half of a cap below 32768)", () => {
    assert.strictEqual(RESERVED_MAPS, 16384)
    assert.deepStrictEqual([defaultMaxMappings(65530), maxMappingsAllowed(65530)], [32765, 49146])
    assert.deepStrictEqual([defaultMaxMappings(1048576), maxMappingsAllowed(1048576)], [524288, 1032192])
    assert.deepStrictEqual([defaultMaxMappings(20000), maxMappingsAllowed(20000)], [10000, 10000])
  })

  it("--max-mapped-bytes: half the RAM; --max-segments-per-register: 1024", () => {
    assert.strictEqual(defaultMaxMappedBytes(64 * 2 ** 30), 32 * 2 ** 30)
    assert.strictEqual(defaultMaxMappedBytes(2 ** 30 + 1), 2 ** 29)
    assert.strictEqual(defaults.maxMappedBytes, defaultMaxMappedBytes())
    assert.strictEqual(DEFAULT_MAX_SEGMENTS_PER_REGISTER, 1024)
  })

  it("validate derives them from the cap it is given", () => {
    assert.deepStrictEqual(limitsUnder(kernel(65530)), {
      kernelMaxMapCount: kernel(65530),
      maxMappings: 32765,
      maxSegmentsPerRegister: 1024,
      maxMappedBytes: defaultMaxMappedBytes()
    })
    // A --max-mappings below 1024 lowers the per-registration default with it.
    assert.deepStrictEqual(
      [limitsUnder(kernel(65530), { maxMappings: 100 }).maxMappings, limitsUnder(kernel(65530), { maxMappings: 100 }).maxSegmentsPerRegister],
      [100, 100]
    )
    const fallback: KernelMapCount = { value: 65530, source: "fallback", reason: "cannot read /proc/sys/vm/max_map_count (EACCES)" }
    assert.deepStrictEqual(limitsUnder(fallback, { maxSegmentsPerRegister: 8, maxMappedBytes: 4096 }), {
      kernelMaxMapCount: fallback,
      maxMappings: 32765,
      maxSegmentsPerRegister: 8,
      maxMappedBytes: 4096
    })
  })
})

describe("invalid values name the flag and the rule (exit 2)", () => {
  it("--max-mappings above what the kernel's cap allows", () => {
    assert.deepStrictEqual(issuesUnder(kernel(65530), { maxMappings: 49146 }), [])
    assert.deepStrictEqual(issuesUnder(kernel(65530), { maxMappings: 49147 }), [
      "--max-mappings: must be an integer from 1 to 49146 (got 49147): vm.max_map_count is 65530 (read at start from /proc/sys/vm/max_map_count) and the server keeps 16384 of those maps for its own (V8's heap, thread stacks, libraries, the L1 pool: 16384, or half of a cap below 32768); raise vm.max_map_count for more"
    ])
    assert.deepStrictEqual(
      issuesUnder({ value: 65530, source: "fallback", reason: "cannot read /proc/sys/vm/max_map_count (ENOENT)" }, { maxMappings: 0 }),
      [
        "--max-mappings: must be an integer from 1 to 49146 (got 0): vm.max_map_count is 65530 (assumed: cannot read /proc/sys/vm/max_map_count (ENOENT)) and the server keeps 16384 of those maps for its own (V8's heap, thread stacks, libraries, the L1 pool: 16384, or half of a cap below 32768); raise vm.max_map_count for more"
      ]
    )
  })

  it("a default --max-mappings under a small cap is valid; an explicit one over half of it is not", () => {
    assert.deepStrictEqual(issuesUnder(kernel(20000), {}), [])
    assert.deepStrictEqual(issuesUnder(kernel(20000), { maxMappings: 10001 }), [
      "--max-mappings: must be an integer from 1 to 10000 (got 10001): vm.max_map_count is 20000 (read at start from /proc/sys/vm/max_map_count) and the server keeps 10000 of those maps for its own (V8's heap, thread stacks, libraries, the L1 pool: 16384, or half of a cap below 32768); raise vm.max_map_count for more"
    ])
  })

  it("--max-segments-per-register above --max-mappings or below 1; --max-mapped-bytes below 1", () => {
    assert.deepStrictEqual(issuesUnder(kernel(65530), { maxMappings: 64, maxSegmentsPerRegister: 65 }), [
      "--max-segments-per-register: must be an integer from 1 to --max-mappings (64) (got 65)"
    ])
    assert.deepStrictEqual(issuesUnder(kernel(65530), { maxSegmentsPerRegister: 0, maxMappedBytes: 0 }), [
      "--max-segments-per-register: must be an integer from 1 to --max-mappings (32765) (got 0)",
      "--max-mapped-bytes: must be an integer of at least 1 (got 0)"
    ])
  })
})
