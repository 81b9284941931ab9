/**
 * The bounds on the worker memory the server maps, with or without CURVE
 * (issue 24 items 4 and 12): mappings held at once (under the kernel's
 * vm.max_map_count), segments per registration, bytes mapped. The
 * arithmetic of the kernel's cap is MapLimits.ts's.
 */
import {
  DEFAULT_MAX_SEGMENTS_PER_REGISTER,
  defaultMaxMappedBytes,
  defaultMaxMappings,
  type KernelMapCount,
  KERNEL_MAX_MAP_COUNT_PATH,
  maxMappingsAllowed,
  RESERVED_MAPS
} from "../MapLimits.ts"
import { commonRules, type ConfigIssue, issueCheck } from "./ConfigIssue.ts"

/**
 * Bounds on the worker memory the server maps (issue 24 items 4 and 12,
 * MapLimits.ts); over one a REGISTER or CB_REGISTER_ROPE is answered
 * `overloaded` naming the flag, before anything is mapped.
 */
export interface MapLimitsConfig {
  /** `vm.max_map_count` as read at start (or the fallback, logged as a warning). */
  readonly kernelMaxMapCount: KernelMapCount
  /** Mappings of worker memory held at once, over every instance (`--max-mappings`, default half the kernel's cap). */
  readonly maxMappings: number
  /** Distinct segments one registration may name (`--max-segments-per-register`, default 1024, at most `maxMappings`). */
  readonly maxSegmentsPerRegister: number
  /** Bytes of worker host memory mapped at once, over every instance (`--max-mapped-bytes`, default half the RAM). */
  readonly maxMappedBytes: number
}

/** The mapping flags as parsed (part of ServerConfigInput). */
export interface MapLimitsConfigInput {
  /** undefined: half the kernel's vm.max_map_count. */
  readonly maxMappings: number | undefined
  /** undefined: 1024, or `maxMappings` when that is lower. */
  readonly maxSegmentsPerRegister: number | undefined
  readonly maxMappedBytes: number
}

/** Defaults: half the kernel's cap, 1024 segments, half the RAM. */
export const mapLimitsDefaults: MapLimitsConfigInput = {
  maxMappings: undefined,
  maxSegmentsPerRegister: undefined,
  maxMappedBytes: defaultMaxMappedBytes()
}

/** Rules of the mapping flags against the values they depend on. */
export const mapLimitsRules = {
  /** `--max-mappings` under a kernel cap of `kernel` maps (MapLimits.ts). */
  maxMappings: (n: number, kernel: KernelMapCount) => {
    const allowed = maxMappingsAllowed(kernel.value)
    if (!Number.isSafeInteger(n) || n < 1 || n > allowed) {
      const read = kernel.source === "kernel" ? `read at start from ${KERNEL_MAX_MAP_COUNT_PATH}` : `assumed: ${kernel.reason}`
      return `must be an integer from 1 to ${allowed} (got ${n}): vm.max_map_count is ${kernel.value} (${read}) and the server keeps ${
        kernel.value - allowed
      } of those maps for its own (V8's heap, thread stacks, libraries, the L1 pool: ${RESERVED_MAPS}, or half of a cap below ${2 * RESERVED_MAPS}); raise vm.max_map_count for more`
    }
    return undefined
  },
  maxSegmentsPerRegister: (n: number, maxMappings: number) =>
    Number.isSafeInteger(n) && n >= 1 && n <= maxMappings
      ? undefined
      : `must be an integer from 1 to --max-mappings (${maxMappings}) (got ${n})`
} as const

/**
 * Resolves the bounds against the kernel's cap `kernel` and pushes broken
 * rules onto `issues`. Returns the bounds.
 */
export const validateMapLimits = (input: MapLimitsConfigInput, kernel: KernelMapCount, issues: Array<ConfigIssue>): MapLimitsConfig => {
  const check = issueCheck(issues)
  const maxMappings = input.maxMappings ?? defaultMaxMappings(kernel.value)
  const maxMappingsProblem = mapLimitsRules.maxMappings(maxMappings, kernel)
  check("max-mappings", maxMappingsProblem)
  const maxSegmentsPerRegister = input.maxSegmentsPerRegister ?? Math.min(DEFAULT_MAX_SEGMENTS_PER_REGISTER, maxMappings)
  // Against --max-mappings only once that one is valid (one broken rule, one message).
  check(
    "max-segments-per-register",
    maxMappingsProblem === undefined
      ? mapLimitsRules.maxSegmentsPerRegister(maxSegmentsPerRegister, maxMappings)
      : input.maxSegmentsPerRegister === undefined ? undefined : commonRules.positiveInt(maxSegmentsPerRegister)
  )
  check("max-mapped-bytes", commonRules.positiveInt(input.maxMappedBytes))
  return { kernelMaxMapCount: kernel, maxMappings, maxSegmentsPerRegister, maxMappedBytes: input.maxMappedBytes }
}
