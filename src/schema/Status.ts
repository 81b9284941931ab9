/**
 * The `GET /api/status` document (DESIGN §5 "Status", §7 HTTP) as a Schema,
 * so that clients — the `mpcache status` command, replay, tests, other
 * programs through `mpcache/schema` — decode it instead of casting. JSON
 * keys are snake_case like the wire's structs; every figure is a count, a
 * byte size (`…_bytes`) or seconds (`…_seconds`). Keys a newer server adds
 * are ignored on decode.
 */
import { Schema } from "effect"
import { RegistrationKind } from "./Registration.ts"

const Count = Schema.Int
const Seconds = Schema.Finite

/** Queue depths of the dispatch pools (DESIGN §3.1). */
export const StatusPools = Schema.Struct({
  sync: Schema.Struct({ queued: Count }),
  normal: Schema.Struct({ workers: Count, queued: Count }),
  affinity: Schema.Struct({ lanes: Count, queued: Schema.Array(Count), pinnedPeers: Count })
})

/** One row of the merged handler table: op id and name, its pool, the module serving it. */
export const StatusOp = Schema.Struct({
  id: Count,
  name: Schema.String,
  pool: Schema.Literals(["SYNC", "NORMAL", "AFFINITY"]),
  module: Schema.String
})

/** The liveness windows and how many contexts are tracked (DESIGN §5). */
export const StatusWorkerLiveness = Schema.Struct({
  enabled: Schema.Boolean,
  reap_timeout_seconds: Seconds,
  registration_grace_seconds: Seconds,
  disconnect_grace_seconds: Seconds,
  tracked_instances: Count
})

/** A context's liveness state: startup (not both flags latched), active (both), suspect (no bound connection left). */
export const InstanceState = Schema.Literals(["startup", "active", "suspect"])
export type InstanceState = typeof InstanceState.Type

/** One registered context; the module's own details (model, layout …) follow as further keys. */
export const StatusInstance = Schema.StructWithRest(
  Schema.Struct({
    instance_id: Schema.String,
    kind: RegistrationKind,
    state: InstanceState,
    last_seen_age_seconds: Seconds,
    has_liveness_signal: Schema.Boolean,
    has_transfer_activity: Schema.Boolean,
    /** The tenant that registered it (CURVE on, docs/security.md); null with CURVE off. */
    tenant: Schema.optionalKey(Schema.NullOr(Schema.String)),
    /**
     * A cpu_memfd registration (issue 13 item 2, docs/memfd.md): the sender's
     * SO_PEERCRED and each passed memfd's segment key, bytes and seals
     * ("seal", "shrink", "grow", "write", "future_write").
     */
    memfd: Schema.optionalKey(Schema.Struct({
      pid: Schema.Number,
      uid: Schema.Number,
      gid: Schema.Number,
      segments: Schema.Array(Schema.Struct({ segment: Schema.String, bytes: Schema.Number, seals: Schema.Array(Schema.String) }))
    }))
  }),
  [Schema.Record(Schema.String, Schema.Unknown)]
)
export type StatusInstance = typeof StatusInstance.Type

/**
 * One of the last reaps (issue 17), oldest first in `recent_reaps`; the
 * server keeps at most 50. `reaped_at_ms` is the reaper's judging time in
 * Unix epoch milliseconds; `module` the liveness target that held it.
 */
export const StatusReap = Schema.Struct({
  instance_id: Schema.String,
  reason: Schema.Literals(["timeout", "grace", "disconnect"]),
  reaped_at_ms: Schema.Finite,
  silent_seconds: Seconds,
  window_seconds: Seconds,
  module: Schema.String
})
export type StatusReap = typeof StatusReap.Type

/** The L2 tier (issue 15 item 7); the document's `l2` is null when `--l2-url` is not given. */
export const StatusL2 = Schema.Struct({
  /** `--l2-url` without its password. */
  url: Schema.String,
  state: Schema.Literals(["ok", "open", "probing"]),
  /** Whether the client is connected now. */
  connected: Schema.Boolean,
  inflight_bytes: Count,
  /** L2 writes in flight. */
  queue_depth: Count,
  last_error: Schema.NullOr(Schema.String),
  writes: Count,
  dropped_writes: Count,
  failed_writes: Count,
  /** Chunks LOOKUP found in L2 past the L1 prefix, per rank. */
  hit_chunks: Count,
  corrupt_values: Count,
  breaker_opened: Count,
  breaker_closed: Count
})
export type StatusL2 = typeof StatusL2.Type

/** The whole document. */
export const StatusDocument = Schema.Struct({
  is_healthy: Schema.Boolean,
  version: Schema.String,
  protocol_version: Count,
  endpoint: Schema.String,
  chunk_size: Count,
  l1_size_gb: Schema.Finite,
  uptime_seconds: Seconds,
  connected_peers: Count,
  dropped_messages: Count,
  undeliverable_replies: Count,
  pools: StatusPools,
  ops: Schema.Array(StatusOp),
  worker_liveness: StatusWorkerLiveness,
  instances: Schema.Array(StatusInstance),
  /** The last reaps, oldest first, at most 50 (issue 17). */
  recent_reaps: Schema.Array(StatusReap),
  /** Mappings of workers' memory (the server's own L1 pool is under `l1`). */
  native: Schema.Struct({ open_mappings: Count, mapped_bytes: Count }),
  /**
   * The bounds on worker-memory mappings and what is held against them (issue 24 items 4 and 12):
   * the kernel's vm.max_map_count as read at start (`fallback`: unreadable, 65530 assumed), the
   * process's memory maps now (/proc/self/maps lines; null when unreadable), `--max-mappings` and
   * the mappings of worker memory held, `--max-segments-per-register`, `--max-mapped-bytes` and the
   * host bytes held (device bytes: cuda_ipc, not bounded by it), and the registrations refused
   * `overloaded` by each flag since start.
   */
  mapping_limits: Schema.Struct({
    kernel_max_map_count: Count,
    kernel_max_map_count_source: Schema.Literals(["kernel", "fallback"]),
    process_maps: Schema.NullOr(Count),
    max_mappings: Count,
    mappings: Count,
    max_segments_per_register: Count,
    max_mapped_bytes: Count,
    host_mapped_bytes: Count,
    device_mapped_bytes: Count,
    refused: Schema.Struct({ max_segments_per_register: Count, max_mappings: Count, max_mapped_bytes: Count })
  }),
  /**
   * Faults of worker memory since start (issue 13): copies ended by a guarded SIGBUS/SIGSEGV (item 1;
   * = Σ mpcache_guarded_faults_total{kind="segment_shrank"}) and CUDA opens or copies that failed (item 4;
   * = Σ of kinds cuda_handle_refused and cuda_error).
   */
  fault_guard: Schema.Struct({ guarded_faults: Count, cuda_faults: Count }),
  l1: Schema.Struct({
    pool: Schema.NullOr(Schema.String),
    capacity_bytes: Count,
    prefaulted_bytes: Count,
    used_bytes: Count,
    objects: Count,
    reserved_objects: Count,
    locked_objects: Count,
    evictions: Count
  }),
  /**
   * Lookup sessions, plus totals since start (issue 17): LOOKUP requests, and
   * chunks looked up and found in L1, per rank; the L1 hit ratio is
   * `hit_chunks / looked_up_chunks`.
   */
  lookup: Schema.Struct({
    sessions: Count,
    held_locks: Count,
    pending_jobs: Count,
    lookups: Count,
    looked_up_chunks: Count,
    hit_chunks: Count
  }),
  engine_driven: Schema.Struct({
    transport: Schema.Literals(["shm", "inline"]),
    pool: Schema.NullOr(Schema.String),
    contexts: Count,
    pending_stores: Count,
    pending_retrieves: Count
  }),
  blend: Schema.Struct({ rope_instances: Schema.Array(Schema.String) }),
  l2: Schema.NullOr(StatusL2)
})
export type StatusDocument = typeof StatusDocument.Type

/**
 * Decodes a fetched document. Fails with `Schema.SchemaError` naming the
 * path of the first field that does not fit (a server of another version,
 * or not an mpcache server).
 */
export const decodeStatusDocument = Schema.decodeUnknownEffect(StatusDocument)
