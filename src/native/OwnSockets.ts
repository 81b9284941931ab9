/**
 * The process's own accepted sockets on one address, through the addon (src/native/addon/sockets.h): libzmq
 * accepts ZeroMQ connections on its own threads and hands nobody their descriptors, so the server finds them in
 * /proc/self/fd to hold its cap on concurrent connections (issue 24 item 11).
 */
import { Effect } from "effect"
import { toNativeError } from "./internal/AddonErrors.ts"
import { loadNativeAddon, NativeError } from "./Native.ts"

/** Where a listener accepts: a TCP port (any local address) or a Unix socket path. */
export type ListenAddress = { readonly port: number } | { readonly path: string }

/** One accepted socket: its descriptor and the socket's inode (which tells it from a later one on the same descriptor). */
export interface AcceptedSocket {
  readonly fd: number
  readonly inode: number
}

/** The accepted (non-listening) sockets whose local address is `address`; runs on the libuv pool. NativeError when /proc/self/fd cannot be read. */
export const scanAcceptedSockets = (address: ListenAddress): Effect.Effect<ReadonlyArray<AcceptedSocket>, NativeError> =>
  Effect.tryPromise({
    try: () => loadNativeAddon().scanAcceptedSockets(address),
    catch: (e) => toNativeError(e, "scanAcceptedSockets")
  }).pipe(Effect.map((pairs) => pairs.map(([fd, inode]) => ({ fd, inode }))))

/**
 * Shuts the socket down (both directions) if `socket.fd` still is that socket (same inode); its owner then sees
 * the connection end and closes the descriptor. Whether it did.
 */
export const shutdownSocket = (socket: AcceptedSocket): boolean => loadNativeAddon().shutdownSocket(socket.fd, socket.inode)

/** The address a ZeroMQ endpoint accepts on (`tcp://HOST:PORT`, `ipc://PATH`), or undefined for other transports. */
export const listenAddressOf = (endpoint: string): ListenAddress | undefined => {
  if (endpoint.startsWith("ipc://")) return { path: endpoint.slice("ipc://".length) }
  const m = /^tcp:\/\/.+:(\d+)$/.exec(endpoint)
  return m === null ? undefined : { port: Number(m[1]) }
}
