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
     * Bytes of the worker's memory the server maps for this registration, and in how many mappings (each
     * segment once); 0 for an engine-driven context, whose engine copies through L1's pool. Their sum over
     * instances is `native.mapped_bytes`.
     */
    mapped_bytes: Schema.optionalKey(Count),
    mappings: Schema.optionalKey(Count),
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
  /** Whether values are authenticated with HMAC-SHA256 (`--l2-secret-file`, issue 24 item 14). */
  authenticated: Schema.Boolean,
  /** Values refused for want of a valid MAC (none, or one that does not verify) and deleted; 0 without a secret. */
  unauthenticated_values: Count,
  breaker_opened: Count,
  breaker_closed: Count
})
export type StatusL2 = typeof StatusL2.Type

/**
 * The send path (issue 24 item 10): the per-peer bound, the ROUTER's SNDHWM, refusals by reason since start
 * (`reply_too_large`: one reply over the bound; `outbox_full`: its peer's outbox would pass it; `not_served`: a
 * request of a stalled peer not served at all; `not_drained`: its
 * peer did not read within the wait), drain probes sent since start, and now: bytes waiting in the outboxes, peers
 * with a reply waiting for their pipe.
 */
export const StatusSendQueue = Schema.Struct({
  max_queued_reply_bytes_per_peer: Count,
  high_water_mark: Count,
  refused: Schema.Struct({ reply_too_large: Count, outbox_full: Count, not_drained: Count, not_served: Count }),
  drain_probes: Count,
  queued_bytes: Count,
  waiting_peers: Count,
  /** Peers with an outbox record now (records of idle peers are dropped every 10 s). */
  peers: Count
})

/**
 * Received messages waiting for the receive fiber (issue 27 item 1: one bounded FIFO per peer, peers served in
 * turn): the bounds per peer, what waits now, and requests shed unhandled since start because their peer was at
 * its bound (answered `overloaded`, or not answered when the peer's replies already back up).
 */
export const StatusInbound = Schema.Struct({
  max_messages_per_peer: Count,
  max_bytes_per_peer: Count,
  /** ZMQ_RCVHWM: messages the ROUTER holds per peer before libzmq stops reading its connection (the sender waits). */
  receive_high_water_mark: Count,
  queued: Count,
  queued_bytes: Count,
  peers: Count,
  shed_requests: Count,
  /**
   * The receive loop's brake on peers whose replies back up (internal/ReceiveBrake.ts): its rate and burst, the
   * messages it charged, the times the loop waited and for how long in all.
   */
  brake: Schema.Struct({
    messages_per_second: Count,
    burst: Count,
    braked_messages: Count,
    pauses: Count,
    paused_ms: Count
  })
})

/**
 * The HTTP frontend's connections (issue 24 item 11): the cap (`--max-http-connections`), the idle timeout, open
 * connections now, and connections closed or refused since start by reason.
 */
export const StatusHttp = Schema.Struct({
  max_connections: Count,
  idle_timeout_seconds: Seconds,
  open_connections: Count,
  closed: Schema.Struct({
    connection_cap: Count,
    evicted_idle: Count,
    no_request: Count,
    slow_request: Count,
    header_too_large: Count,
    bad_request: Count,
    inactive: Count,
    keep_alive_idle: Count
  })
})

/**
 * The descriptor socket (issue 13 item 2; issue 24 items 2, 8, 9, 11): its
 * path (null: off), its caps, the connections and passed descriptors it holds
 * now (`held_descriptors`: every passed descriptor in the server's table —
 * tokens, requests in flight, closes pending; `token_descriptors`: those
 * the pending tokens hold; `closing_descriptors`: queued for the closer
 * thread), and the connections it refused since start, per reason.
 */
export const StatusFdSocket = Schema.Struct({
  path: Schema.NullOr(Schema.String),
  require_sealed: Schema.Boolean,
  token_ttl_seconds: Seconds,
  pending_tokens: Count,
  connections: Count,
  max_connections: Count,
  max_connections_per_uid: Count,
  held_descriptors: Count,
  token_descriptors: Count,
  closing_descriptors: Count,
  max_passed_descriptors: Count,
  max_passed_descriptors_per_peer: Count,
  refusals: Schema.Struct({ uid: Count, connections: Count, connections_per_uid: Count, deadline: Count })
})
export type StatusFdSocket = typeof StatusFdSocket.Type

/** One check of a probe (issue 27 item 3): its name, whether it passes, and why, with figures. */
export const ProbeCheck = Schema.Struct({ name: Schema.String, ok: Schema.Boolean, detail: Schema.String })
export type ProbeCheck = typeof ProbeCheck.Type

/**
 * `GET /readyz`'s body, and the `readiness` block of the status document:
 * "ready" when every check passes (checks `mq_bound`, `l1_pool`, `reaper`,
 * `fd_socket`, `l2`; src/services/server/Readiness.ts), else "not_ready".
 */
export const StatusReadiness = Schema.Struct({
  status: Schema.Literals(["ready", "not_ready"]),
  checks: Schema.Array(ProbeCheck)
})
export type StatusReadiness = typeof StatusReadiness.Type

/** `GET /livez`'s body: "live" when every check passes (`process`, `event_loop`), else "not_live". */
export const LivenessProbe = Schema.Struct({
  status: Schema.Literals(["live", "not_live"]),
  checks: Schema.Array(ProbeCheck)
})
export type LivenessProbe = typeof LivenessProbe.Type

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
  /** Peers refused for their routing id since start (issue 24 item 1): set by the peer, or claiming one ahead of the ROUTER's counter (kicked); peers being verified now. */
  routing_ids: Schema.Struct({ refused_chosen: Count, refused_ahead: Count, verifying: Count }),
  /** ZeroMQ connections open now (the ROUTER's monitor), the cap (`--max-zmq-connections`), connections shut down for it since start (issue 24 item 11). */
  zmq_connections: Schema.optionalKey(Schema.Struct({ open: Count, max: Count, refused: Count })),
  undeliverable_replies: Count,
  /** Replies refused with `overloaded` for the bytes queued to their peer since start (issue 24 item 10). */
  refused_replies: Count,
  send_queue: StatusSendQueue,
  inbound: StatusInbound,
  http: StatusHttp,
  pools: StatusPools,
  ops: Schema.Array(StatusOp),
  /** What `GET /readyz` answers now (issue 27 item 3). */
  readiness: StatusReadiness,
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
  /** Absent from a server without the FdExchange module. */
  fd_socket: Schema.optionalKey(StatusFdSocket),
  l1: Schema.Struct({
    pool: Schema.NullOr(Schema.String),
    capacity_bytes: Count,
    prefaulted_bytes: Count,
    used_bytes: Count,
    objects: Count,
    reserved_objects: Count,
    locked_objects: Count,
    evictions: Count,
    /**
     * With tenancy (CURVE on), each salt group's L1 (issue 27 item 2): the bytes its objects hold, its weight
     * (its tenants' `l1-share`), its share now (capacity × weight over the groups holding L1) and its objects
     * evicted since start. Absent with CURVE off (one LRU).
     */
    tenants: Schema.optionalKey(Schema.Array(Schema.Struct({
      salt_group: Schema.String,
      bytes: Count,
      weight: Schema.Finite,
      share_bytes: Schema.Finite,
      evictions: Count
    })))
  }),
  /**
   * Lookup sessions (pending lookups: request ids whose read locks or
   * unreported count the server keeps), the read locks they hold, the
   * unreported counts, the peers they count against; the bounds on them and
   * releases before their end by reason (issue 24 item 6); LOOKUPs whose
   * locked prefix `--max-lookup-locks` cut short; plus totals since start
   * (issue 17): LOOKUP requests, and chunks looked up and found in L1, per
   * rank; the L1 hit ratio is `hit_chunks / looked_up_chunks`.
   */
  lookup: Schema.Struct({
    sessions: Count,
    held_locks: Count,
    pending_jobs: Count,
    peers: Count,
    max_pending_lookups: Count,
    max_pending_lookups_per_peer: Count,
    max_lookup_locks: Count,
    released: Schema.Struct({
      ttl: Count,
      max_pending_lookups_per_peer: Count,
      max_pending_lookups: Count,
      max_lookup_locks: Count
    }),
    capped_lookups: Count,
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
  l2: Schema.NullOr(StatusL2),
  /**
   * The KV event log (issue 28 item 7, docs/kv-events.md): on/off, its capacity and incarnation, records kept
   * now with their oldest and newest sequence numbers, records appended since start by kind, gap markers,
   * polls answered `lost`, and the chunks L1 announced and still holds.
   */
  kv_events: Schema.Struct({
    enabled: Schema.Boolean,
    capacity: Count,
    incarnation: Count,
    depth: Count,
    oldest_seq: Count,
    newest_seq: Count,
    records: Schema.Struct({ stored: Count, removed: Count }),
    dropped: Count,
    lost_answers: Count,
    held_chunks: Count,
    /** vLLM's channel (KvEventPublisher.ts); null without `--kv-events-endpoint`. */
    publisher: Schema.NullOr(Schema.Struct({
      endpoint: Schema.String,
      replay_endpoint: Schema.NullOr(Schema.String),
      topic: Schema.String,
      subscribers: Count,
      batches_published: Count,
      next_seq: Count,
      replay_buffer: Schema.Struct({ batches: Count, bytes: Count, oldest_seq: Schema.NullOr(Count) }),
      replays_served: Count,
      replay_batches_sent: Count,
      replays_cut: Count,
      malformed_replays: Count,
      log_overflows: Count
    }))
  })
})
export type StatusDocument = typeof StatusDocument.Type

/**
 * Decodes a fetched document. Fails with `Schema.SchemaError` naming the
 * path of the first field that does not fit (a server of another version,
 * or not an mpcache server).
 */
export const decodeStatusDocument = Schema.decodeUnknownEffect(StatusDocument)
