/**
 * Handler rows: how a server module declares the ops it serves (STYLE §3,
 * upstream `HandlerSpec(request_type, handler, pool)`). The wire shape of an
 * op lives in `src/schema/Op.ts`; the pool and the handler live in the
 * module's rows; the server assembly joins every module's rows into one
 * table and refuses a duplicate op.
 */
import { Effect, Schema } from "effect"
import type { InstanceId } from "../../schema/InstanceId.ts"
import type { Op, PayloadOf, ResponseOf } from "../../schema/Op.ts"
import type { WireError } from "../../schema/WireError.ts"
import type { InstanceOwner } from "../liveness/InstanceOwner.ts"
import type { LivenessTarget } from "../liveness/LivenessTarget.ts"

/**
 * Where a handler runs (DESIGN §3.1):
 * - `SYNC`: one lane, one at a time, in arrival order;
 * - `NORMAL`: a FIFO pool of `--max-cpu-workers` concurrent handlers;
 * - `AFFINITY`: `--max-gpu-workers` lanes, each peer pinned to one lane.
 */
export type Pool = "SYNC" | "NORMAL" | "AFFINITY"

/** What a handler knows about the request besides its payload. */
export interface RequestContext {
  /** The ROUTER routing id of the sending peer (a DEALER socket). */
  readonly routingId: Uint8Array
  /** The routing id as hex, for logs and maps. */
  readonly peer: string
  /**
   * Set by a handler whose success must not bind the peer to the instance it
   * names (a stranger's PING under tenancy: it answers true but is no sign
   * of the instance's life). False unless a handler sets it.
   */
  skipBinding: boolean
  /**
   * The owner a REGISTER's new entry is inserted with (issue 25 item 1): the
   * tenant guard sets it on the context it passes to a register op's row
   * (the tenant, and the bytes this op maps); absent without tenancy. A
   * module passes it to its core's `register` as `RegisterRequest.owner`.
   */
  readonly owner?: InstanceOwner
}

/**
 * The synchronous answer of a handler (issue 16's fast path for PING, NOOP,
 * GET_CHUNK_SIZE; issue 25 item 4 for a named PING): reads the received
 * message `[routing id, uid, op, payload…]` in place, its payload at
 * `message[start …]`, and returns the encoded response frame, or undefined
 * when this request needs the pooled path (`handle`). For the requests it
 * answers it must do exactly what `handle` and the MQ server after it do
 * (a request naming an instance binds its peer: it answers only where
 * `isBound` says there is nothing to bind), with no Effect, no await and no
 * allocation it can avoid. The MQ server runs it on its receive loop when
 * the row's pool has a free slot and nothing is waiting, or as the pooled
 * job itself otherwise (DESIGN §3.1), and never under tenancy (its guarded
 * rows carry no `fast`).
 */
export type FastHandler = (message: ReadonlyArray<Uint8Array>, start: number, isBound: PeerBound) => Uint8Array | undefined

/**
 * Whether the peer with routing id `routingId` needs no binding to instance
 * `id` (bound already, or not connected): the MQ server's `PeerEvents.isBound`.
 */
export type PeerBound = (routingId: Uint8Array, id: InstanceId) => boolean

/** A handler with its types erased, as the dispatcher stores it. */
export interface HandlerRow {
  readonly op: Op
  readonly pool: Pool
  readonly handle: (payload: ReadonlyArray<unknown>, ctx: RequestContext) => Effect.Effect<unknown, WireError>
  /** The fast path's answer, for the few ops answered synchronously; absent: always pooled. */
  readonly fast?: FastHandler
  /**
   * A check of the peer alone, run before the payload is decoded: the error
   * that refuses this request, or undefined to go on. Tenancy's guard sets it
   * (a connection that has not said HELLO is `forbidden`), so an unbound peer
   * never makes the server decode anything (issue 24 item 3). Absent: admitted.
   */
  readonly admit?: (ctx: RequestContext) => WireError | undefined
}

/**
 * Declares that `op` is served by `handle` on `pool`. The handler's argument
 * and result types come from the op's Schemas; it fails only with wire
 * errors (a defect becomes an `internal` error reply). `fast`: the
 * synchronous answer of a pure handler (see {@link FastHandler}).
 */
export const row = <O extends Op>(
  op: O,
  pool: Pool,
  handle: (payload: PayloadOf<O>, ctx: RequestContext) => Effect.Effect<ResponseOf<O>, WireError>,
  fast?: FastHandler
): HandlerRow => ({
  op,
  pool,
  handle: handle as unknown as HandlerRow["handle"],
  ...(fast === undefined ? {} : { fast })
})

/**
 * A server module's record: everything the server assembly joins from it, in
 * one place (STYLE §5; upstream `get_handlers()` plus the liveness target
 * a module registers with the management module).
 */
export interface ServerModule {
  /** Module name, for the merged table and logs. */
  readonly name: string
  /** Its ops, joined into the merged handler table. */
  readonly rows: ReadonlyArray<HandlerRow>
  /** Its per-instance state as a liveness target (DESIGN §5), when it holds any; PING and the reaper drive it. */
  readonly target?: LivenessTarget
  /** Its blocks of `/api/status` (top-level keys merged into the document), when it has any. */
  readonly status?: () => Effect.Effect<Record<string, unknown>>
}

/** Two modules claimed the same op. */
export class DuplicateOp extends Schema.TaggedError<DuplicateOp>()("DuplicateOp", {
  opName: Schema.String,
  modules: Schema.Tuple([Schema.String, Schema.String])
}) {
  override get message(): string {
    return `op ${this.opName} is claimed by both ${this.modules[0]} and ${this.modules[1]}`
  }
}

/** One row of the merged table, as printed by tests and `mpcache status`. */
export interface TableRow {
  readonly id: number
  readonly name: string
  readonly pool: Pool
  readonly module: string
}

/** The merged handler table: op id → row, plus the module that owns it. */
export interface HandlerTable {
  readonly byId: ReadonlyMap<number, HandlerRow>
  readonly rows: ReadonlyArray<TableRow>
}

/**
 * Joins modules' rows into one table. Fails (as a defect at start-up: a
 * programming error) with `DuplicateOp` when two rows name the same op.
 */
export const makeTable = (modules: ReadonlyArray<ServerModule>): Effect.Effect<HandlerTable> =>
  Effect.sync(() => {
    const byId = new Map<number, HandlerRow>()
    const owner = new Map<number, string>()
    for (const m of modules) {
      for (const r of m.rows) {
        const prev = owner.get(r.op.id)
        if (prev !== undefined) throw new DuplicateOp({ opName: r.op.name, modules: [prev, m.name] })
        byId.set(r.op.id, r)
        owner.set(r.op.id, m.name)
      }
    }
    const rows = [...byId.values()]
      .sort((a, b) => a.op.id - b.op.id)
      .map((r) => ({ id: r.op.id, name: r.op.name, pool: r.pool, module: owner.get(r.op.id)! }))
    return { byId, rows }
  })
