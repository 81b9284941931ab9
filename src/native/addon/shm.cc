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

// stats(): { openMappings, mappedBytes }, process-wide.
Napi::Value Stats(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Napi::Object out = Napi::Object::New(env);
  out.Set("openMappings", Napi::Number::New(env, static_cast<double>(Counters().openMappings.load())));
  out.Set("mappedBytes", Napi::Number::New(env, static_cast<double>(Counters().mappedBytes.load())));
  return out;
}

}  // namespace mpcache
