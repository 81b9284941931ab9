// Segment-level calls: shmCreate, shmUnlink, shmSize (DESIGN §4, cpu_shm).
// Each is synchronous and cheap (a handful of system calls on tmpfs).
#include "shm.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "common.h"

namespace mpcache {

namespace {

int FtruncateRetry(int fd, off_t length) {
  int rc;
  do {
    rc = ftruncate(fd, length);
  } while (rc != 0 && errno == EINTR);
  return rc;
}

}  // namespace

// shmCreate(name, nbytes): creates a new segment (O_CREAT|O_EXCL, mode 0600)
// of nbytes bytes. EEXIST when the name is taken; the segment is removed again
// when sizing it fails.
Napi::Value ShmCreate(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const std::string name = SegmentNameArg(info, 0, "shmCreate");
  const uint64_t nbytes = ByteCountArg(info, 1, "shmCreate", 0);
  const std::string path = ShmPath(name);
  const int fd = shm_open(path.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) throw ErrnoError(env, "shm_open", name, errno);
  if (FtruncateRetry(fd, static_cast<off_t>(nbytes)) != 0) {
    const int err = errno;
    close(fd);
    shm_unlink(path.c_str());
    throw ErrnoError(env, "ftruncate", name, err);
  }
  close(fd);
  return env.Undefined();
}

// shmUnlink(name): removes the name; existing mappings stay valid until unmapped.
Napi::Value ShmUnlink(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const std::string name = SegmentNameArg(info, 0, "shmUnlink");
  if (shm_unlink(ShmPath(name).c_str()) != 0) throw ErrnoError(env, "shm_unlink", name, errno);
  return env.Undefined();
}

// shmSize(name): the segment's size in bytes (fstat).
Napi::Value ShmSize(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const std::string name = SegmentNameArg(info, 0, "shmSize");
  const int fd = shm_open(ShmPath(name).c_str(), O_RDONLY, 0);
  if (fd < 0) throw ErrnoError(env, "shm_open", name, errno);
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    close(fd);
    throw ErrnoError(env, "fstat", name, err);
  }
  close(fd);
  return Napi::Number::New(env, static_cast<double>(st.st_size));
}

// shmUnlinkIf(name, identity) -> "unlinked" | "replaced" | "absent": removes the name only while it still
// names the segment whose "<st_dev>:<st_ino>" is `identity` (a Mapping's `identity`, recorded at map time), so
// a name a restarted worker re-created is kept ("replaced"). A name that is gone is "absent". POSIX has no
// unlink-if-inode: a re-creation between the fstat and the shm_unlink here (microseconds) would still lose
// its name; the flag that uses this (--unlink-reaped-segments) documents that window.
Napi::Value ShmUnlinkIf(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const std::string name = SegmentNameArg(info, 0, "shmUnlinkIf");
  if (info.Length() < 2 || !info[1].IsString()) {
    throw MakeError(env, "EINVAL", "shmUnlinkIf", "shmUnlinkIf: the identity must be a string \"<dev>:<ino>\"");
  }
  const std::string identity = info[1].As<Napi::String>().Utf8Value();
  const std::string path = ShmPath(name);
  const int fd = shm_open(path.c_str(), O_RDONLY, 0);
  if (fd < 0) {
    if (errno == ENOENT) return Napi::String::New(env, "absent");
    throw ErrnoError(env, "shm_open", name, errno);
  }
  struct stat st;
  const int rc = fstat(fd, &st);
  const int err = errno;
  close(fd);
  if (rc != 0) throw ErrnoError(env, "fstat", name, err);
  if (FileIdentity(st) != identity) return Napi::String::New(env, "replaced");
  if (shm_unlink(path.c_str()) != 0) {
    if (errno == ENOENT) return Napi::String::New(env, "absent");
    throw ErrnoError(env, "shm_unlink", name, errno);
  }
  return Napi::String::New(env, "unlinked");
}

// stats(): { openMappings, mappedBytes }, process-wide.
Napi::Value Stats(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Napi::Object out = Napi::Object::New(env);
  out.Set("openMappings", Napi::Number::New(env, static_cast<double>(Counters().openMappings.load())));
  out.Set("mappedBytes", Napi::Number::New(env, static_cast<double>(Counters().mappedBytes.load())));
  return out;
}

// guardedFaults(): copies and prefaults ended by a guarded SIGBUS/SIGSEGV since the process started (guard.h).
Napi::Value GuardedFaults(const Napi::CallbackInfo& info) {
  return Napi::Number::New(info.Env(), static_cast<double>(Counters().guardedFaults.load()));
}

}  // namespace mpcache
