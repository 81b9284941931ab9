/**
 * The merged handler table of the real server assembly against DESIGN §3.1:
 * every op's id, name and pool, and the module that serves it.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { OPS } from "../../src/schema/Op.ts"
import { MqServer } from "../../src/services/server/MqServer.ts"
import { CURVE_MODES } from "../support/CurveMode.ts"
import { testServer } from "../support/TestServer.ts"

/** DESIGN §3.1: id, op, pool. */
const DESIGN_TABLE: ReadonlyArray<readonly [number, string, string]> = [
  [1, "register_kv_cache", "SYNC"],
  [2, "unregister_kv_cache", "SYNC"],
  [6, "store", "AFFINITY"],
  [7, "retrieve", "AFFINITY"],
  [8, "lookup", "NORMAL"],
  [9, "query_prefetch_status", "NORMAL"],
  [12, "free_lookup_locks", "NORMAL"],
  [13, "end_session", "NORMAL"],
  [14, "register_kv_cache_engine_driven_context", "SYNC"],
  [15, "unregister_kv_cache_engine_driven_context", "SYNC"],
  [16, "prepare_store", "AFFINITY"],
  [17, "commit_store", "AFFINITY"],
  [18, "prepare_retrieve", "AFFINITY"],
  [19, "commit_retrieve", "AFFINITY"],
  [20, "clear", "NORMAL"],
  [21, "get_chunk_size", "SYNC"],
  [22, "ping", "NORMAL"],
  [24, "noop", "SYNC"],
  [25, "cb_register_rope", "SYNC"],
  [26, "cb_unregister_rope", "SYNC"],
  [27, "cb_retrieve_pre_computed", "AFFINITY"],
  [34, "poll_kv_events", "SYNC"],
  [64, "ping_registered", "NORMAL"],
  [65, "hello_challenge", "NORMAL"],
  [66, "hello", "NORMAL"],
  [67, "get_server_info", "NORMAL"]
]

describe.each(CURVE_MODES)("op table (CURVE $curve)", ({ curve }) => {
  it("src/schema/Op.ts defines exactly the ops of DESIGN §3.1, with their frozen ids", () => {
    assert.deepStrictEqual(OPS.map((o) => [o.id, o.name]), DESIGN_TABLE.map(([id, name]) => [id, name]))
  })

  it.live("every op the server serves runs on the pool DESIGN §3.1 gives it", () =>
    Effect.gen(function*() {
      const server = yield* MqServer
      const expected = new Map(DESIGN_TABLE.map(([id, name, pool]) => [id, [name, pool]]))
      for (const row of server.table) assert.deepStrictEqual([row.name, row.pool], expected.get(row.id), `op ${row.id}`)
      console.log(server.table.map((r) => `${String(r.id).padStart(3)} ${r.name.padEnd(42)} ${r.pool.padEnd(9)} ${r.module}`).join("\n"))
      assert.deepStrictEqual(server.table.map((r) => r.id), DESIGN_TABLE.map(([id]) => id), "every op is served")
    }).pipe(Effect.provide(testServer({ curve }))))
})
