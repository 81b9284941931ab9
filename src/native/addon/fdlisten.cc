// The descriptor socket's server side: listenFds (see fdpass.h, docs/memfd.md; issue 13 item 2, issue 24
// items 2, 8, 9 and 11).
//
// The listener runs on a thread of its own: poll(2) over an eventfd (wake-ups: replies to send, close), the
// listening socket and the connections still sending their request. Nothing on that thread, and nothing on
// the JS thread, ever waits on what a peer controls:
//
// - Accept: SO_PEERCRED before anything is read. A uid the socket does not take (an abstract socket has no
//   file mode: only the server's uid and root) is answered with its refusal and dropped at once: nothing of
//   it is read, so none of its descriptors ever enters this process's table, and it never holds a slot.
//   Then the caps: connections in all, and per uid (`--fd-socket-max-connections`, `-per-uid`); over one,
//   the refusal says which. The request deadline runs from accept.
// - Read: only while the server holds fewer than maxPassed + kMaxPassedFds passed descriptors (tokens,
//   requests in flight, closes pending); the control buffer takes kScmMaxFds, so no read is truncated; a
//   connection whose descriptors pass kMaxPassedFds is refused and every one it sent is let go of.
// - A complete request: each descriptor is inspected (InspectPassed, never waiting on a filesystem); memfds
//   go to JS (through a thread-safe function: non-blocking, unbounded queue, so close() may join this
//   thread), anything else is let go of here and JS sees only its facts (fd -1).
// - Letting go (fdrelease.h): memfds are closed directly (their close never waits); sockets — connections,
//   passed sockets, the listening socket at close — are dropped in an exiting thread; anything else goes to
//   the closer thread.
//
// Counters (stats()): connections, passed descriptors held and closing, refusals per reason. A refusal
// wakes JS through a second thread-safe function, at most one call outstanding (a flood of refusals is one
// call), and JS reads the counters (metrics, a rate-limited log line).
#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <array>
#include <atomic>
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
#include "fdpass.h"
#include "fdrelease.h"

namespace mpcache {

namespace {

using Clock = std::chrono::steady_clock;

// Why a connection was refused before JS saw a request (the `reason` of stats().refusals).
enum Refusal : size_t { kUid, kConnections, kConnectionsPerUid, kDeadline, kRefusalKinds };
constexpr std::array<const char*, kRefusalKinds> kRefusalNames{"uid", "connections", "connections_per_uid", "deadline"};

// Accepts per poll pass: a flood of connections cannot keep the thread from reading and letting go.
constexpr int kAcceptsPerPass = 256;
// How often a listener that stopped reading (the held cap) looks again.
constexpr int kGatedPollMs = 50;

// What listenFds' `options` say.
struct ListenOptions {
  size_t maxConnections = 0;
  size_t maxConnectionsPerUid = 0;
  size_t maxPassed = 0;
  int64_t allowedUid = -1;  // -1: every uid that can connect (a path: its mode decides); else this one and root
  std::array<std::vector<uint8_t>, kRefusalKinds> replies;  // the framed payload each refusal answers
};

// One request, handed to JS: the connection, the peer's credentials, the payload, the facts of each
// descriptor and the descriptors themselves (memfds; -1 for one let go of already), or the framing error that
// ended the connection. Whoever holds it owns the memfds: its destructor closes those still here.
struct Delivery {
  explicit Delivery(std::shared_ptr<PassedCounts> c) : counts(std::move(c)) {}
  ~Delivery() {
    for (int fd : fds) {
      if (fd >= 0 && close(fd) == 0) counts->held.fetch_sub(1);
    }
  }
  std::shared_ptr<PassedCounts> counts;
  uint64_t conn = 0;
  ucred cred{};
  std::vector<uint8_t> payload;
  std::vector<PassedFacts> facts;
  std::vector<int> fds;
  std::string error;
};

struct Conn {
  int fd = -1;
  ucred cred{};
  std::vector<uint8_t> buf;
  std::vector<int> fds;  // received, not yet handed over or let go of
  Clock::time_point deadline;
  bool waiting = false;  // handed to JS, waiting for its reply
  bool done = false;     // hung up or failed: to be ended
};

// What one poll pass lets go of, all at its end: one drop (one thread) for every socket of the pass.
struct Pass {
  std::vector<Doomed> drop;
  std::vector<Doomed> later;
  bool refused = false;
};

void DeliverToJs(Napi::Env env, Napi::Function onRequest, void* context, Delivery* raw);
using RequestTsfn = Napi::TypedThreadSafeFunction<void, Delivery, DeliverToJs>;

class Listener {
 public:
  Listener(std::string path, int listenFd, int wakeFd, RequestTsfn tsfn, Napi::ThreadSafeFunction notify,
           ListenOptions options)
      : path_(std::move(path)),
        listenFd_(listenFd),
        wakeFd_(wakeFd),
        tsfn_(std::move(tsfn)),
        notify_(std::move(notify)),
        options_(std::move(options)),
        counts_(std::make_shared<PassedCounts>()) {
    thread_ = std::thread([this] { Run(); });
  }
  ~Listener() { Stop(); }

  const std::string& path() const { return path_; }

  // JS thread: queue a reply for `conn`; the thread sends it and lets the connection go.
  void Reply(uint64_t conn, std::vector<uint8_t> bytes) {
    if (stopped_) return;  // closed: the connection is gone already
    {
      std::lock_guard<std::mutex> lock(mutex_);
      replies_.emplace_back(conn, std::move(bytes));
    }
    Wake();
  }

  // JS thread: closes a passed memfd JS holds (a memfd's close never waits) and takes it off the count.
  bool ClosePassed(int fd) {
    if (close(fd) != 0) return false;
    counts_->held.fetch_sub(1);
    return true;
  }

  // JS thread: the counters; also re-arms the refusal notification.
  Napi::Object Stats(Napi::Env env) {
    notifyPending_.store(false);
    Napi::Object out = Napi::Object::New(env);
    out.Set("connections", Napi::Number::New(env, static_cast<double>(connections_.load())));
    out.Set("accepted", Napi::Number::New(env, static_cast<double>(accepted_.load())));
    out.Set("heldDescriptors", Napi::Number::New(env, static_cast<double>(counts_->held.load())));
    out.Set("closingDescriptors", Napi::Number::New(env, static_cast<double>(counts_->closing.load())));
    Napi::Object refusals = Napi::Object::New(env);
    for (size_t k = 0; k < kRefusalKinds; ++k) {
      refusals.Set(kRefusalNames[k], Napi::Number::New(env, static_cast<double>(refusals_[k].load())));
    }
    out.Set("refusals", refusals);
    return out;
  }

  // JS thread: stop the thread (which lets go of every connection, their descriptors and the listening
  // socket without waiting on any), then the path.
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
    notify_.Release();
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

  // Whether connections may be read: recvmsg is what installs descriptors in the table.
  bool Reading() const {
    return counts_->held.load() < static_cast<int64_t>(options_.maxPassed + kMaxPassedFds);
  }

  void Run() {
    std::map<uint64_t, Conn> conns;
    std::map<uid_t, size_t> perUid;
    uint64_t nextId = 1;
    for (;;) {
      Pass pass;
      const bool reading = Reading();
      std::vector<pollfd> polls{{wakeFd_, POLLIN, 0}, {listenFd_, POLLIN, 0}};
      std::vector<uint64_t> ids;
      int timeout = -1;
      const Clock::time_point now = Clock::now();
      for (auto& [id, c] : conns) {
        if (c.waiting) continue;
        if (reading) {
          polls.push_back({c.fd, POLLIN, 0});
          ids.push_back(id);
        }
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(c.deadline - now).count();
        const int ms = left < 0 ? 0 : static_cast<int>(left);
        timeout = timeout < 0 ? ms : std::min(timeout, ms);
      }
      if (!reading && !conns.empty()) timeout = timeout < 0 ? kGatedPollMs : std::min(timeout, kGatedPollMs);
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
        SendFrame(it->second.fd, bytes);
        End(&conns, &perUid, it, &pass);
      }
      if (polls[1].revents & POLLIN) Accept(&conns, &perUid, &nextId, &pass);
      for (size_t i = 0; i < ids.size(); ++i) {
        auto it = conns.find(ids[i]);
        if (it != conns.end() && polls[i + 2].revents != 0) ReadFrom(ids[i], &it->second, &pass);
      }
      const Clock::time_point after = Clock::now();
      for (auto it = conns.begin(); it != conns.end();) {
        auto next = std::next(it);
        Conn& c = it->second;
        if (!c.waiting && !c.done && after >= c.deadline) {
          Count(kDeadline, &pass);
          SendFrame(c.fd, options_.replies[kDeadline]);
          c.done = true;
        }
        if (!c.waiting && c.done) End(&conns, &perUid, it, &pass);
        it = next;
      }
      Flush(&pass);
    }
    Pass last;
    while (!conns.empty()) End(&conns, &perUid, conns.begin(), &last);
    last.drop.push_back({listenFd_, false});  // its unaccepted connections may hold passed descriptors too
    Flush(&last);
  }

  void Accept(std::map<uint64_t, Conn>* conns, std::map<uid_t, size_t>* perUid, uint64_t* nextId, Pass* pass) {
    for (int n = 0; n < kAcceptsPerPass; ++n) {
      const int fd = accept4(listenFd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) return;  // EAGAIN: none left; other errors (EMFILE …): the next poll retries
      accepted_.fetch_add(1);
      Conn c;
      c.fd = fd;
      socklen_t len = sizeof c.cred;
      Refusal refusal = kRefusalKinds;
      if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &c.cred, &len) != 0 ||
          (options_.allowedUid >= 0 && c.cred.uid != static_cast<uid_t>(options_.allowedUid) && c.cred.uid != 0)) {
        refusal = kUid;
      } else if (conns->size() >= options_.maxConnections) {
        refusal = kConnections;
      } else if ((*perUid)[c.cred.uid] >= options_.maxConnectionsPerUid) {
        refusal = kConnectionsPerUid;
      }
      if (refusal != kRefusalKinds) {
        if ((*perUid)[c.cred.uid] == 0) perUid->erase(c.cred.uid);
        Count(refusal, pass);
        SendFrame(fd, options_.replies[refusal]);
        pass->drop.push_back({fd, false});
        continue;
      }
      ++(*perUid)[c.cred.uid];
      c.deadline = Clock::now() + std::chrono::milliseconds(kRequestDeadlineMs);
      conns->emplace((*nextId)++, std::move(c));
      connections_.store(static_cast<int64_t>(conns->size()));
    }
  }

  // Reads what is there; on a complete request (or an error) hands it to JS; `done` when it hung up.
  void ReadFrom(uint64_t id, Conn* c, Pass* pass) {
    uint8_t chunk[16384];
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kScmMaxFds)];
    for (;;) {
      if (!Reading()) return;  // the held cap: a later pass goes on
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
        c->done = true;
        return;
      }
      for (cmsghdr* h = CMSG_FIRSTHDR(&msg); h != nullptr; h = CMSG_NXTHDR(&msg, h)) {
        if (h->cmsg_level != SOL_SOCKET || h->cmsg_type != SCM_RIGHTS) continue;
        const size_t count = (h->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        const int* received = reinterpret_cast<const int*>(CMSG_DATA(h));
        for (size_t k = 0; k < count; ++k) c->fds.push_back(received[k]);
        counts_->held.fetch_add(static_cast<int64_t>(count));
      }
      c->buf.insert(c->buf.end(), chunk, chunk + n);
      std::string error;
      if (c->fds.size() > kMaxPassedFds) {
        error = std::to_string(c->fds.size()) + " descriptors arrived, more than the " + std::to_string(kMaxPassedFds) +
                " one request may pass; every one was closed";
      } else if (msg.msg_flags & MSG_CTRUNC) {
        // Not for SCM_RIGHTS (the buffer holds the most one message carries): fail closed on anything else.
        error = "the request's control data did not fit (more than " + std::to_string(kScmMaxFds) +
                " descriptors in one message); every descriptor that arrived was closed";
      } else if (c->buf.size() >= 4 && GetLength(c->buf.data()) > kMaxFrameBytes) {
        error = "the request claims " + std::to_string(GetLength(c->buf.data())) + " bytes; at most " +
                std::to_string(kMaxFrameBytes) + " may follow the 4-byte length";
      } else if (c->buf.size() >= 4 && c->buf.size() > 4 + size_t{GetLength(c->buf.data())}) {
        error = "bytes past the end of the request's frame (one request per connection)";
      } else if (c->buf.size() < 4 || c->buf.size() < 4 + size_t{GetLength(c->buf.data())}) {
        continue;
      }
      Deliver(id, c, error, pass);
      return;
    }
  }

  // Hands the request (or its error) to JS: memfds with their facts; everything else let go of now.
  void Deliver(uint64_t id, Conn* c, const std::string& error, Pass* pass) {
    auto* d = new Delivery(counts_);
    d->conn = id;
    d->cred = c->cred;
    d->error = error;
    if (error.empty()) d->payload.assign(c->buf.begin() + 4, c->buf.end());
    for (int fd : c->fds) {
      PassedFacts facts = InspectPassed(fd);
      if (error.empty() && facts.memfd()) {
        d->fds.push_back(fd);
      } else {
        LetGo(fd, facts, pass);
        if (error.empty()) d->fds.push_back(-1);
      }
      if (error.empty()) d->facts.push_back(std::move(facts));
    }
    c->fds.clear();
    c->waiting = true;
    if (tsfn_.NonBlockingCall(d) != napi_ok) {
      delete d;  // closes its memfds
      c->waiting = false;
      c->done = true;
    }
  }

  // A passed descriptor leaves the table without this thread waiting on its close (fdrelease.h).
  void LetGo(int fd, const PassedFacts& facts, Pass* pass) {
    if (facts.memfd()) {
      if (close(fd) == 0) counts_->held.fetch_sub(1);
    } else if (facts.socket) {
      pass->drop.push_back({fd, true});
    } else {
      pass->later.push_back({fd, true});
    }
  }

  void End(std::map<uint64_t, Conn>* conns, std::map<uid_t, size_t>* perUid, std::map<uint64_t, Conn>::iterator it,
           Pass* pass) {
    Conn& c = it->second;
    for (int fd : c.fds) LetGo(fd, InspectPassed(fd), pass);
    c.fds.clear();
    pass->drop.push_back({c.fd, false});
    auto slot = perUid->find(c.cred.uid);
    if (slot != perUid->end() && --slot->second == 0) perUid->erase(slot);
    conns->erase(it);
    connections_.store(static_cast<int64_t>(conns->size()));
  }

  void Count(Refusal refusal, Pass* pass) {
    refusals_[refusal].fetch_add(1);
    pass->refused = true;
  }

  void Flush(Pass* pass) {
    DropSockets(std::move(pass->drop), counts_);
    CloseOffThread(std::move(pass->later), counts_);
    pass->drop.clear();
    pass->later.clear();
    if (pass->refused && !notifyPending_.exchange(true) && notify_.NonBlockingCall() != napi_ok) {
      notifyPending_.store(false);
    }
    pass->refused = false;
  }

  // A reply of a few hundred bytes on a fresh connection fits its socket buffer: never blocks; a peer that
  // does not read it just loses it.
  static void SendFrame(int fd, const std::vector<uint8_t>& bytes) {
    std::vector<uint8_t> frame(4 + bytes.size());
    PutLength(frame.data(), static_cast<uint32_t>(bytes.size()));
    if (!bytes.empty()) std::memcpy(frame.data() + 4, bytes.data(), bytes.size());
    (void)!send(fd, frame.data(), frame.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  }

  std::string path_;
  int listenFd_;
  int wakeFd_;
  RequestTsfn tsfn_;
  Napi::ThreadSafeFunction notify_;
  const ListenOptions options_;
  const std::shared_ptr<PassedCounts> counts_;
  std::thread thread_;
  std::mutex mutex_;
  std::vector<std::pair<uint64_t, std::vector<uint8_t>>> replies_;
  bool stopping_ = false;
  bool stopped_ = false;
  std::atomic<int64_t> connections_{0};
  std::atomic<uint64_t> accepted_{0};
  std::array<std::atomic<uint64_t>, kRefusalKinds> refusals_{};
  std::atomic<bool> notifyPending_{false};
};

void DeliverToJs(Napi::Env env, Napi::Function onRequest, void*, Delivery* raw) {
  std::unique_ptr<Delivery> d(raw);  // env NULL (teardown): its destructor closes the memfds
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
  for (size_t i = 0; i < d->fds.size(); ++i) fds.Set(static_cast<uint32_t>(i), FactsToJs(env, d->fds[i], d->facts[i]));
  req.Set("fds", fds);
  d->fds.clear();  // JS owns them now (it closes each with closePassed)
  try {
    onRequest.Call({req});
  } catch (const Napi::Error&) {
    // The callback only queues the request; nothing to undo here, and no exception may leave a TSFN call.
  }
}

Listener* ListenerOf(const Napi::CallbackInfo& info) { return static_cast<Listener*>(info.Data()); }

size_t CountOption(Napi::Env env, const Napi::Object& options, const char* name) {
  const Napi::Value v = options.Get(name);
  const double d = v.IsNumber() ? v.As<Napi::Number>().DoubleValue() : -1;
  if (d < 1 || d > kMaxSafeInteger || d != static_cast<double>(static_cast<int64_t>(d))) {
    throw MakeError(env, "EINVAL", "listenFds", std::string("listenFds: options.") + name + " must be an integer >= 1");
  }
  return static_cast<size_t>(d);
}

ListenOptions ReadOptions(Napi::Env env, const Napi::Value& value) {
  if (!value.IsObject()) throw MakeError(env, "EINVAL", "listenFds", "listenFds: options must be an object");
  const Napi::Object o = value.As<Napi::Object>();
  ListenOptions out;
  out.maxConnections = CountOption(env, o, "maxConnections");
  out.maxConnectionsPerUid = CountOption(env, o, "maxConnectionsPerUid");
  out.maxPassed = CountOption(env, o, "maxPassedDescriptors");
  const Napi::Value uid = o.Get("allowedUid");
  out.allowedUid = uid.IsNumber() ? uid.As<Napi::Number>().Int64Value() : -1;
  const Napi::Value replies = o.Get("refusals");
  for (size_t k = 0; k < kRefusalKinds; ++k) {
    const Napi::Value r = replies.IsObject() ? replies.As<Napi::Object>().Get(kRefusalNames[k]) : env.Undefined();
    if (!r.IsTypedArray() || r.As<Napi::Uint8Array>().ByteLength() > kMaxFrameBytes) {
      throw MakeError(env, "EINVAL", "listenFds",
                      std::string("listenFds: options.refusals.") + kRefusalNames[k] + " must be a Uint8Array of at most " +
                          std::to_string(kMaxFrameBytes) + " bytes");
    }
    const Napi::Uint8Array bytes = r.As<Napi::Uint8Array>();
    out.replies[k].assign(bytes.Data(), bytes.Data() + bytes.ByteLength());
  }
  return out;
}

}  // namespace

// listenFds(path, onRequest, onRefusal, options): socket, bind, for a path chown to options.groupId with mode
// 0660 when given (--ipc-group), else mode 0600 (before listen, so no one connects while the mode is still
// the umask's), listen. A path that exists is taken over only when it is a socket no one answers on (a server
// that died); EADDRINUSE when one does, or when it is not a socket.
Napi::Value ListenFds(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const std::string path = SocketPathArg(info, 0, "listenFds");
  if (info.Length() < 4 || !info[1].IsFunction() || !info[2].IsFunction()) {
    throw MakeError(env, "EINVAL", "listenFds", "listenFds: expected (socketPath, onRequest, onRefusal, options)");
  }
  ListenOptions options = ReadOptions(env, info[3]);
  const Napi::Value groupValue = info[3].As<Napi::Object>().Get("groupId");
  const double group = groupValue.IsNumber() ? groupValue.As<Napi::Number>().DoubleValue() : -1;
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
  if (!abstract && group >= 0 && chown(path.c_str(), static_cast<uid_t>(-1), static_cast<gid_t>(group)) != 0) {
    throw fail("chown", errno, true);
  }
  if (!abstract && chmod(path.c_str(), group >= 0 ? 0660 : 0600) != 0) throw fail("chmod", errno, true);
  if (listen(fd, 64) != 0) throw fail("listen", errno, true);
  const int wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake < 0) throw fail("eventfd", errno, true);
  RequestTsfn tsfn;
  Napi::ThreadSafeFunction notify;
  try {
    tsfn = RequestTsfn::New(env, info[1].As<Napi::Function>(), "mpcache.fdListener", 0, 1);
    notify = Napi::ThreadSafeFunction::New(env, info[2].As<Napi::Function>(), "mpcache.fdListenerRefusal", 0, 1);
  } catch (...) {
    close(wake);
    throw fail("napi_create_threadsafe_function", EINVAL, true);
  }
  // The thread must not keep the process alive on its own: the server's scope closes the listener.
  tsfn.Unref(env);
  notify.Unref(env);
  auto* listener = new Listener(path, fd, wake, std::move(tsfn), std::move(notify), std::move(options));

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
  out.Set("closePassed", Napi::Function::New(
                             env,
                             [](const Napi::CallbackInfo& call) -> Napi::Value {
                               const double v = call.Length() > 0 && call[0].IsNumber() ? call[0].As<Napi::Number>().DoubleValue() : -1;
                               if (v < 0 || v > 2147483647.0 || v != static_cast<double>(static_cast<int>(v))) {
                                 throw MakeError(call.Env(), "EINVAL", "closePassed", "closePassed: the descriptor must be an integer >= 0");
                               }
                               if (!ListenerOf(call)->ClosePassed(static_cast<int>(v))) {
                                 throw SocketError(call.Env(), "close", "descriptor " + std::to_string(static_cast<int>(v)), errno);
                               }
                               return call.Env().Undefined();
                             },
                             "closePassed", listener));
  out.Set("stats", Napi::Function::New(
                       env, [](const Napi::CallbackInfo& call) -> Napi::Value { return ListenerOf(call)->Stats(call.Env()); },
                       "stats", listener));
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
