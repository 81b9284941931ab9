/**
 * `mpcache/client`: what an inference worker, a scheduler or a probe needs
 * to talk to an mpcache server (DESIGN §6, §7) — the MQ client, the worker,
 * engine-driven and scheduler adapters with their heartbeat, the paged KV
 * cache helpers (memfd, shared memory and CUDA) and the memfd hand-over
 * (docs/memfd.md), the `ZmqSockets` service they run
 * on and `ClientLive`, which provides it together with the native memory
 * backend. Wire types (CacheKey, TensorDescriptor, Op …) come from
 * `mpcache/schema`.
 *
 * This entry sits at the top of `src`, beside `cli`, because it spans rooms
 * (services/client, services/kv, services/zmq, native, layers) and so
 * belongs to none of them: entry → layers → services → schema, native, the
 * one-way arrows of DESIGN §2. It must never load a module under
 * `src/services/server` or `src/services/liveness`
 * (test/e2e/package.test.ts walks the emitted import graph to hold that).
 *
 * Programs run the client effects themselves, e.g.
 * `Effect.runPromise(program.pipe(Effect.scoped, Effect.provide(ClientLive)))`;
 * see examples/.
 */

// client services
export * from "./services/client/CudaPagedKvCache.ts"
export * from "./services/client/EngineDrivenWorkerAdapter.ts"
export * from "./services/client/Heartbeat.ts"
export * from "./services/client/InstanceIdGen.ts"
export * from "./services/client/KvEventSubscriber.ts"
export * from "./services/client/MemfdHandOver.ts"
export * from "./services/client/MqClient.ts"
export * from "./services/client/PagedKvCache.ts"
export * from "./services/client/SchedulerAdapter.ts"
export * from "./services/client/WorkerAdapter.ts"

// KV layouts the adapters and the paged caches are described with
export * from "./services/kv/EngineDrivenLayout.ts"
export * from "./services/kv/KvCacheLayout.ts"

// the socket service the client services need, and its error
export { type DealerOptions, type RouterOptions, ZmqError, ZmqSockets } from "./services/zmq/Sockets.ts"

// the native memory facade the paged KV caches run on (the service and its types, not the raw addon)
export {
  CUDA_UNAVAILABLE,
  type CopyPart,
  type CudaAllocation,
  type CudaBackendInfo,
  NativeError,
  NativeMemory,
  type NativeMemoryShape,
  type ShmMapping
} from "./native/Native.ts"

// memfd memory and descriptor passing (cpu_memfd, docs/memfd.md)
export { closeFd, createMemfd, F_SEAL, type FdFacts, fdInfo, KV_SEALS, sealNames, sendFds } from "./native/FdPassing.ts"

// live layers: everything at once, or one each (a scheduler needs no native memory)
export { ClientLive } from "./layers/Client.ts"
export { NativeMemoryLive } from "./layers/NativeMemory.ts"
export { ZmqSocketsLive } from "./layers/Zmq.ts"

export { PROTOCOL_VERSION, VERSION } from "./version.ts"
