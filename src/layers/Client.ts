/**
 * The client assembly: what a worker, scheduler or probe process provides
 * to the client services of `src/services/client` — ZeroMQ sockets for
 * `MqClient` and the adapters, and the native memory backend for the paged
 * KV cache helpers (DESIGN §2, §6). Exported as part of `mpcache/client`.
 */
import { Layer } from "effect"
import { NativeMemoryLive } from "./NativeMemory.ts"
import { ZmqSocketsLive } from "./Zmq.ts"

/** ZeroMQ sockets and native memory for client programs. Fails with nothing at build; the addon loads on first use. */
export const ClientLive = Layer.mergeAll(ZmqSocketsLive, NativeMemoryLive)
