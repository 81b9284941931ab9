/**
 * The client's half of handing memfd memory to the server (issue 13 item 2,
 * docs/memfd.md): GET_SERVER_INFO on the ZeroMQ connection that will
 * REGISTER (its answer names the descriptor socket and this connection's
 * `fd_nonce`), one request on the descriptor socket with the descriptors
 * in SCM_RIGHTS, and the one-time token of the reply, which the
 * `cpu_memfd` descriptors of the next REGISTER carry. A token registers
 * once: every REGISTER (re-registrations too) hands the descriptors over
 * again.
 */
import { Effect } from "effect"
import { sendFds } from "../../native/FdPassing.ts"
import { pack, unpack } from "../../schema/Frame.ts"
import type { InstanceId } from "../../schema/InstanceId.ts"
import { GetServerInfo } from "../../schema/Op.ts"
import type { TensorDescriptor } from "../../schema/TensorDescriptor.ts"
import { Forbidden, InvalidArgument, Overloaded } from "../../schema/WireError.ts"
import type { MqClientShape, RequestError } from "./MqClient.ts"

/** The descriptor request's map version this client sends (FdExchange's FD_REQUEST_VERSION). */
const REQUEST_VERSION = 1

/**
 * Hands `memfds` over for instance `instanceId` through `client`'s server
 * and returns the 16-byte token. Fails with the server's refusal
 * (InvalidArgument: an unsealed memfd under --require-sealed-memfd, a
 * descriptor that is no memfd …; Forbidden; Overloaded, `field` the flag
 * of the cap, e.g. `max-passed-descriptors-per-peer`), with
 * InvalidArgument (field `fd_socket`) when the server takes no memfd or
 * its socket cannot be reached, or with the client's request errors.
 */
export const handOverMemfds = (
  client: MqClientShape,
  instanceId: InstanceId,
  memfds: ReadonlyArray<number>,
  timeoutMs: number
): Effect.Effect<Uint8Array, RequestError> =>
  Effect.gen(function*() {
    const info = yield* client.request(GetServerInfo, [], { timeoutMs })
    if (info.fd_socket === "" || !info.features.includes("cpu_memfd")) {
      return yield* new InvalidArgument({
        field: "fd_socket",
        message: `the server at ${client.endpoint} takes no memfd descriptors (features: ${info.features.join(", ") || "none"}); create the KV cache with backing "cpu_shm"`
      })
    }
    const request = pack({ version: REQUEST_VERSION, nonce: info.fd_nonce, instance_id: instanceId, fds: memfds.length })
    const bytes = yield* sendFds(info.fd_socket, request, memfds, timeoutMs).pipe(
      Effect.mapError((e) => new InvalidArgument({ field: "fd_socket", message: `descriptor socket ${info.fd_socket}: ${e.message}` }))
    )
    const reply = unpack(bytes)?.value as { ok?: unknown; token?: unknown; code?: unknown; message?: unknown; field?: unknown } | undefined
    if (reply?.ok === true && reply.token instanceof Uint8Array) return reply.token
    const message = typeof reply?.message === "string" ? reply.message : `descriptor socket ${info.fd_socket}: an unreadable reply`
    return yield* reply?.code === "forbidden"
      ? new Forbidden({ field: "fd_socket", message })
      : reply?.code === "overloaded"
      // The server names the flag of the cap it hit (--max-passed-descriptors …).
      ? new Overloaded({ field: typeof reply.field === "string" ? reply.field : "fd_socket", message })
      : new InvalidArgument({ field: "fd_socket", message })
  })

/** `descriptors` with every cpu_memfd one carrying `token` (the rest unchanged). */
export const withFdToken = (descriptors: ReadonlyArray<TensorDescriptor>, token: Uint8Array): ReadonlyArray<TensorDescriptor> =>
  descriptors.map((d) => (d.kind === "cpu_memfd" ? { ...d, fd_token: token } : d))
