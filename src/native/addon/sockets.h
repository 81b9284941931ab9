// The process's own accepted sockets on one listening address (issue 24 item 11): libzmq accepts connections on
// its own threads and tells nobody their descriptors, so the server finds them in /proc/self/fd to enforce its cap
// on concurrent ZeroMQ connections.
//   scanAcceptedSockets({ port } | { path }) -> Promise<Array<[fd, inode]>>   (libuv pool)
//   shutdownSocket(fd, inode) -> boolean                                       (only if fd is still that socket)
#pragma once

#include <napi.h>

namespace mpcache {

Napi::Value ScanAcceptedSockets(const Napi::CallbackInfo& info);
Napi::Value ShutdownSocket(const Napi::CallbackInfo& info);

}  // namespace mpcache
