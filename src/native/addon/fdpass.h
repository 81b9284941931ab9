// Memory handed over, not named (mpcache issue 13 item 2; docs/memfd.md): memfd creation and sealing,
// descriptor passing over a Unix-domain stream socket (SCM_RIGHTS) with the sender's SO_PEERCRED, and
// the facts the server checks of each received descriptor. Exports:
//   memfdCreate(name, nbytes, seals) -> fd        memfd_create(MFD_CLOEXEC|MFD_ALLOW_SEALING), ftruncate,
//                                                  F_ADD_SEALS `seals` (F_SEAL_* bits; 0: none)
//   fdInfo(fd) -> { fd, size, seals, regular, kind, access, identity }   (InspectPassed below)
//   closeFd(fd)                                    close(2); EBADF when not open
//   sendFds(socketPath, payload, fds, timeoutMs) -> Promise<Uint8Array>   (client side, on the libuv pool)
//   listenFds(socketPath, onRequest, onRefusal, options) -> FdListener    (server side, fdlisten.cc)
// Framing, both ways: a 4-byte big-endian length L (at most kMaxFrameBytes) and L payload bytes; the
// request's descriptors ride in SCM_RIGHTS on the bytes of the request (docs/memfd.md). socketPath is a
// filesystem path or "@name" for the abstract namespace.
#pragma once

#include <napi.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <cstdint>
#include <string>

namespace mpcache {

// Largest frame payload either way, and most descriptors in one request.
constexpr size_t kMaxFrameBytes = 65536;
constexpr size_t kMaxPassedFds = 64;
// Most descriptors one recvmsg can deliver: the kernel's SCM_MAX_FD (include/net/scm.h), the most one
// SCM_RIGHTS message carries, and a Unix stream read never joins two messages' descriptors. The listener's
// control buffer holds this many so that no read is ever truncated: on MSG_CTRUNC the kernel itself closes
// the descriptors that did not fit, in the reading thread, and such a close can wait (fdrelease.h).
constexpr size_t kScmMaxFds = 253;
// A connection that has not sent its whole request this long after accept is closed (a stuck client
// must not hold a slot).
constexpr int kRequestDeadlineMs = 5000;

Napi::Value MemfdCreate(const Napi::CallbackInfo& info);
Napi::Value FdInfo(const Napi::CallbackInfo& info);
Napi::Value CloseFd(const Napi::CallbackInfo& info);
Napi::Value SendFds(const Napi::CallbackInfo& info);
Napi::Value ListenFds(const Napi::CallbackInfo& info);

// --- shared by fdpass.cc and fdlisten.cc ---------------------------------------------------------------

// What the server reads of a descriptor it received, without ever waiting on the file's filesystem (issue 24
// item 2): F_GET_SEALS first (only shmem and hugetlbfs files take seals, and asking never reaches a
// filesystem) and fstat only for those; anything else gets its type from getsockopt(SO_TYPE) or
// statx(AT_STATX_DONT_SYNC, STATX_TYPE), which FUSE and NFS answer from their cache.
struct PassedFacts {
  int err = 0;         // errno when the descriptor is not open (EBADF); the rest is then unset
  int64_t size = -1;   // st_size, bytes (memfds only; -1 otherwise)
  int seals = -1;      // F_SEAL_* bits; -1: the file takes no seals (not a memfd)
  bool regular = false;
  bool socket = false;
  std::string kind;      // "regular file", "socket", "fifo", "directory", "character device", ...
  std::string access;    // the open file's access mode: "rw", "r", "w", "?"
  std::string identity;  // "<st_dev>:<st_ino>" for memfds; "" otherwise
  bool memfd() const { return err == 0 && seals >= 0; }
};
PassedFacts InspectPassed(int fd);
// The JS object of `facts` for descriptor `fd` (-1: already let go of).
Napi::Object FactsToJs(Napi::Env env, int fd, const PassedFacts& facts);

Napi::Error SocketError(Napi::Env env, const std::string& call, const std::string& path, int err);
// Fills `addr` for a path or "@name" (abstract); false when it does not fit sun_path.
bool SocketAddress(const std::string& path, sockaddr_un* addr, socklen_t* len);
// Argument `index` of `fn` as a socket path (a path or "@name" that fits sun_path); throws EINVAL.
std::string SocketPathArg(const Napi::CallbackInfo& info, size_t index, const char* fn);
void PutLength(uint8_t* out, uint32_t n);
uint32_t GetLength(const uint8_t* in);

}  // namespace mpcache
