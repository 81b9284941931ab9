#include "common.h"

#include <cerrno>
#include <cmath>
#include <cstring>

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace mpcache {

Napi::Error MakeError(Napi::Env env, const std::string& code, const std::string& call,
                      const std::string& message) {
  Napi::Error error = Napi::Error::New(env, message);
  error.Set("code", Napi::String::New(env, code));
  error.Set("call", Napi::String::New(env, call));
  return error;
}

std::string FileIdentity(const struct stat& st) {
  return std::to_string(static_cast<unsigned long long>(st.st_dev)) + ":" +
         std::to_string(static_cast<unsigned long long>(st.st_ino));
}

std::string ErrnoName(int err) {
  switch (err) {
#define MPCACHE_ERRNO(e) \
  case e:                \
    return #e;
    MPCACHE_ERRNO(EPERM)
    MPCACHE_ERRNO(ENOENT)
    MPCACHE_ERRNO(EINTR)
    MPCACHE_ERRNO(EIO)
    MPCACHE_ERRNO(EBADF)
    MPCACHE_ERRNO(EAGAIN)
    MPCACHE_ERRNO(ENOMEM)
    MPCACHE_ERRNO(EACCES)
    MPCACHE_ERRNO(EFAULT)
    MPCACHE_ERRNO(EBUSY)
    MPCACHE_ERRNO(EEXIST)
    MPCACHE_ERRNO(ENODEV)
    MPCACHE_ERRNO(ENOTDIR)
    MPCACHE_ERRNO(EISDIR)
    MPCACHE_ERRNO(EINVAL)
    MPCACHE_ERRNO(ENFILE)
    MPCACHE_ERRNO(EMFILE)
    MPCACHE_ERRNO(ETXTBSY)
    MPCACHE_ERRNO(EFBIG)
    MPCACHE_ERRNO(ENOSPC)
    MPCACHE_ERRNO(EROFS)
    MPCACHE_ERRNO(ENAMETOOLONG)
    MPCACHE_ERRNO(ENOSYS)
    MPCACHE_ERRNO(ELOOP)
    MPCACHE_ERRNO(EOVERFLOW)
    MPCACHE_ERRNO(ENOTSUP)
    MPCACHE_ERRNO(EADDRINUSE)
    MPCACHE_ERRNO(ECONNREFUSED)
    MPCACHE_ERRNO(ECONNRESET)
    MPCACHE_ERRNO(ETIMEDOUT)
    MPCACHE_ERRNO(EPROTO)
    MPCACHE_ERRNO(EPIPE)
    MPCACHE_ERRNO(ENOTSOCK)
#undef MPCACHE_ERRNO
    default:
      return "ERRNO_" + std::to_string(err);
  }
}

Napi::Error ErrnoError(Napi::Env env, const std::string& call, const std::string& name, int err) {
  const std::string code = ErrnoName(err);
  return MakeError(env, code, call,
                   call + " of shared-memory segment " + name + " failed: " + std::strerror(err) + " (" +
                       code + ")");
}

std::string SegmentNameArg(const Napi::CallbackInfo& info, size_t index, const char* fn) {
  Napi::Env env = info.Env();
  if (info.Length() <= index || !info[index].IsString()) {
    throw MakeError(env, "EINVAL", fn,
                    std::string(fn) + ": the segment name must be a string (the POSIX name without its leading slash)");
  }
  const std::string name = info[index].As<Napi::String>().Utf8Value();
  const char* why = nullptr;
  if (name.empty()) {
    why = "it is empty";
  } else if (name.find('/') != std::string::npos) {
    why = "it contains '/'";
  } else if (name.find('\0') != std::string::npos) {
    why = "it contains a NUL character";
  } else if (name == "." || name == "..") {
    why = "it is a directory name";
  }
  if (why != nullptr) {
    throw MakeError(env, "EINVAL", fn,
                    std::string(fn) + ": invalid shared-memory segment name \"" + name + "\": " + why +
                        "; expected the POSIX name without its leading slash, as listed in /dev/shm");
  }
  return name;
}

uint64_t ByteCountArg(const Napi::CallbackInfo& info, size_t index, const char* fn, uint64_t min) {
  Napi::Env env = info.Env();
  const bool isNumber = info.Length() > index && info[index].IsNumber();
  const double value = isNumber ? info[index].As<Napi::Number>().DoubleValue() : 0.0;
  if (!isNumber || !std::isfinite(value) || value != std::floor(value) || value < static_cast<double>(min) ||
      value > kMaxSafeInteger) {
    const std::string shown = isNumber ? info[index].ToString().Utf8Value() : std::string("a non-number");
    throw MakeError(env, "EINVAL", fn,
                    std::string(fn) + ": the byte count must be an integer >= " + std::to_string(min) +
                        " and <= 2^53-1, got " + shown);
  }
  return static_cast<uint64_t>(value);
}

MappingCounters& Counters() {
  static MappingCounters counters;
  return counters;
}

void LowerPoolThreadPriority() {
  static thread_local bool lowered = false;
  if (lowered) return;
  lowered = true;
  setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), 10);
}

}  // namespace mpcache
