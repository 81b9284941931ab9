/**
 * Child program of bench:liveness (part 3, heap per tracked context); needs
 * `--expose-gc`:
 *
 *   node --expose-gc bench/liveness/heap-child.ts --n 100000 --case registry
 *
 * Each case builds N tracked contexts between two full collections and
 * reports `(heapUsed after − heapUsed before) / N` in bytes; the ids (63-bit
 * bigints) are created inside the measured span, so their heap counts too.
 *
 * - `registry`: an InstanceRegistry entry alone (every entry holds the same
 *   shared resource object, so only the registry's own cost counts): the
 *   Tracked record, the id and the TxHashMap's share.
 * - `registry, pinged`: the same after one PING per entry (touch replaces
 *   each record), the steady state of a live worker.
 * - `plain Map` (reference): the same records in a `Map<bigint, Tracked>`.
 * - `registry + ContextEntry (L layers)`: the entry plus a resource shaped
 *   like LmcacheDrivenTransfer's ContextEntry without its mappings: decoded
 *   per-layer descriptors (fresh arrays, unique segment names), the
 *   geometry and placements from validateKvCaches, an empty mappings Map
 *   and a Scope forked from a module scope holding one finalizer (the
 *   layout reference's).
 *
 * One case per process (`--case NAME`, default `registry`), so that no
 * other case's leftovers move the baseline. Prints one JSON line on stdout:
 * `{"heap":{n, name, bytesPerEntry}}`.
 */
import { randomUUID } from "node:crypto"
import { parseArgs } from "node:util"
import { Effect, Scope } from "effect"
import type { TensorDescriptor } from "../../src/schema/TensorDescriptor.ts"
import { makeInstanceRegistry, type Tracked } from "../../src/services/liveness/InstanceRegistry.ts"
import { validateKvCaches } from "../../src/services/kv/KvCacheLayout.ts"
import { randomIds } from "./fixture.ts"

const { values: args } = parseArgs({
  options: { n: { type: "string", default: "100000" }, case: { type: "string", default: "registry" } }
})
const N = Number(args.n)

const gcFn = (globalThis as { gc?: () => void }).gc
if (gcFn === undefined) {
  process.stderr.write("bench/liveness/heap-child.ts needs node --expose-gc\n")
  process.exit(2)
}
const fullGc = (): void => {
  for (let i = 0; i < 3; i++) gcFn()
}

export interface HeapCase {
  readonly name: string
  readonly bytesPerEntry: number
}

/** Heap growth per entry of what `build` returns (kept alive until measured). */
const measure = async (name: string, build: () => Promise<unknown>): Promise<HeapCase> => {
  fullGc()
  const before = process.memoryUsage().heapUsed
  const kept = await build()
  fullGc()
  const after = process.memoryUsage().heapUsed
  const bytesPerEntry = (after - before) / N
  process.stderr.write(`heap ${name}: ${bytesPerEntry.toFixed(0)} B/entry (N=${N})\n`)
  void kept
  return { name, bytesPerEntry }
}

const SHARED = Object.freeze({ shared: true })

/** The chunk size the ContextEntry's geometry is validated against, tokens (part 4's server runs with the same). */
const CHUNK_TOKENS = 64

/** N registry entries all holding `resource(i)`; optionally one PING each. */
const buildRegistry = <R>(n: number, resource: (i: number) => Effect.Effect<R>, ping: boolean) =>
  Effect.runPromise(Effect.gen(function*() {
    const registry = yield* makeInstanceRegistry<R>()
    const ids = randomIds(n)
    const now = Date.now()
    for (let i = 0; i < n; i++) yield* registry.insert(ids[i]!, yield* resource(i), now)
    if (ping) for (let i = 0; i < n; i++) yield* registry.touch(ids[i]!, now + 1)
    return registry
  }))

/** The descriptors one REGISTER_KV_CACHE of `layers` layers decodes to (worker-daemon geometry). */
const descriptors = (layers: number): Array<TensorDescriptor> => {
  const prefix = `mpcache-w-${randomUUID()}`
  const [numBlocks, blockSize, numHeads, headSize] = [16, 16, 1, 16]
  const elements = 2 * numBlocks * blockSize * numHeads * headSize
  return Array.from({ length: layers }, (_, l): TensorDescriptor => ({
    kind: "cpu_shm",
    shm_name: `${prefix}-L${l}`,
    device_uuid: "cpu",
    nbytes: elements * 2,
    dtype: "float16",
    shape: [2, numBlocks, blockSize, numHeads, headSize],
    stride: [numBlocks * blockSize * numHeads * headSize, blockSize * numHeads * headSize, numHeads * headSize, headSize, 1],
    storage_offset: 0
  }))
}

/** A resource shaped like ContextEntry, without mappings. */
const contextEntry = (moduleScope: Scope.Closeable, layers: number) =>
  Effect.gen(function*() {
    const kvCaches = descriptors(layers)
    const validated = validateKvCaches(kvCaches, CHUNK_TOKENS)
    if ("error" in validated) return yield* Effect.die(new Error(validated.error))
    const scope = yield* Scope.fork(moduleScope)
    yield* Scope.addFinalizer(scope, Effect.void)
    return {
      modelName: "liveness-e2e",
      worldSize: 1,
      engineType: "vllm",
      descriptors: kvCaches,
      geometry: validated.geometry,
      layers: validated.layers,
      mappings: new Map<string, never>(),
      scope
    }
  })

/** The cases, by name: each builds `n` entries. */
const CASES: Record<string, (n: number) => Promise<unknown>> = {
  "registry": (n) => buildRegistry(n, () => Effect.succeed(SHARED), false),
  "registry, pinged": (n) => buildRegistry(n, () => Effect.succeed(SHARED), true),
  "plain Map": async (n) => {
    const map = new Map<bigint, Tracked<object>>()
    const ids = randomIds(n)
    const now = Date.now()
    for (const id of ids) map.set(id, { id, resource: SHARED, lastSeenMs: now, hasLivenessSignal: false, hasTransferActivity: false })
    return map
  },
  "registry + ContextEntry (2 layers)": (n) => withModuleScope((scope) => buildRegistry(n, () => contextEntry(scope, 2), false)),
  "registry + ContextEntry (32 layers)": (n) => withModuleScope((scope) => buildRegistry(n, () => contextEntry(scope, 32), false))
}

const withModuleScope = async <A>(f: (scope: Scope.Closeable) => Promise<A>): Promise<readonly [A, Scope.Closeable]> => {
  const scope = Effect.runSync(Scope.make())
  return [await f(scope), scope] as const
}

const main = async (): Promise<void> => {
  const build = CASES[args.case]
  if (build === undefined) {
    process.stderr.write(`--case must be one of ${Object.keys(CASES).map((c) => JSON.stringify(c)).join(", ")}\n`)
    process.exit(2)
  }
  // Warm-up: load and JIT the code path on a small instance, outside the measurement; then let the
  // runtime drop any reference to that last result (one more run) before collecting.
  await build(Math.min(N, 1000))
  await Effect.runPromise(Effect.void)
  const result = await measure(args.case, () => build(N))
  process.stdout.write(`${JSON.stringify({ heap: { n: N, ...result } })}\n`)
}

await main()
