/**
 * The wire limits (src/schema/Limits.ts, issue 24 item 5): every count that
 * sizes an allocation or a loop decodes at its maximum and is a
 * `bad_request` one past it, naming the op, the field and the maximum —
 * decoded from real MessagePack frames, as the server decodes them.
 */
import { assert, describe, it } from "@effect/vitest"
import { Exit, Schema } from "effect"
import { decodePayload, pack } from "../../src/schema/Frame.ts"
import { BlockIdList, TokenIds } from "../../src/schema/IntArrays.ts"
import {
  MAX_BLOCK_IDS,
  MAX_CB_MATCHES,
  MAX_CHUNK_SIZE_TOKENS,
  MAX_DEVICE_UUID_LENGTH,
  MAX_ENGINE_TYPE_LENGTH,
  MAX_EXPECTED_KINDS,
  MAX_HIDDEN_DIM,
  MAX_KV_GROUPS,
  MAX_LAYERS,
  MAX_LAYOUT_HINTS,
  MAX_MODEL_NAME_LENGTH,
  MAX_REQUEST_ID_LENGTH,
  MAX_SHM_NAME_LENGTH,
  MAX_TENSOR_DIMS,
  MAX_TOKEN_IDS,
  MAX_WORLD_SIZE
} from "../../src/schema/Limits.ts"
import {
  CbRegisterRope,
  CbRetrievePreComputed,
  EndSession,
  FreeLookupLocks,
  Lookup,
  type Op,
  PingRegistered,
  QueryPrefetchStatus,
  RegisterKvCache,
  RegisterKvCacheEngineDrivenContext,
  Retrieve
} from "../../src/schema/Op.ts"
import type { BadRequest } from "../../src/schema/WireError.ts"

const key = (over: Record<string, unknown> = {}) => ({
  model_name: "m",
  world_size: 2,
  worker_id: null,
  token_ids: [1, 2, 3, 4],
  start: 0,
  end: 4,
  request_id: "cmpl-1",
  cache_salt: "",
  ...over
})
const descriptor = (over: Record<string, unknown> = {}) => ({
  kind: "cpu_shm",
  shm_name: "seg",
  device_uuid: "cpu",
  nbytes: 4096,
  dtype: "uint8",
  shape: [2, 1, 16, 1, 1],
  stride: [16, 16, 1, 1, 1],
  storage_offset: 0,
  ...over
})
const context = (over: Record<string, unknown> = {}) => ({
  instance_id: 7,
  model_name: "m",
  world_size: 1,
  block_size: 16,
  num_layers: 1,
  hidden_dim_size: 8,
  dtype_str: "uint8",
  use_mla: false,
  ...over
})
const match = { old_st: 0, old_ed: 0, cur_st: 0, cur_ed: 0, hash: new Uint8Array(32) }
const register = (over: { kv?: unknown; model?: unknown; world?: unknown; engine?: unknown; hints?: unknown; groups?: unknown } = {}) => [
  7,
  over.kv ?? [descriptor()],
  over.model ?? "m",
  over.world ?? 1,
  over.engine ?? "vllm",
  over.hints ?? {},
  over.groups ?? []
]
const rope = (over: { caches?: unknown; head?: unknown; g2c?: unknown; grot?: unknown } = {}) => [
  7,
  over.caches ?? [],
  over.head ?? 64,
  true,
  over.g2c ?? [],
  over.grot ?? []
]
const times = <A>(n: number, a: A): Array<A> => Array.from({ length: n }, () => a)

/** The decode of `values` (each packed into its own frame) for `op`: ok, or the bad_request's message. */
const decode = (op: Op, values: ReadonlyArray<unknown>): { readonly ok: true } | { readonly error: string } => {
  const exit = decodePayload(op, values.map((v) => pack(v)))
  if (Exit.isSuccess(exit)) return { ok: true }
  const reason = exit.cause.reasons[0] as { readonly error: BadRequest }
  return { error: reason.error.message }
}

interface Bound {
  readonly what: string
  readonly op: Op
  readonly field: string
  readonly max: number
  /** The payload with the count at `n`. */
  readonly payload: (n: number) => ReadonlyArray<unknown>
}

const bounds: ReadonlyArray<Bound> = [
  { what: "a CacheKey's world_size", op: Lookup, field: "payload 0 (key)", max: MAX_WORLD_SIZE, payload: (n) => [key({ world_size: n }), 1] },
  { what: "REGISTER's world_size", op: RegisterKvCache, field: "payload 3 (world_size)", max: MAX_WORLD_SIZE, payload: (n) => register({ world: n }) },
  {
    what: "an engine-driven context's world_size",
    op: RegisterKvCacheEngineDrivenContext,
    field: "payload 0 (context)",
    max: MAX_WORLD_SIZE,
    payload: (n) => [context({ world_size: n })]
  },
  { what: "LOOKUP's tp_size", op: Lookup, field: "payload 1 (tp_size)", max: MAX_WORLD_SIZE, payload: (n) => [key(), n] },
  { what: "FREE_LOOKUP_LOCKS's tp_size", op: FreeLookupLocks, field: "payload 1 (tp_size)", max: MAX_WORLD_SIZE, payload: (n) => [key(), n] },
  {
    what: "a CacheKey's request_id",
    op: Lookup,
    field: "payload 0 (key)",
    max: MAX_REQUEST_ID_LENGTH,
    payload: (n) => [key({ request_id: "r".repeat(n) }), 1]
  },
  { what: "QUERY_PREFETCH_STATUS's request_id", op: QueryPrefetchStatus, field: "payload 0 (request_id)", max: MAX_REQUEST_ID_LENGTH, payload: (n) => ["r".repeat(n)] },
  { what: "END_SESSION's request_id", op: EndSession, field: "payload 0 (request_id)", max: MAX_REQUEST_ID_LENGTH, payload: (n) => ["r".repeat(n)] },
  { what: "a CacheKey's model_name", op: Lookup, field: "payload 0 (key)", max: MAX_MODEL_NAME_LENGTH, payload: (n) => [key({ model_name: "m".repeat(n) }), 1] },
  { what: "REGISTER's model_name", op: RegisterKvCache, field: "payload 2 (model_name)", max: MAX_MODEL_NAME_LENGTH, payload: (n) => register({ model: "m".repeat(n) }) },
  { what: "REGISTER's engine_type", op: RegisterKvCache, field: "payload 4 (engine_type)", max: MAX_ENGINE_TYPE_LENGTH, payload: (n) => register({ engine: "e".repeat(n) }) },
  { what: "REGISTER's kv_caches", op: RegisterKvCache, field: "payload 1 (kv_caches)", max: MAX_LAYERS, payload: (n) => register({ kv: times(n, descriptor()) }) },
  {
    what: "a descriptor's shape",
    op: RegisterKvCache,
    field: "payload 1 (kv_caches)",
    max: MAX_TENSOR_DIMS,
    payload: (n) => register({ kv: [descriptor({ shape: times(n, 1) })] })
  },
  {
    what: "a descriptor's stride",
    op: RegisterKvCache,
    field: "payload 1 (kv_caches)",
    max: MAX_TENSOR_DIMS,
    payload: (n) => register({ kv: [descriptor({ stride: times(n, 1) })] })
  },
  {
    what: "a descriptor's shm_name",
    op: RegisterKvCache,
    field: "payload 1 (kv_caches)",
    max: MAX_SHM_NAME_LENGTH,
    payload: (n) => register({ kv: [descriptor({ shm_name: "s".repeat(n) })] })
  },
  {
    what: "a descriptor's device_uuid",
    op: RegisterKvCache,
    field: "payload 1 (kv_caches)",
    max: MAX_DEVICE_UUID_LENGTH,
    payload: (n) => register({ kv: [descriptor({ device_uuid: "c".repeat(n) })] })
  },
  {
    what: "layout_hints entries",
    op: RegisterKvCache,
    field: "payload 5 (layout_hints)",
    max: MAX_LAYOUT_HINTS,
    payload: (n) => register({ hints: Object.fromEntries(Array.from({ length: n }, (_, i) => [`h${i}`, 1])) })
  },
  {
    what: "a layout hint's list",
    op: RegisterKvCache,
    field: "payload 5 (layout_hints)",
    max: MAX_LAYOUT_HINTS,
    payload: (n) => register({ hints: { kv_layout: times(n, 1) } })
  },
  {
    what: "engine_group_infos",
    op: RegisterKvCache,
    field: "payload 6 (engine_group_infos)",
    max: MAX_KV_GROUPS,
    payload: (n) => register({ groups: times(n, { engine_group_id: 0, layer_indices: [], tokens_per_block: 16 }) })
  },
  {
    what: "a group's layer_indices",
    op: RegisterKvCache,
    field: "payload 6 (engine_group_infos)",
    max: MAX_LAYERS,
    payload: (n) => register({ groups: [{ engine_group_id: 0, layer_indices: times(n, 0), tokens_per_block: 16 }] })
  },
  {
    what: "an engine-driven context's block_size",
    op: RegisterKvCacheEngineDrivenContext,
    field: "payload 0 (context)",
    max: MAX_CHUNK_SIZE_TOKENS,
    payload: (n) => [context({ block_size: n })]
  },
  {
    what: "an engine-driven context's num_layers",
    op: RegisterKvCacheEngineDrivenContext,
    field: "payload 0 (context)",
    max: MAX_LAYERS,
    payload: (n) => [context({ num_layers: n })]
  },
  {
    what: "an engine-driven context's hidden_dim_size",
    op: RegisterKvCacheEngineDrivenContext,
    field: "payload 0 (context)",
    max: MAX_HIDDEN_DIM,
    payload: (n) => [context({ hidden_dim_size: n })]
  },
  {
    what: "block_ids groups",
    op: Retrieve,
    field: "payload 2 (block_ids)",
    max: MAX_KV_GROUPS,
    payload: (n) => [key({ worker_id: 0 }), 7, times(n, []), new Uint8Array(0), 0]
  },
  {
    what: "skip_first_n_tokens",
    op: Retrieve,
    field: "payload 4 (skip_first_n_tokens)",
    max: MAX_TOKEN_IDS,
    payload: (n) => [key({ worker_id: 0 }), 7, [[0]], new Uint8Array(0), n]
  },
  { what: "CB RoPE's cos_sin_caches", op: CbRegisterRope, field: "payload 1 (cos_sin_caches)", max: MAX_KV_GROUPS, payload: (n) => rope({ caches: times(n, descriptor()) }) },
  { what: "CB RoPE's head_size", op: CbRegisterRope, field: "payload 2 (head_size)", max: MAX_HIDDEN_DIM, payload: (n) => rope({ head: n }) },
  { what: "CB RoPE's group_to_cache", op: CbRegisterRope, field: "payload 4 (group_to_cache)", max: MAX_KV_GROUPS, payload: (n) => rope({ g2c: times(n, 0) }) },
  { what: "CB RoPE's group_rot", op: CbRegisterRope, field: "payload 5 (group_rot)", max: MAX_KV_GROUPS, payload: (n) => rope({ grot: times(n, null) }) },
  {
    what: "CB matches",
    op: CbRetrievePreComputed,
    field: "payload 1 (matches)",
    max: MAX_CB_MATCHES,
    payload: (n) => [key({ worker_id: 0 }), times(n, match), [[0]], 7, new Uint8Array(0)]
  },
  { what: "PING_REGISTERED's expected", op: PingRegistered, field: "payload 1 (expected)", max: MAX_EXPECTED_KINDS, payload: (n) => [7, times(n, "kv_cache")] }
]

describe("wire limits (issue 24 item 5)", () => {
  for (const b of bounds) {
    it(`${b.what}: ${b.max} decodes, ${b.max + 1} is a bad_request naming ${b.field} and the maximum`, () => {
      assert.deepStrictEqual(decode(b.op, b.payload(b.max)), { ok: true })
      const over = decode(b.op, b.payload(b.max + 1))
      assert.isTrue("error" in over, "over the maximum must fail")
      if (!("error" in over)) return
      assert.include(over.error, `${b.op.name}: ${b.field}: `)
      assert.include(over.error, `at most ${b.max}`)
    })
  }

  it("the attack of issue 24 item 5: REGISTER with world_size 100,000,000 is refused with the rule", () => {
    assert.deepStrictEqual(decode(RegisterKvCache, register({ world: 100_000_000 })), {
      error: "register_kv_cache: payload 3 (world_size): must be at most 1024 (kv ranks, MAX_WORLD_SIZE); actual: 100000000"
    })
  })

  it("a CacheKey's worker_id must be below its world_size", () => {
    assert.deepStrictEqual(decode(Lookup, [key({ world_size: 4, worker_id: 3 }), 4]), { ok: true })
    const over = decode(Lookup, [key({ world_size: 4, worker_id: 4 }), 4])
    assert.isTrue("error" in over && over.error.includes("worker_id (4) must be below world_size (4)"))
  })

  it("token_ids and one group's block ids: the length is refused before any element is looked at", () => {
    // Holes where the elements would be: a check of any element would fail on its type first.
    const tokens = Schema.decodeUnknownExit(TokenIds)(new Array(MAX_TOKEN_IDS + 1))
    assert.isTrue(Exit.isFailure(tokens) && String(tokens.cause).includes(`must have at most ${MAX_TOKEN_IDS} token ids (MAX_TOKEN_IDS), got ${MAX_TOKEN_IDS + 1}`))
    const blocks = Schema.decodeUnknownExit(BlockIdList)(new Array(MAX_BLOCK_IDS + 1))
    assert.isTrue(Exit.isFailure(blocks) && String(blocks.cause).includes(`must have at most ${MAX_BLOCK_IDS} block ids`))
    assert.isTrue(Exit.isSuccess(Schema.decodeUnknownExit(TokenIds)(new Array(MAX_TOKEN_IDS).fill(7))))
  })
})
