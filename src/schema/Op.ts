/**
 * The op table of DESIGN §3.1: every op's id (upstream's frozen numbering,
 * written out as literals; 64+ are mpcache's own), its wire name, its named
 * payload frames and its response. This is the only place the wire shape of
 * an op is written down; the server's handler rows and every client use it.
 *
 * Each payload frame is its own MessagePack value decoded with the Schema of
 * its position; `response: undefined` means the reply has no response frame
 * (`[uid, op]`).
 *
 * What the server's guards need to know of an op is declared here too
 * (issue 25 item 3): `registers` / `unregisters` (the registration kind an
 * op creates or drops) and `maps` (the payload field of the worker memory
 * it maps); OpMeta.ts derives the payload positions of the instance id, the
 * cache keys and the request ids from the field names, once.
 */
import { Schema } from "effect"
import { WireString } from "./Text.ts"
import { CacheKey, ModelName, RequestId, WorldSize } from "./CacheKey.ts"
import { CbMatch } from "./CbMatch.ts"
import {
  EngineDrivenPool,
  PrepareRetrieveResponse,
  PrepareStoreResponse,
  RegisterEngineDrivenContext
} from "./EngineDriven.ts"
import { InstanceIdWire } from "./InstanceId.ts"
import { Uint } from "./Integer.ts"
import { BlockIdList } from "./IntArrays.ts"
import {
  atMost,
  atMostLength,
  MAX_CB_MATCHES,
  MAX_ENGINE_TYPE_LENGTH,
  MAX_EXPECTED_KINDS,
  MAX_HIDDEN_DIM,
  MAX_KV_GROUPS,
  MAX_LAYERS,
  MAX_TOKEN_IDS,
  MAX_WORLD_SIZE
} from "./Limits.ts"
import { EngineGroupInfo, GroupRot, LayoutHints, RegistrationKind } from "./Registration.ts"
import { TensorDescriptor } from "./TensorDescriptor.ts"

/** A Schema usable on the wire: no services needed to decode or encode. */
export type WireSchema = Schema.Codec<unknown, unknown>

/** One payload frame: its field name (for error messages) and its Schema. */
export type PayloadField = readonly [name: string, schema: WireSchema]

/** One row of the op table. */
export interface Op<
  Name extends string = string,
  P extends ReadonlyArray<PayloadField> = ReadonlyArray<PayloadField>,
  R extends WireSchema | undefined = WireSchema | undefined
> {
  /** The int in the op frame. */
  readonly id: number
  /** snake_case name, as upstream's frozen table names it. */
  readonly name: Name
  /** Payload frames in order. */
  readonly payload: P
  /** Response Schema, or undefined when the op returns nothing. */
  readonly response: R
  /** The registration kind this op creates (a REGISTER: rate- and count-limited, it claims the instance). */
  readonly registers?: RegistrationKind
  /** The registration kind this op drops (an UNREGISTER). */
  readonly unregisters?: RegistrationKind
  /** The payload field whose descriptors a REGISTER maps (counted against the tenant's mapped bytes). */
  readonly maps?: P[number][0]
}

/** Decoded values of a list of payload fields (a tuple stays a tuple). */
export type PayloadTypes<P extends ReadonlyArray<PayloadField>> = {
  readonly [K in keyof P]: P[K] extends readonly [string, infer S extends WireSchema] ? S["Type"] : never
}

/** Decoded payload tuple of an op. */
export type PayloadOf<O extends Op> = O extends Op<string, infer P, WireSchema | undefined> ? PayloadTypes<P> : never

/** Decoded response of an op (`void` when it has none). */
export type ResponseOf<O extends Op> = O["response"] extends WireSchema ? O["response"]["Type"] : void

const op = <const Name extends string, const P extends ReadonlyArray<PayloadField>, R extends WireSchema | undefined>(
  row: Op<Name, P, R>
): Op<Name, P, R> => row

/** `block_ids`: one list per KV group (issue 24 item 5: at most `MAX_KV_GROUPS` lists of `MAX_BLOCK_IDS`). */
const BlockIds = Schema.Array(BlockIdList).check(atMostLength(MAX_KV_GROUPS, "KV groups (MAX_KV_GROUPS)"))
/** One descriptor per layer: at most `MAX_LAYERS`. */
const KvCaches = Schema.Array(TensorDescriptor).check(atMostLength(MAX_LAYERS, "descriptors, one per layer (MAX_LAYERS)"))
/** `tp_size` of LOOKUP / FREE_LOOKUP_LOCKS (upstream passes it; the server uses the key's world size): 0 … `MAX_WORLD_SIZE`. */
const TpSize = Uint.check(atMost(MAX_WORLD_SIZE, "kv ranks, MAX_WORLD_SIZE"))
/** `[event_handle, ok]` answer of STORE / RETRIEVE / CB_RETRIEVE_PRE_COMPUTED. */
export const TransferResult = Schema.Tuple([Schema.Uint8Array, Schema.Boolean])

export const RegisterKvCache = op({
  id: 1,
  name: "register_kv_cache",
  payload: [
    ["instance_id", InstanceIdWire],
    ["kv_caches", KvCaches],
    ["model_name", ModelName],
    ["world_size", WorldSize],
    ["engine_type", WireString.check(atMostLength(MAX_ENGINE_TYPE_LENGTH, "characters (MAX_ENGINE_TYPE_LENGTH)"))],
    ["layout_hints", LayoutHints],
    ["engine_group_infos", Schema.Array(EngineGroupInfo).check(atMostLength(MAX_KV_GROUPS, "KV groups (MAX_KV_GROUPS)"))]
  ],
  response: undefined,
  registers: "kv_cache",
  maps: "kv_caches"
})

export const UnregisterKvCache = op({
  id: 2,
  name: "unregister_kv_cache",
  payload: [["instance_id", InstanceIdWire]],
  response: undefined,
  unregisters: "kv_cache"
})

export const Store = op({
  id: 6,
  name: "store",
  payload: [
    ["key", CacheKey],
    ["instance_id", InstanceIdWire],
    ["block_ids", BlockIds],
    ["event_handle", Schema.Uint8Array]
  ],
  response: TransferResult
})

export const Retrieve = op({
  id: 7,
  name: "retrieve",
  payload: [
    ["key", CacheKey],
    ["instance_id", InstanceIdWire],
    ["block_ids", BlockIds],
    ["event_handle", Schema.Uint8Array],
    ["skip_first_n_tokens", Uint.check(atMost(MAX_TOKEN_IDS, "tokens, MAX_TOKEN_IDS"))]
  ],
  response: TransferResult
})

export const Lookup = op({
  id: 8,
  name: "lookup",
  payload: [["key", CacheKey], ["tp_size", TpSize]],
  response: undefined
})

export const QueryPrefetchStatus = op({
  id: 9,
  name: "query_prefetch_status",
  payload: [["request_id", RequestId]],
  response: Schema.NullOr(Uint)
})

export const FreeLookupLocks = op({
  id: 12,
  name: "free_lookup_locks",
  payload: [["key", CacheKey], ["tp_size", TpSize]],
  response: undefined
})

export const EndSession = op({
  id: 13,
  name: "end_session",
  payload: [["request_id", RequestId]],
  response: undefined
})

export const RegisterKvCacheEngineDrivenContext = op({
  id: 14,
  name: "register_kv_cache_engine_driven_context",
  payload: [["context", RegisterEngineDrivenContext]],
  response: EngineDrivenPool,
  registers: "engine_driven"
})

export const UnregisterKvCacheEngineDrivenContext = op({
  id: 15,
  name: "unregister_kv_cache_engine_driven_context",
  payload: [["instance_id", InstanceIdWire]],
  response: undefined,
  unregisters: "engine_driven"
})

export const PrepareStore = op({
  id: 16,
  name: "prepare_store",
  payload: [["key", CacheKey], ["instance_id", InstanceIdWire]],
  response: PrepareStoreResponse
})

/**
 * COMMIT_STORE publishes a PREPARE_STORE: empty `cpu_data` when the worker
 * copied into the pool's slots (shm), else the reserved chunks' bytes
 * concatenated (inline). **Abort** (issue 18): the protocol has no
 * ABORT_STORE (upstream added one later, outside the frozen numbering), so a
 * worker that gives up after PREPARE_STORE sends COMMIT_STORE with a
 * `cpu_data` that is not empty but shorter than one chunk object — one zero
 * byte — which can carry no chunk: the server drops the reservations,
 * publishes nothing and answers false, as for any `cpu_data` of the wrong
 * length. (A layout whose chunk object is a single byte has no such length;
 * its worker sends slots + 1 bytes, a wrong length all the same.)
 */
export const CommitStore = op({
  id: 17,
  name: "commit_store",
  payload: [["key", CacheKey], ["instance_id", InstanceIdWire], ["cpu_data", Schema.Uint8Array]],
  response: Schema.Boolean
})

export const PrepareRetrieve = op({
  id: 18,
  name: "prepare_retrieve",
  payload: [["key", CacheKey], ["instance_id", InstanceIdWire]],
  response: PrepareRetrieveResponse
})

export const CommitRetrieve = op({
  id: 19,
  name: "commit_retrieve",
  payload: [["key", CacheKey], ["instance_id", InstanceIdWire]],
  response: Schema.Boolean
})

export const Clear = op({
  id: 20,
  name: "clear",
  payload: [["force", Schema.Boolean]],
  response: undefined
})

export const GetChunkSize = op({
  id: 21,
  name: "get_chunk_size",
  payload: [],
  response: Uint
})

export const Ping = op({
  id: 22,
  name: "ping",
  payload: [["instance_id", Schema.NullOr(InstanceIdWire)]],
  response: Schema.Literal(true)
})

export const Noop = op({
  id: 24,
  name: "noop",
  payload: [],
  response: Schema.Literal("OK")
})

export const CbRegisterRope = op({
  id: 25,
  name: "cb_register_rope",
  payload: [
    ["instance_id", InstanceIdWire],
    ["cos_sin_caches", Schema.Array(TensorDescriptor).check(atMostLength(MAX_KV_GROUPS, "tables, one per KV group at most (MAX_KV_GROUPS)"))],
    ["head_size", Uint.check(atMost(MAX_HIDDEN_DIM, "elements, MAX_HIDDEN_DIM"))],
    ["is_neox_style", Schema.Boolean],
    ["group_to_cache", Schema.Array(Uint).check(atMostLength(MAX_KV_GROUPS, "KV groups (MAX_KV_GROUPS)"))],
    ["group_rot", Schema.Array(GroupRot).check(atMostLength(MAX_KV_GROUPS, "KV groups (MAX_KV_GROUPS)"))]
  ],
  response: undefined,
  registers: "cb_rope",
  maps: "cos_sin_caches"
})

export const CbUnregisterRope = op({
  id: 26,
  name: "cb_unregister_rope",
  payload: [["instance_id", InstanceIdWire]],
  response: undefined,
  unregisters: "cb_rope"
})

export const CbRetrievePreComputed = op({
  id: 27,
  name: "cb_retrieve_pre_computed",
  payload: [
    ["key", CacheKey],
    ["matches", Schema.Array(CbMatch).check(atMostLength(MAX_CB_MATCHES, "matches (MAX_CB_MATCHES)"))],
    ["block_ids", BlockIds],
    ["instance_id", InstanceIdWire],
    ["event_handle", Schema.Uint8Array]
  ],
  response: TransferResult
})

/** The most records one POLL_KV_EVENTS answers (its `max_events` is capped here: one reply stays small). */
export const MAX_KV_EVENTS_PER_POLL = 4096

/**
 * One record of the KV event log (issue 28; docs/kv-events.md), as upstream's `KVEventRecord`: `kind`
 * "stored" (one chunk: `block_hashes` holds its hash, `token_ids` its tokens, `parent_block_hash` the
 * previous chunk's or nil) or "removed" (`block_hashes` every chunk that left; no tokens, no parent),
 * `medium` "CPU" (L1) or "STORAGE" (L2). mpcache adds `salt_group` ("" without tenancy).
 */
export const KvEventRecordWire = Schema.Struct({
  seq: Uint,
  kind: Schema.Literals(["stored", "removed"]),
  medium: Schema.Literals(["CPU", "STORAGE"]),
  model_name: WireString,
  block_hashes: Schema.Array(Schema.Uint8Array),
  parent_block_hash: Schema.NullOr(Schema.Uint8Array),
  token_ids: Schema.Array(Uint),
  salt_group: WireString
})

/**
 * POLL_KV_EVENTS's answer, as upstream's `KVEventPollResult`: `enabled` (false: `--kv-event-log-size 0`,
 * nothing else means anything), `incarnation` (drawn at server start: a change is a restart), `next_cursor`
 * (the cursor of the next poll), `lost` (the consumer must drop what it knows of this server, then apply
 * `events`) and `events`.
 */
export const KvEventPollResult = Schema.Struct({
  enabled: Schema.Boolean,
  incarnation: Uint,
  next_cursor: Uint,
  lost: Schema.Boolean,
  events: Schema.Array(KvEventRecordWire)
})

/**
 * POLL_KV_EVENTS (upstream's id 34): the records after `cursor` (the last sequence number the consumer
 * applied, 0 on first contact) of `model_name`, at most `max_events` (1 … MAX_KV_EVENTS_PER_POLL). Under
 * tenancy a tenant reads its own salt group's records only; an admin reads all.
 */
export const PollKvEvents = op({
  id: 34,
  name: "poll_kv_events",
  payload: [
    ["model_name", ModelName],
    ["cursor", Uint],
    ["max_events", Uint.check(Schema.isGreaterThanOrEqualTo(1), atMost(MAX_KV_EVENTS_PER_POLL, "records, MAX_KV_EVENTS_PER_POLL"))]
  ],
  response: KvEventPollResult
})

export const PingRegistered = op({
  id: 64,
  name: "ping_registered",
  payload: [
    ["instance_id", InstanceIdWire],
    ["expected", Schema.Array(RegistrationKind).check(atMostLength(MAX_EXPECTED_KINDS, "kinds (MAX_EXPECTED_KINDS)"))]
  ],
  response: Schema.Array(RegistrationKind)
})

/**
 * HELLO_CHALLENGE (mpcache's own, docs/security.md): the first half of
 * binding a CURVE connection to a tenant. Answers 32 fresh random bytes, the
 * nonce this connection's next HELLO must prove over (one outstanding per
 * connection; a HELLO consumes it, whatever its outcome).
 */
export const HelloChallenge = op({
  id: 65,
  name: "hello_challenge",
  payload: [],
  response: Schema.Uint8Array
})

/** What a successful HELLO bound the connection to. */
export const HelloGrant = Schema.Struct({ tenant: WireString, salt_group: WireString, admin: Schema.Boolean })

/**
 * HELLO (mpcache's own, docs/security.md): `public_key` (Z85, listed in the
 * authorized-keys file) and `proof` = HMAC-SHA256(X25519(client secret,
 * server public), "mpcache hello v1\0" ‖ nonce). Binds the connection to the
 * key's tenant; `forbidden` when the key is not listed, the proof is wrong
 * or no challenge is outstanding.
 */
export const Hello = op({
  id: 66,
  name: "hello",
  payload: [["public_key", WireString], ["proof", Schema.Uint8Array]],
  response: HelloGrant
})

/**
 * GET_SERVER_INFO's answer (issue 13 item 2, docs/memfd.md): `fd_socket` is
 * where to pass memfd descriptors ("@name": the abstract namespace; "" when
 * this server takes none), `fd_nonce` the 16 bytes a descriptor request
 * names to tie its token to this connection (the same for the connection's
 * life), `protocol_version` the wire version, `features` what is on
 * ("cpu_memfd", "require_sealed_memfd", "named_segments", "curve", "tenants", "kv_events": POLL_KV_EVENTS
 * answers records).
 */
export const ServerInfo = Schema.Struct({
  fd_socket: WireString,
  fd_nonce: Schema.Uint8Array,
  protocol_version: Uint,
  features: Schema.Array(WireString)
})

/** GET_SERVER_INFO (mpcache's own): what a client needs before it registers memfd memory. */
export const GetServerInfo = op({
  id: 67,
  name: "get_server_info",
  payload: [],
  response: ServerInfo
})

/** Every op of DESIGN §3.1, in id order. */
export const OPS: ReadonlyArray<Op> = [
  RegisterKvCache,
  UnregisterKvCache,
  Store,
  Retrieve,
  Lookup,
  QueryPrefetchStatus,
  FreeLookupLocks,
  EndSession,
  RegisterKvCacheEngineDrivenContext,
  UnregisterKvCacheEngineDrivenContext,
  PrepareStore,
  CommitStore,
  PrepareRetrieve,
  CommitRetrieve,
  Clear,
  GetChunkSize,
  Ping,
  Noop,
  CbRegisterRope,
  CbUnregisterRope,
  CbRetrievePreComputed,
  PollKvEvents,
  PingRegistered,
  HelloChallenge,
  Hello,
  GetServerInfo
]

/** Op by its id; undefined for an id this protocol version does not define. */
export const opById: ReadonlyMap<number, Op> = new Map(OPS.map((o) => [o.id, o]))
