// Memory handed over, not named (mpcache issue 13 item 2; docs/memfd.md): memfd creation and sealing,
// descriptor passing over a Unix-domain stream socket (SCM_RIGHTS) with the sender's SO_PEERCRED, and
// the facts the server checks of each received descriptor. Exports:
//   memfdCreate(name, nbytes, seals) -> fd        memfd_create(MFD_CLOEXEC|MFD_ALLOW_SEALING), ftruncate,
//                                                  F_ADD_SEALS `seals` (F_SEAL_* bits; 0: none)
//   fdInfo(fd) -> { size, seals, regular, access, identity }
//   closeFd(fd)                                    close(2); EBADF when not open
//   sendFds(socketPath, payload, fds, timeoutMs) -> Promise<Uint8Array>   (client side, on the libuv pool)
//   listenFds(socketPath, onRequest, groupId?) -> FdListener { reply(conn, bytes), close() -> Promise<void>, path }
//                                                  (server side, on a thread of its own)
// Framing, both ways: a 4-byte big-endian length L (at most kMaxFrameBytes) and L payload bytes; the
// request's descriptors ride in SCM_RIGHTS on the bytes of the request (docs/memfd.md). socketPath is a
// filesystem path or "@name" for the abstract namespace.
#pragma once

#include <napi.h>

namespace mpcache {

// Largest frame payload either way, and most descriptors in one request.
constexpr size_t kMaxFrameBytes = 65536;
constexpr size_t kMaxPassedFds = 64;
// A connection that has not sent its whole request this long after accept is closed (a stuck client
// must not hold a slot), and at most this many connections are open at once.
constexpr int kRequestDeadlineMs = 5000;
constexpr size_t kMaxConnections = 128;

Napi::Value MemfdCreate(const Napi::CallbackInfo& info);
Napi::Value FdInfo(const Napi::CallbackInfo& info);
Napi::Value CloseFd(const Napi::CallbackInfo& info);
Napi::Value SendFds(const Napi::CallbackInfo& info);
Napi::Value ListenFds(const Napi::CallbackInfo& info);

}  // namespace mpcache
