// memfd creation and descriptor passing (see fdpass.h, docs/memfd.md).
//
// The server's listener runs on a thread of its own: poll(2) over an eventfd (wake-ups: replies to send,
// close), the listening socket and the connections still sending their request, so the event loop never
// blocks on a socket. A complete request (or a framing error) goes to JS through a thread-safe function
// (non-blocking, unbounded queue: the thread never waits on the JS thread, so close() may join it). The
// received descriptors belong to JS from the moment the call is queued; every other path closes them
// here: a connection that hangs up, errs, overruns its deadline or is cut by close(), and a call the
// thread-safe function refuses or tears down (env NULL).
#include "fdpass.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common.h"

namespace mpcache {

namespace {

using Clock = std::chrono::steady_clock;

Napi::Error SocketError(Napi::Env env, const std::string& call, const std::string& path, int err) {
  const std::string code = ErrnoName(err);
  return MakeError(env, code, call,
                   call + " on descriptor socket " + path + " failed: " + std::strerror(err) + " (" + code + ")");
}

// Fills `addr` for a path or "@name" (abstract); false when it does not fit sun_path.
bool SocketAddress(const std::string& path, sockaddr_un* addr, socklen_t* len) {
  std::memset(addr, 0, sizeof *addr);
  addr->sun_family = AF_UNIX;
  const bool abstract = !path.empty() && path[0] == '@';
  if (path.size() >= sizeof addr->sun_path || path.size() < 2 - (abstract ? 0 : 1)) return false;
  std::memcpy(addr->sun_path, path.data(), path.size());
  if (abstract) addr->sun_path[0] = '\0';
  *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path.size() + (abstract ? 0 : 1));
  return true;
}

std::string SocketPathArg(const Napi::CallbackInfo& info, size_t index, const char* fn) {
  if (info.Length() <= index || !info[index].IsString()) {
    throw MakeError(info.Env(), "EINVAL", fn, std::string(fn) + ": the socket path must be a string (a path or \"@name\")");
  }
  const std::string path = info[index].As<Napi::String>().Utf8Value();
  sockaddr_un addr;
  socklen_t len = 0;
  if (path.find('\0') != std::string::npos || !SocketAddress(path, &addr, &len)) {
    throw MakeError(info.Env(), "EINVAL", fn,
                    std::string(fn) + ": socket path \"" + path + "\" is empty or longer than " +
                        std::to_string(sizeof addr.sun_path - 1) + " bytes");
  }
  return path;
}

int FdArg(const Napi::CallbackInfo& info, size_t index, const char* fn) {
  const double v = info.Length() > index && info[index].IsNumber() ? info[index].As<Napi::Number>().DoubleValue() : -1;
  if (v < 0 || v > 2147483647.0 || v != static_cast<double>(static_cast<int>(v))) {
    throw MakeError(info.Env(), "EINVAL", fn, std::string(fn) + ": the descriptor must be an integer >= 0");
  }
  return static_cast<int>(v);
}

void CloseAll(std::vector<int>* fds) {
  for (int fd : *fds) close(fd);
  fds->clear();
}

// What the server checks of a received descriptor (and fdInfo tells tests): size, seals (-1 when the file
// takes none: not a memfd/shmem file), whether it is a regular file, its access mode, its identity.
Napi::Object FdFacts(Napi::Env env, int fd) {
  struct stat st;
  if (fstat(fd, &st) != 0) throw SocketError(env, "fstat", "descriptor " + std::to_string(fd), errno);
  const int seals = fcntl(fd, F_GET_SEALS);
  const int flags = fcntl(fd, F_GETFL);
  const int mode = flags < 0 ? -1 : (flags & O_ACCMODE);
  Napi::Object out = Napi::Object::New(env);
  out.Set("fd", Napi::Number::New(env, fd));
  out.Set("size", Napi::Number::New(env, static_cast<double>(st.st_size)));
  out.Set("seals", Napi::Number::New(env, seals));
  out.Set("regular", Napi::Boolean::New(env, S_ISREG(st.st_mode)));
  out.Set("access", Napi::String::New(env, mode == O_RDWR ? "rw" : mode == O_RDONLY ? "r" : mode == O_WRONLY ? "w" : "?"));
  out.Set("identity", Napi::String::New(env, FileIdentity(st)));
  return out;
}

void PutLength(uint8_t* out, uint32_t n) {
  out[0] = static_cast<uint8_t>(n >> 24);
  out[1] = static_cast<uint8_t>(n >> 16);
  out[2] = static_cast<uint8_t>(n >> 8);
  out[3] = static_cast<uint8_t>(n);
}

uint32_t GetLength(const uint8_t* in) {
  return (uint32_t{in[0]} << 24) | (uint32_t{in[1]} << 16) | (uint32_t{in[2]} << 8) | uint32_t{in[3]};
}

// --- client: sendFds ---------------------------------------------------------------------------------

// connect, one sendmsg with every descriptor in SCM_RIGHTS on the request's bytes, read the framed reply;
// blocking with SO_SNDTIMEO/SO_RCVTIMEO = timeout, on the libuv pool. The caller keeps its descriptors (the
// kernel passes copies).
class SendFdsWorker : public Napi::AsyncWorker {
 public:
  SendFdsWorker(Napi::Env env, std::string path, std::vector<uint8_t> frame, std::vector<int> fds, int timeoutMs)
      : Napi::AsyncWorker(env, "mpcache.sendFds"),
        deferred_(Napi::Promise::Deferred::New(env)),
        path_(std::move(path)),
        frame_(std::move(frame)),
        fds_(std::move(fds)),
        timeoutMs_(timeoutMs) {}

  Napi::Promise Promise() const { return deferred_.Promise(); }

  void Execute() override {
    const int sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (sock < 0) return Fail("socket", errno);
    Exchange(sock);
    close(sock);
  }

  void OnOK() override {
    Napi::Env env = Env();
    if (!failure_.failed()) {
      Napi::Uint8Array out = Napi::Uint8Array::New(env, reply_.size());
      if (!reply_.empty()) std::memcpy(out.Data(), reply_.data(), reply_.size());
      deferred_.Resolve(out);
    } else {
      deferred_.Reject(MakeError(env, failure_.code, failure_.call, failure_.message).Value());
    }
  }

  void OnError(const Napi::Error& error) override { deferred_.Reject(error.Value()); }

 private:
  struct Failure {
    std::string code, call, message;
    bool failed() const { return !code.empty(); }
  };

  void Fail(const char* call, int err) {
    const std::string code = err == EAGAIN || err == EWOULDBLOCK ? "ETIMEDOUT" : ErrnoName(err);
    failure_ = Failure{code, call,
                       std::string(call) + " on descriptor socket " + path_ + " failed: " +
                           (code == "ETIMEDOUT" ? "no answer within " + std::to_string(timeoutMs_) + " ms"
                                                : std::string(std::strerror(err))) +
                           " (" + code + ")"};
  }

  void Exchange(int sock) {
    timeval tv{timeoutMs_ / 1000, (timeoutMs_ % 1000) * 1000};
    setsockopt(sock, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    sockaddr_un addr;
    socklen_t len = 0;
    SocketAddress(path_, &addr, &len);
    if (connect(sock, reinterpret_cast<sockaddr*>(&addr), len) != 0) return Fail("connect", errno);
    std::vector<char> control(CMSG_SPACE(sizeof(int) * fds_.size()));
    size_t sent = 0;
    while (sent < frame_.size()) {
      iovec iov{frame_.data() + sent, frame_.size() - sent};
      msghdr msg{};
      msg.msg_iov = &iov;
      msg.msg_iovlen = 1;
      if (sent == 0 && !fds_.empty()) {  // the descriptors ride on the first bytes only
        msg.msg_control = control.data();
        msg.msg_controllen = control.size();
        cmsghdr* c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int) * fds_.size());
        std::memcpy(CMSG_DATA(c), fds_.data(), sizeof(int) * fds_.size());
      }
      const ssize_t n = sendmsg(sock, &msg, MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EINTR) continue;
        return Fail("sendmsg", errno);
      }
      sent += static_cast<size_t>(n);
    }
    std::vector<uint8_t> in;
    uint8_t chunk[4096];
    while (in.size() < 4 || in.size() < 4 + static_cast<size_t>(GetLength(in.data()))) {
      if (in.size() >= 4 && GetLength(in.data()) > kMaxFrameBytes) {
        failure_ = Failure{"EPROTO", "recv", "recv on descriptor socket " + path_ + ": the reply claims " +
                                                 std::to_string(GetLength(in.data())) + " bytes, more than the " +
                                                 std::to_string(kMaxFrameBytes) + " a frame may hold"};
        return;
      }
      const ssize_t n = recv(sock, chunk, sizeof chunk, 0);
      if (n < 0) {
        if (errno == EINTR) continue;
        return Fail("recv", errno);
      }
      if (n == 0) {
        failure_ = Failure{"ECONNRESET", "recv",
                           "recv on descriptor socket " + path_ + ": the server closed the connection after " +
                               std::to_string(in.size()) + " bytes of its reply"};
        return;
      }
      in.insert(in.end(), chunk, chunk + n);
    }
    reply_.assign(in.begin() + 4, in.begin() + 4 + GetLength(in.data()));
  }

  Napi::Promise::Deferred deferred_;
  std::string path_;
  std::vector<uint8_t> frame_;
  std::vector<int> fds_;
  int timeoutMs_;
  std::vector<uint8_t> reply_;
  Failure failure_;
};

// --- server: the listener --------------------------------------------------------------------------

// One request, handed to JS: the connection, the peer's credentials, the payload and the descriptors
// (owned by whoever holds this), or the framing error that ended the connection.
struct Delivery {
  uint64_t conn = 0;
  ucred cred{};
  std::vector<uint8_t> payload;
  std::vector<int> fds;
  std::string error;
  ~Delivery() { CloseAll(&fds); }
};

struct Conn {
  int fd = -1;
  ucred cred{};
  std::vector<uint8_t> buf;
  std::vector<int> fds;
  Clock::time_point deadline;
  bool waiting = false;  // handed to JS, waiting for its reply
};

void DeliverToJs(Napi::Env env, Napi::Function onRequest, void* context, Delivery* raw);
using RequestTsfn = Napi::TypedThreadSafeFunction<void, Delivery, DeliverToJs>;

class Listener {
 public:
  Listener(std::string path, int listenFd, int wakeFd, RequestTsfn tsfn)
      : path_(std::move(path)), listenFd_(listenFd), wakeFd_(wakeFd), tsfn_(std::move(tsfn)) {
    thread_ = std::thread([this] { Run(); });
  }
  ~Listener() { Stop(); }

  const std::string& path() const { return path_; }

  // JS thread: queue a reply for `conn`; the thread sends it and closes the connection.
  void Reply(uint64_t conn, std::vector<uint8_t> bytes) {
    if (stopped_) return;  // closed: the connection is gone already
    {
      std::lock_guard<std::mutex> lock(mutex_);
      replies_.emplace_back(conn, std::move(bytes));
    }
    Wake();
  }

  // JS thread: stop the thread, close every connection and their descriptors, the socket, its path.
  void Stop() {
    if (stopped_) return;
    stopped_ = true;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    Wake();
    if (thread_.joinable()) thread_.join();
    tsfn_.Release();
    close(listenFd_);
    close(wakeFd_);
    if (!path_.empty() && path_[0] != '@') unlink(path_.c_str());
  }

 private:
  void Wake() {
    const uint64_t one = 1;
    ssize_t rc;
    do {
      rc = write(wakeFd_, &one, sizeof one);
    } while (rc < 0 && errno == EINTR);
  }

  void Run() {
    std::map<uint64_t, Conn> conns;
    uint64_t nextId = 1;
    for (;;) {
      std::vector<pollfd> polls{{wakeFd_, POLLIN, 0}, {listenFd_, POLLIN, 0}};
      std::vector<uint64_t> ids;
      int timeout = -1;
      const Clock::time_point now = Clock::now();
      for (auto& [id, c] : conns) {
        if (c.waiting) continue;
        polls.push_back({c.fd, POLLIN, 0});
        ids.push_back(id);
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(c.deadline - now).count();
        const int ms = left < 0 ? 0 : static_cast<int>(left);
        timeout = timeout < 0 ? ms : std::min(timeout, ms);
      }
      const int ready = poll(polls.data(), polls.size(), timeout);
      if (ready < 0 && errno != EINTR) break;
      if (polls[0].revents & POLLIN) {
        uint64_t drained;
        (void)!read(wakeFd_, &drained, sizeof drained);
      }
      std::vector<std::pair<uint64_t, std::vector<uint8_t>>> replies;
      bool stopping;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        replies.swap(replies_);
        stopping = stopping_;
      }
      if (stopping) break;
      for (auto& [id, bytes] : replies) {
        auto it = conns.find(id);
        if (it == conns.end()) continue;
        SendReply(it->second.fd, bytes);
        CloseConn(&it->second);
        conns.erase(it);
      }
      if (polls[1].revents & POLLIN) Accept(&conns, &nextId);
      for (size_t i = 0; i < ids.size(); ++i) {
        auto it = conns.find(ids[i]);
        if (it == conns.end()) continue;
        if (polls[i + 2].revents != 0) ReadFrom(ids[i], &it->second);
        if (!it->second.waiting && (it->second.fd < 0 || Clock::now() >= it->second.deadline)) {
          CloseConn(&it->second);
          conns.erase(it);
        }
      }
    }
    for (auto& [id, c] : conns) CloseConn(&c);
  }

  void Accept(std::map<uint64_t, Conn>* conns, uint64_t* nextId) {
    for (;;) {
      const int fd = accept4(listenFd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) return;  // EAGAIN: none left; other errors: the next poll retries
      Conn c;
      c.fd = fd;
      socklen_t len = sizeof c.cred;
      if (conns->size() >= kMaxConnections || getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &c.cred, &len) != 0) {
        close(fd);
        continue;
      }
      c.deadline = Clock::now() + std::chrono::milliseconds(kRequestDeadlineMs);
      conns->emplace((*nextId)++, std::move(c));
    }
  }

  // Reads what is there; on a complete request (or an error) hands it to JS. fd < 0 afterwards: close it.
  void ReadFrom(uint64_t id, Conn* c) {
    uint8_t chunk[16384];
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxPassedFds)];
    for (;;) {
      iovec iov{chunk, sizeof chunk};
      msghdr msg{};
      msg.msg_iov = &iov;
      msg.msg_iovlen = 1;
      msg.msg_control = control;
      msg.msg_controllen = sizeof control;
      const ssize_t n = recvmsg(c->fd, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      if (n <= 0) {  // hung up before a whole request, or an error
        CloseConn(c);
        return;
      }
      for (cmsghdr* h = CMSG_FIRSTHDR(&msg); h != nullptr; h = CMSG_NXTHDR(&msg, h)) {
        if (h->cmsg_level != SOL_SOCKET || h->cmsg_type != SCM_RIGHTS) continue;
        const size_t count = (h->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        const int* received = reinterpret_cast<const int*>(CMSG_DATA(h));
        for (size_t k = 0; k < count; ++k) c->fds.push_back(received[k]);
      }
      c->buf.insert(c->buf.end(), chunk, chunk + n);
      std::string error;
      if (msg.msg_flags & MSG_CTRUNC) {
        error = "more than " + std::to_string(kMaxPassedFds) + " descriptors in one request (the rest were dropped)";
      } else if (c->buf.size() >= 4 && GetLength(c->buf.data()) > kMaxFrameBytes) {
        error = "the request claims " + std::to_string(GetLength(c->buf.data())) + " bytes; at most " +
                std::to_string(kMaxFrameBytes) + " may follow the 4-byte length";
      } else if (c->buf.size() >= 4 && c->buf.size() > 4 + size_t{GetLength(c->buf.data())}) {
        error = "bytes past the end of the request's frame (one request per connection)";
      } else if (c->buf.size() < 4 || c->buf.size() < 4 + size_t{GetLength(c->buf.data())}) {
        continue;
      }
      auto* d = new Delivery();
      d->conn = id;
      d->cred = c->cred;
      d->error = error;
      if (error.empty()) {
        d->payload.assign(c->buf.begin() + 4, c->buf.end());
        d->fds.swap(c->fds);
      } else {
        CloseAll(&c->fds);
      }
      c->waiting = true;
      if (tsfn_.NonBlockingCall(d) != napi_ok) {
        delete d;  // closes its descriptors
        CloseConn(c);
        c->waiting = false;
      }
      return;
    }
  }

  static void SendReply(int fd, const std::vector<uint8_t>& bytes) {
    std::vector<uint8_t> frame(4 + bytes.size());
    PutLength(frame.data(), static_cast<uint32_t>(bytes.size()));
    if (!bytes.empty()) std::memcpy(frame.data() + 4, bytes.data(), bytes.size());
    // A reply of a few hundred bytes on a fresh connection fits its socket buffer: never blocks; a peer
    // that does not read it just loses it.
    (void)!send(fd, frame.data(), frame.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  }

  static void CloseConn(Conn* c) {
    CloseAll(&c->fds);
    if (c->fd >= 0) close(c->fd);
    c->fd = -1;
  }

  std::string path_;
  int listenFd_;
  int wakeFd_;
  RequestTsfn tsfn_;
  std::thread thread_;
  std::mutex mutex_;
  std::vector<std::pair<uint64_t, std::vector<uint8_t>>> replies_;
  bool stopping_ = false;
  bool stopped_ = false;
};

void DeliverToJs(Napi::Env env, Napi::Function onRequest, void*, Delivery* raw) {
  std::unique_ptr<Delivery> d(raw);  // env NULL (teardown): its destructor closes the descriptors
  if (env == nullptr || onRequest.IsEmpty()) return;
  Napi::Object req = Napi::Object::New(env);
  req.Set("conn", Napi::Number::New(env, static_cast<double>(d->conn)));
  req.Set("pid", Napi::Number::New(env, d->cred.pid));
  req.Set("uid", Napi::Number::New(env, d->cred.uid));
  req.Set("gid", Napi::Number::New(env, d->cred.gid));
  req.Set("error", Napi::String::New(env, d->error));
  Napi::Uint8Array payload = Napi::Uint8Array::New(env, d->payload.size());
  if (!d->payload.empty()) std::memcpy(payload.Data(), d->payload.data(), d->payload.size());
  req.Set("payload", payload);
  Napi::Array fds = Napi::Array::New(env, d->fds.size());
  for (size_t i = 0; i < d->fds.size(); ++i) {
    try {
      fds.Set(static_cast<uint32_t>(i), FdFacts(env, d->fds[i]));
    } catch (const Napi::Error&) {
      Napi::Object bad = Napi::Object::New(env);
      bad.Set("fd", Napi::Number::New(env, d->fds[i]));
      bad.Set("size", Napi::Number::New(env, -1));
      bad.Set("seals", Napi::Number::New(env, -1));
      bad.Set("regular", Napi::Boolean::New(env, false));
      bad.Set("access", Napi::String::New(env, "?"));
      bad.Set("identity", Napi::String::New(env, ""));
      fds.Set(static_cast<uint32_t>(i), bad);
    }
  }
  req.Set("fds", fds);
  d->fds.clear();  // JS owns them now (it closes each)
  try {
    onRequest.Call({req});
  } catch (const Napi::Error&) {
    // The callback only queues the request; nothing to undo here, and no exception may leave a TSFN call.
  }
}

Listener* ListenerOf(const Napi::CallbackInfo& info) {
  Listener* l = static_cast<Listener*>(info.Data());
  return l;
}

}  // namespace

Napi::Value MemfdCreate(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() < 1 || !info[0].IsString()) {
    throw MakeError(env, "EINVAL", "memfdCreate", "memfdCreate: the name must be a string (shown in /proc/<pid>/maps)");
  }
  const std::string name = info[0].As<Napi::String>().Utf8Value();
  const uint64_t nbytes = ByteCountArg(info, 1, "memfdCreate", 0);
  const int seals = info.Length() > 2 && info[2].IsNumber() ? info[2].As<Napi::Number>().Int32Value() : 0;
  const int fd = memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) throw ErrnoError(env, "memfd_create", name, errno);
  int rc;
  do {
    rc = ftruncate(fd, static_cast<off_t>(nbytes));
  } while (rc != 0 && errno == EINTR);
  if (rc != 0 || (seals != 0 && fcntl(fd, F_ADD_SEALS, seals) != 0)) {
    const int err = errno;
    close(fd);
    throw ErrnoError(env, rc != 0 ? "ftruncate" : "fcntl(F_ADD_SEALS)", name, err);
  }
  return Napi::Number::New(env, fd);
}

Napi::Value FdInfo(const Napi::CallbackInfo& info) { return FdFacts(info.Env(), FdArg(info, 0, "fdInfo")); }

Napi::Value CloseFd(const Napi::CallbackInfo& info) {
  const int fd = FdArg(info, 0, "closeFd");
  if (close(fd) != 0) throw SocketError(info.Env(), "close", "descriptor " + std::to_string(fd), errno);
  return info.Env().Undefined();
}

Napi::Value SendFds(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const std::string path = SocketPathArg(info, 0, "sendFds");
  if (info.Length() < 4 || !info[1].IsTypedArray() || !info[2].IsArray() || !info[3].IsNumber()) {
    throw MakeError(env, "EINVAL", "sendFds", "sendFds: expected (socketPath, payload: Uint8Array, fds: number[], timeoutMs)");
  }
  Napi::Uint8Array payload = info[1].As<Napi::Uint8Array>();
  if (payload.ByteLength() > kMaxFrameBytes) {
    throw MakeError(env, "EINVAL", "sendFds",
                    "sendFds: the payload holds " + std::to_string(payload.ByteLength()) + " bytes; at most " +
                        std::to_string(kMaxFrameBytes));
  }
  Napi::Array list = info[2].As<Napi::Array>();
  if (list.Length() > kMaxPassedFds) {
    throw MakeError(env, "EINVAL", "sendFds",
                    "sendFds: " + std::to_string(list.Length()) + " descriptors; at most " + std::to_string(kMaxPassedFds));
  }
  std::vector<int> fds;
  for (uint32_t i = 0; i < list.Length(); ++i) {
    const Napi::Value v = list.Get(i);
    const double d = v.IsNumber() ? v.As<Napi::Number>().DoubleValue() : -1;
    if (d < 0 || d != static_cast<double>(static_cast<int>(d))) {
      throw MakeError(env, "EINVAL", "sendFds", "sendFds: fds[" + std::to_string(i) + "] is not a descriptor (an integer >= 0)");
    }
    fds.push_back(static_cast<int>(d));
  }
  const int timeoutMs = std::max(1, info[3].As<Napi::Number>().Int32Value());
  std::vector<uint8_t> frame(4 + payload.ByteLength());
  PutLength(frame.data(), static_cast<uint32_t>(payload.ByteLength()));
  if (payload.ByteLength() > 0) std::memcpy(frame.data() + 4, payload.Data(), payload.ByteLength());
  auto* worker = new SendFdsWorker(env, path, std::move(frame), std::move(fds), timeoutMs);
  Napi::Promise promise = worker->Promise();
  worker->Queue();
  return promise;
}

// listenFds(path, onRequest, groupId?): socket, bind, for a path chown to groupId with mode 0660 when given
// (--ipc-group), else mode 0600 (before listen, so no one connects while the mode is still the umask's), listen. A path that exists is taken over only when it is a socket no one
// answers on (a server that died); EADDRINUSE when one does, or when it is not a socket.
Napi::Value ListenFds(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const std::string path = SocketPathArg(info, 0, "listenFds");
  if (info.Length() < 2 || !info[1].IsFunction()) {
    throw MakeError(env, "EINVAL", "listenFds", "listenFds: expected (socketPath, onRequest: function)");
  }
  sockaddr_un addr;
  socklen_t len = 0;
  SocketAddress(path, &addr, &len);
  const bool abstract = path[0] == '@';
  if (!abstract) {
    struct stat st;
    if (lstat(path.c_str(), &st) == 0) {
      if (!S_ISSOCK(st.st_mode)) throw SocketError(env, "bind", path, EADDRINUSE);
      const int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
      const bool answered = probe >= 0 && connect(probe, reinterpret_cast<sockaddr*>(&addr), len) == 0;
      if (probe >= 0) close(probe);
      if (answered) throw SocketError(env, "bind", path, EADDRINUSE);
      unlink(path.c_str());
    }
  }
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) throw SocketError(env, "socket", path, errno);
  const auto fail = [&](const char* call, int err, bool bound) {
    close(fd);
    if (bound && !abstract) unlink(path.c_str());
    return SocketError(env, call, path, err);
  };
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0) throw fail("bind", errno, false);
  const double group = info.Length() > 2 && info[2].IsNumber() ? info[2].As<Napi::Number>().DoubleValue() : -1;
  if (!abstract && group >= 0 && chown(path.c_str(), static_cast<uid_t>(-1), static_cast<gid_t>(group)) != 0) {
    throw fail("chown", errno, true);
  }
  if (!abstract && chmod(path.c_str(), group >= 0 ? 0660 : 0600) != 0) throw fail("chmod", errno, true);
  if (listen(fd, 64) != 0) throw fail("listen", errno, true);
  const int wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake < 0) throw fail("eventfd", errno, true);
  RequestTsfn tsfn;
  try {
    tsfn = RequestTsfn::New(env, info[1].As<Napi::Function>(), "mpcache.fdListener", 0, 1);
  } catch (...) {
    close(wake);
    throw fail("napi_create_threadsafe_function", EINVAL, true);
  }
  // The thread must not keep the process alive on its own: the server's scope closes the listener.
  tsfn.Unref(env);
  auto* listener = new Listener(path, fd, wake, std::move(tsfn));

  Napi::Object out = Napi::Object::New(env);
  out.Set("path", Napi::String::New(env, path));
  out.Set("reply", Napi::Function::New(
                       env,
                       [](const Napi::CallbackInfo& call) -> Napi::Value {
                         Listener* l = ListenerOf(call);
                         const double conn = call.Length() > 0 && call[0].IsNumber() ? call[0].As<Napi::Number>().DoubleValue() : -1;
                         if (conn < 0 || call.Length() < 2 || !call[1].IsTypedArray()) {
                           throw MakeError(call.Env(), "EINVAL", "reply", "reply: expected (conn: number, bytes: Uint8Array)");
                         }
                         Napi::Uint8Array bytes = call[1].As<Napi::Uint8Array>();
                         if (bytes.ByteLength() > kMaxFrameBytes) {
                           throw MakeError(call.Env(), "EINVAL", "reply", "reply: more than " + std::to_string(kMaxFrameBytes) + " bytes");
                         }
                         l->Reply(static_cast<uint64_t>(conn), std::vector<uint8_t>(bytes.Data(), bytes.Data() + bytes.ByteLength()));
                         return call.Env().Undefined();
                       },
                       "reply", listener));
  out.Set("close", Napi::Function::New(
                       env,
                       [](const Napi::CallbackInfo& call) -> Napi::Value {
                         ListenerOf(call)->Stop();
                         return call.Env().Undefined();
                       },
                       "close", listener));
  // Freed with the object; a listener never closed is stopped first.
  out.AddFinalizer([](Napi::Env, Listener* l) { delete l; }, listener);
  return out;
}

}  // namespace mpcache
