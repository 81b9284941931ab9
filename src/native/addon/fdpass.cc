// memfd creation, the inspection of passed descriptors, and the client's half of the descriptor socket (see
// fdpass.h, docs/memfd.md). The server's listener is in fdlisten.cc.
#include "fdpass.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "common.h"

namespace mpcache {

Napi::Error SocketError(Napi::Env env, const std::string& call, const std::string& path, int err) {
  const std::string code = ErrnoName(err);
  return MakeError(env, code, call,
                   call + " on descriptor socket " + path + " failed: " + std::strerror(err) + " (" + code + ")");
}

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

void PutLength(uint8_t* out, uint32_t n) {
  out[0] = static_cast<uint8_t>(n >> 24);
  out[1] = static_cast<uint8_t>(n >> 16);
  out[2] = static_cast<uint8_t>(n >> 8);
  out[3] = static_cast<uint8_t>(n);
}

uint32_t GetLength(const uint8_t* in) {
  return (uint32_t{in[0]} << 24) | (uint32_t{in[1]} << 16) | (uint32_t{in[2]} << 8) | uint32_t{in[3]};
}

namespace {

const char* KindOf(mode_t mode) {
  switch (mode & S_IFMT) {
    case S_IFREG: return "regular file";
    case S_IFSOCK: return "socket";
    case S_IFIFO: return "fifo";
    case S_IFDIR: return "directory";
    case S_IFCHR: return "character device";
    case S_IFBLK: return "block device";
    case S_IFLNK: return "symbolic link";
    default: return "file of unknown type";
  }
}

int FdArg(const Napi::CallbackInfo& info, size_t index, const char* fn) {
  const double v = info.Length() > index && info[index].IsNumber() ? info[index].As<Napi::Number>().DoubleValue() : -1;
  if (v < 0 || v > 2147483647.0 || v != static_cast<double>(static_cast<int>(v))) {
    throw MakeError(info.Env(), "EINVAL", fn, std::string(fn) + ": the descriptor must be an integer >= 0");
  }
  return static_cast<int>(v);
}

}  // namespace

PassedFacts InspectPassed(int fd) {
  PassedFacts f;
  // F_GETFL and F_GET_SEALS are answered by the VFS (F_GET_SEALS by shmem/hugetlbfs only, EINVAL for the
  // rest): neither reaches a filesystem or a device.
  const int flags = fcntl(fd, F_GETFL);
  if (flags < 0) {
    f.err = errno;
    return f;
  }
  const int mode = flags & O_ACCMODE;
  f.access = mode == O_RDWR ? "rw" : mode == O_RDONLY ? "r" : mode == O_WRONLY ? "w" : "?";
  f.seals = fcntl(fd, F_GET_SEALS);
  if (f.seals >= 0) {
    struct stat st;  // shmem and hugetlbfs answer from the inode: never waits
    if (fstat(fd, &st) != 0) {
      f.err = errno;
      return f;
    }
    f.size = static_cast<int64_t>(st.st_size);
    f.regular = S_ISREG(st.st_mode);
    f.kind = KindOf(st.st_mode);
    f.identity = FileIdentity(st);
    return f;
  }
  int type = 0;
  socklen_t len = sizeof type;
  if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) == 0) {
    f.socket = true;
    f.kind = "socket";
    return f;
  }
  struct statx sx;
  if (statx(fd, "", AT_EMPTY_PATH | AT_STATX_DONT_SYNC, STATX_TYPE, &sx) == 0 && (sx.stx_mask & STATX_TYPE) != 0) {
    f.regular = S_ISREG(sx.stx_mode);
    f.kind = KindOf(sx.stx_mode);
  } else {
    f.kind = "file of unknown type";
  }
  return f;
}

Napi::Object FactsToJs(Napi::Env env, int fd, const PassedFacts& facts) {
  Napi::Object out = Napi::Object::New(env);
  out.Set("fd", Napi::Number::New(env, fd));
  out.Set("size", Napi::Number::New(env, static_cast<double>(facts.size)));
  out.Set("seals", Napi::Number::New(env, facts.seals));
  out.Set("regular", Napi::Boolean::New(env, facts.regular));
  out.Set("kind", Napi::String::New(env, facts.kind));
  out.Set("access", Napi::String::New(env, facts.access.empty() ? "?" : facts.access));
  out.Set("identity", Napi::String::New(env, facts.identity));
  return out;
}

namespace {

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
        // A server that refuses a connection at accept (its uid, a full slot table) answers and closes before
        // reading: the send then fails, but the refusal is waiting to be read.
        if (errno != EPIPE && errno != ECONNRESET) return Fail("sendmsg", errno);
        Fail("sendmsg", errno);
        break;
      }
      sent += static_cast<size_t>(n);
    }
    const Failure sendFailure = failure_;
    failure_ = Failure{};
    ReadReply(sock);
    if (failure_.failed() && sendFailure.failed()) failure_ = sendFailure;
  }

  void ReadReply(int sock) {
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

Napi::Value FdInfo(const Napi::CallbackInfo& info) {
  const int fd = FdArg(info, 0, "fdInfo");
  const PassedFacts facts = InspectPassed(fd);
  if (facts.err != 0) throw SocketError(info.Env(), "fcntl", "descriptor " + std::to_string(fd), facts.err);
  return FactsToJs(info.Env(), fd, facts);
}

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

}  // namespace mpcache
