// Accepted sockets on one address (see sockets.h).
//
// A scan walks /proc/self/fd: for each descriptor that is a socket, not listening (SO_ACCEPTCONN 0), whose local
// address is the one asked for (a TCP port on IPv4 or IPv6, or a Unix socket path), it reports the descriptor
// and the socket's inode. It runs on the libuv pool: a process near its descriptor limit holds tens of thousands.
// shutdownSocket checks that the descriptor still is the socket the scan saw (same inode) before shutting it
// down, so a descriptor closed and reused since never suffers; the owner (libzmq) then sees the connection end
// and closes the descriptor itself.
#include "sockets.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "common.h"

namespace mpcache {

namespace {

struct Target {
  int port = -1;     // TCP: the local port
  std::string path;  // Unix: the local path
};

bool Matches(int fd, const Target& target) {
  int listening = 0;
  socklen_t len = sizeof listening;
  if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 || listening != 0) return false;
  sockaddr_storage addr{};
  len = sizeof addr;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return false;
  if (target.port >= 0) {
    if (addr.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port) == target.port;
    if (addr.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port) == target.port;
    return false;
  }
  if (addr.ss_family != AF_UNIX) return false;
  const auto* un = reinterpret_cast<sockaddr_un*>(&addr);
  const size_t n = len > offsetof(sockaddr_un, sun_path) ? len - offsetof(sockaddr_un, sun_path) : 0;
  std::string local(un->sun_path, strnlen(un->sun_path, n));
  return !local.empty() && local == target.path;
}

class ScanWorker : public Napi::AsyncWorker {
 public:
  ScanWorker(Napi::Env env, Target target)
      : Napi::AsyncWorker(env, "mpcache.scanAcceptedSockets"), deferred_(Napi::Promise::Deferred::New(env)), target_(std::move(target)) {}

  Napi::Promise Promise() const { return deferred_.Promise(); }

  void Execute() override {
    DIR* dir = opendir("/proc/self/fd");
    if (dir == nullptr) return SetError(std::string("opendir /proc/self/fd failed: ") + std::strerror(errno));
    const int self = dirfd(dir);
    for (dirent* e = readdir(dir); e != nullptr; e = readdir(dir)) {
      if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
      const int fd = std::atoi(e->d_name);
      if (fd == self) continue;
      struct stat st;
      if (fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
      if (Matches(fd, target_)) found_.emplace_back(fd, static_cast<double>(st.st_ino));
    }
    closedir(dir);
  }

  void OnOK() override {
    Napi::Env env = Env();
    Napi::Array out = Napi::Array::New(env, found_.size());
    for (size_t i = 0; i < found_.size(); ++i) {
      Napi::Array pair = Napi::Array::New(env, 2);
      pair.Set(0u, Napi::Number::New(env, found_[i].first));
      pair.Set(1u, Napi::Number::New(env, found_[i].second));
      out.Set(static_cast<uint32_t>(i), pair);
    }
    deferred_.Resolve(out);
  }

  void OnError(const Napi::Error& error) override { deferred_.Reject(error.Value()); }

 private:
  Napi::Promise::Deferred deferred_;
  Target target_;
  std::vector<std::pair<int, double>> found_;
};

}  // namespace

Napi::Value ScanAcceptedSockets(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() < 1 || !info[0].IsObject()) {
    throw MakeError(env, "EINVAL", "scanAcceptedSockets", "scanAcceptedSockets: expected { port } or { path }");
  }
  Napi::Object arg = info[0].As<Napi::Object>();
  Target target;
  if (arg.Has("port") && arg.Get("port").IsNumber()) {
    target.port = arg.Get("port").As<Napi::Number>().Int32Value();
  } else if (arg.Has("path") && arg.Get("path").IsString()) {
    target.path = arg.Get("path").As<Napi::String>().Utf8Value();
  }
  if (target.port < 0 && target.path.empty()) {
    throw MakeError(env, "EINVAL", "scanAcceptedSockets", "scanAcceptedSockets: expected { port: number } or { path: string }");
  }
  auto* worker = new ScanWorker(env, std::move(target));
  Napi::Promise promise = worker->Promise();
  worker->Queue();
  return promise;
}

Napi::Value ShutdownSocket(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() < 2 || !info[0].IsNumber() || !info[1].IsNumber()) {
    throw MakeError(env, "EINVAL", "shutdownSocket", "shutdownSocket: expected (fd, inode)");
  }
  const int fd = info[0].As<Napi::Number>().Int32Value();
  const double inode = info[1].As<Napi::Number>().DoubleValue();
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode) || static_cast<double>(st.st_ino) != inode) return Napi::Boolean::New(env, false);
  return Napi::Boolean::New(env, shutdown(fd, SHUT_RDWR) == 0);
}

}  // namespace mpcache
