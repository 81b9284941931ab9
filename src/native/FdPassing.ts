/**
 * memfd memory and descriptor passing as Effects (issue 13 item 2,
 * docs/memfd.md): the worker creates its KV memory with `memfd_create` and
 * seals it; both sides talk over a Unix-domain stream socket whose requests
 * carry descriptors in `SCM_RIGHTS` (Node's `net` cannot pass descriptors,
 * so the addon does it: src/native/addon/fdpass.h). Every descriptor is a
 * resource: created or received into a Scope, closed with it.
 *
 * Socket paths are filesystem paths or `@name` (the abstract namespace).
 */
import { Effect, Queue } from "effect"
import type { Scope } from "effect"
import { toNativeError } from "./internal/AddonErrors.ts"
import { type FdFacts, type FdListener, type FdListenOptions, type FdRequest, loadNativeAddon, NativeError } from "./Native.ts"

/** Linux's F_SEAL_* bits (fcntl.h), as F_GET_SEALS reports them. */
export const F_SEAL = { seal: 1, shrink: 2, grow: 4, write: 8, futureWrite: 16 } as const

/** The seals a worker puts on its KV memory by default: no shrinking, no growing, no further seals. */
export const KV_SEALS = F_SEAL.shrink | F_SEAL.grow | F_SEAL.seal

/** The names of the bits set in `seals` ("seal", "shrink", "grow", "write", "future_write"), for status and errors. */
export const sealNames = (seals: number): ReadonlyArray<string> =>
  seals < 0
    ? []
    : ([["seal", F_SEAL.seal], ["shrink", F_SEAL.shrink], ["grow", F_SEAL.grow], ["write", F_SEAL.write], [
      "future_write",
      F_SEAL.futureWrite
    ]] as const).flatMap(([name, bit]) => (seals & bit) !== 0 ? [name] : [])

/** Closes a descriptor; a failure (EBADF: already closed) is logged, never raised: it runs in finalizers. */
export const closeFd = (fd: number): Effect.Effect<void> =>
  Effect.try({ try: () => loadNativeAddon().closeFd(fd), catch: (e) => toNativeError(e, "close") }).pipe(
    Effect.catch((e) => Effect.logWarning(`closing descriptor ${fd} failed: ${e.message}`))
  )

/**
 * Scoped: a memfd of `nbytes` bytes (zeros) named `name` (shown as
 * `/memfd:<name>` in /proc/<pid>/maps), with `seals` added (F_SEAL_* bits,
 * default {@link KV_SEALS}; 0 for none); closed with the scope. NativeError
 * (EMFILE, ENOMEM, EINVAL …) when the kernel refuses.
 */
export const createMemfd = (
  name: string,
  nbytes: number,
  seals: number = KV_SEALS
): Effect.Effect<number, NativeError, Scope.Scope> =>
  Effect.acquireRelease(
    Effect.try({ try: () => loadNativeAddon().memfdCreate(name, nbytes, seals), catch: (e) => toNativeError(e, "memfd_create") }),
    closeFd
  )

/** What the kernel says of a descriptor: size, seals, access mode, identity. NativeError when it is not open. */
export const fdInfo = (fd: number): Effect.Effect<FdFacts, NativeError> =>
  Effect.try({ try: () => loadNativeAddon().fdInfo(fd), catch: (e) => toNativeError(e, "fstat") })

/**
 * The client's half of one exchange: connects to `socketPath`, sends
 * `payload` framed (4-byte big-endian length) with `fds` in SCM_RIGHTS,
 * returns the reply's payload. Runs on the libuv pool. NativeError:
 * ENOENT / ECONNREFUSED (no server there), ETIMEDOUT (no answer within
 * `timeoutMs`), ECONNRESET (closed without a reply), EPROTO (a bad frame).
 */
export const sendFds = (
  socketPath: string,
  payload: Uint8Array,
  fds: ReadonlyArray<number>,
  timeoutMs: number
): Effect.Effect<Uint8Array, NativeError> =>
  Effect.tryPromise({
    try: () => loadNativeAddon().sendFds(socketPath, payload, fds, timeoutMs),
    catch: (e) => toNativeError(e, "sendFds")
  })

/**
 * Scoped: listens on `socketPath` (a path gets mode 0600, or 0660 and group
 * `options.groupId` when given, set before listen; a stale socket file
 * nobody answers on is replaced) and returns the listener with the queue
 * its requests arrive on, in order, and `refused`: a one-slot queue that
 * holds a signal after the listener refused a connection (read
 * `listener.stats()` for the counts). Connections are taken as `options`
 * says (Native.ts FdListenOptions: the uid rule, the caps, the refusals'
 * replies). Closing the scope stops the listener's thread, lets go of its
 * connections and of the descriptors of requests not yet handed over
 * (src/native/addon/fdrelease.h: never waiting on a close), closes the
 * memfds of requests queued and never taken, and removes the path.
 * NativeError EADDRINUSE when a live server (or a non-socket file) holds
 * the path.
 */
export const listenFds = (
  socketPath: string,
  options: FdListenOptions
): Effect.Effect<
  { readonly listener: FdListener; readonly requests: Queue.Dequeue<FdRequest>; readonly refused: Queue.Dequeue<void> },
  NativeError,
  Scope.Scope
> =>
  Effect.gen(function*() {
    const requests = yield* Queue.unbounded<FdRequest>()
    const refused = yield* Queue.sliding<void>(1)
    const listener = yield* Effect.acquireRelease(
      Effect.try({
        try: () =>
          loadNativeAddon().listenFds(
            socketPath,
            (request) => void Queue.offerUnsafe(requests, request),
            () => void Queue.offerUnsafe(refused, undefined),
            options
          ),
        catch: (e) => toNativeError(e, "listenFds")
      }),
      // Stop the thread first (nothing is queued after), then close what was queued and never taken.
      (l) =>
        Effect.sync(() => l.close()).pipe(
          Effect.andThen(Queue.clear(requests)),
          Effect.flatMap((left) => Effect.forEach(left.flatMap((r) => r.fds), (f) => closePassed(l, f.fd), { discard: true }))
        )
    )
    return { listener, requests, refused }
  })

/**
 * Closes a memfd `listener` handed over (an FdRequest's `fd`; -1, one the
 * addon let go of, is skipped) and takes it off the listener's count; a
 * failure (EBADF: closed twice) is logged, never raised: it runs in
 * finalizers.
 */
export const closePassed = (listener: FdListener, fd: number): Effect.Effect<void> =>
  fd < 0 ? Effect.void : Effect.try({ try: () => listener.closePassed(fd), catch: (e) => toNativeError(e, "close") }).pipe(
    Effect.catch((e) => Effect.logWarning(`closing passed descriptor ${fd} failed: ${e.message}`))
  )

export type { FdFacts, FdListener, FdListenerStats, FdListenOptions, FdRefusalReason, FdRequest } from "./Native.ts"
export { NativeError }
